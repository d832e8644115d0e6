"""Figures and words of one tree cycle (draft trees, #23): a tree cycle record in, a figure or a line out.

A trace is a tree trace when its header's settings has "tree"; each of its cycle records then
has a `tree` entry (nodes, tried, path, next token, compaction) and none of a chain cycle's
per-position fields. Three figures show a cycle:
- tree_figure: the token tree, the root (the last committed token) on the left, depth to the
  right, siblings top to bottom in the order the walk tries them; coloured by the walk's outcome.
- tree_mask_figure: the verify pass's tree attention mask (who attends to whom).
- tree_compaction_figure: the target's (and the draft's) cache slots from L on, before and after
  the accepted path's K/V are moved next to the prefix.
No Streamlit here. Token texts go through cycle.shown/esc (html.escape) before they reach a
label, a tick or a hover; the words (tree_summary, tree_stage_caption) are plain text that the
pages escape with app.ui.safe.md.
"""
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import plotly.graph_objects as go

from app.figures.cycle import (
    CATCH_UP,
    CHAR_PX,
    GRID,
    INK,
    OKABE_ITO,
    PROJECTOR_WIDTH_PX,
    STYLES,
    Style,
    cells,
    figure,
    fmt_p,
    labels,
    shown,
    tint,
)
from app.figures.derive import ACCEPTED, BONUS, PROMPT, REJECTED, RESAMPLED, committed_texts, visible_text
from engine.trace.schema import NEXT_BONUS, ROOT, STATIC_TREE

UNTRIED, PROPOSED, KEPT, DROPPED = "untried", "proposed", "kept", "discarded slot"
TREE_STYLES = {  # the chain figures' styles (app/figures/cycle.py STYLES) where the meaning is the same
    PROMPT: Style("root: the last committed token", STYLES[PROMPT].colour, "▪", "square", ""),
    PROPOSED: Style("proposed (not tested yet)", OKABE_ITO["sky_blue"], "?", "square-open", "."),
    ACCEPTED: Style("accepted (the path)", STYLES[ACCEPTED].colour, STYLES[ACCEPTED].mark, "circle", ""),
    REJECTED: Style("rejected (tried)", STYLES[REJECTED].colour, STYLES[REJECTED].mark, "x", "x"),
    UNTRIED: Style("untried", OKABE_ITO["grey"], "–", "line-ew-open", "."),
    BONUS: Style("next token: bonus", STYLES[BONUS].colour, STYLES[BONUS].mark, "star", "+"),
    RESAMPLED: Style("next token: from the residual", STYLES[RESAMPLED].colour, STYLES[RESAMPLED].mark, "diamond", "/"),
    KEPT: Style("kept", STYLES[ACCEPTED].colour, "✓", "square", ""),
    DROPPED: Style("discarded", STYLES[REJECTED].colour, "✗", "x", "x"),
    CATCH_UP: Style("draft catch-up (fed after compaction)", OKABE_ITO["sky_blue"], "+", "cross", "+"),
}
READABLE_NODES = 32  # up to this many nodes the tree's labels are projector-sized (16 px)
LABEL_PX, NUMBER_PX, SMALL_PX = 16, 12, 11  # token text, the p/q line under it, labels of bigger trees
NODE_W, NODE_H = 0.84, 0.8  # a node's box, in columns and rows: under 1, so neighbours never touch
MAX_SLOTS = 96  # cache slots drawn per row at most, whatever a trace records
COMPACTION_WORDS = {
    "dynamic": "gather: the kept slots are selected along the sequence dimension into tensors of the new length",
    "static": "copy inside the preallocated buffer, then move the write position; the slots past it stay masked "
              "until the next append overwrites them",
    "paged": "copy slot to slot through the block table, then lower the token count and free every block wholly "
             "past it",
}


def is_tree_header(header: dict) -> bool:
    """A tree trace's header: settings["tree"] is present (then every cycle is a tree cycle)."""
    return isinstance(header.get("settings"), dict) and "tree" in header["settings"]


def tree_words(spec: dict) -> str:
    """The header's settings["tree"] in words: 'static tree 3,2,1' or 'dynamic tree (top-4, depth 4, 16 nodes)'."""
    if spec.get("kind") == STATIC_TREE:
        return "static tree " + ",".join(str(b) for b in spec.get("branching", []))
    return f"dynamic tree (top-{spec.get('top_k')}, depth {spec.get('depth')}, {spec.get('nodes')} nodes)"


def quoted(text: str) -> str:
    return f"'{visible_text(text)}'"


# ---------------------------------------------------------------- the walk, read off the record

def parents_of(tree: dict) -> list[int]:
    """Each node's parent; one that breaks the contract (not an earlier node) is drawn under the root."""
    out = []
    for i, node in enumerate(tree["nodes"]):
        p = node.get("parent", ROOT)
        out.append(p if isinstance(p, int) and 0 <= p < i else ROOT)
    return out


def tried_by_node(tree: dict) -> dict[int, tuple[int, dict]]:
    """node -> (its place in the walk's order, its tried entry)."""
    return {t["node"]: (k, t) for k, t in enumerate(tree["tried"])}


def node_outcomes(tree: dict) -> list[str]:
    """ACCEPTED for the path, REJECTED for a tried node off it, UNTRIED for the rest."""
    on_path, tried = set(tree["path"]), tried_by_node(tree)
    return [ACCEPTED if i in on_path else REJECTED if i in tried else UNTRIED for i in range(len(tree["nodes"]))]


def why_untried(tree: dict, parents: Sequence[int], i: int) -> str:
    parent = parents[i]
    if parent != ROOT and parent not in tree["path"]:
        return "its parent was never accepted, so nothing under it is tested"
    if tree["path"] and any(parents[p] == parent for p in tree["path"]):
        return "an earlier sibling was accepted, so the walk went down that branch"
    return "the walk stopped before it"


def ancestors_or_self(parents: Sequence[int], i: int) -> list[int]:
    """Node i's ancestors (root excluded) and i itself, from the top of the tree down."""
    chain = []
    while i != ROOT:
        chain.append(i)
        i = parents[i]
    return chain[::-1]


def last_on_path(tree: dict) -> int:
    return tree["path"][-1] if tree["path"] else ROOT


def next_token_numbers(tree: dict) -> tuple[float | None, float | None]:
    """(p_target, residual) of the next token, as far as the record's top lists keep them."""
    tid, last = tree["next_token_id"], last_on_path(tree)
    if tree["next_token_kind"] == NEXT_BONUS:
        row = tree["target_top"][last + 1] if last + 1 < len(tree["target_top"]) else []
        return next((e["p"] for e in row if e["token_id"] == tid), None), None
    found = next((e for e in tree.get("residual_top") or [] if e["token_id"] == tid), None)
    return (found["p_target"], found["residual"]) if found else (None, None)


# ---------------------------------------------------------------- where the nodes go

@dataclass(frozen=True)
class TreeLayout:
    """Centres in (column, row) units: x = depth (the root at 0), y = row from the top."""

    nodes: list[tuple[float, float]]  # (N,)
    root: tuple[float, float]
    next_token: tuple[float, float] | None  # after the path's last node, on a row of its own
    rows: int
    columns: int


def tree_layout(parents: Sequence[int], next_under: int | None = None) -> TreeLayout:
    """Depth to the right; each leaf gets the next free row in walk order (children in the order
    tried) and a parent sits midway between its first and last child. Subtrees take disjoint row
    ranges, so two nodes of one depth are at least a row apart. `next_under` (a node or ROOT) gets
    the next token as an extra last child. `parents` must hold earlier nodes or ROOT (parents_of)."""
    kids: dict[int, list[int]] = {ROOT: []}
    for i, p in enumerate(parents):
        kids.setdefault(p, []).append(i)
    depth = {ROOT: 0}
    for i, p in enumerate(parents):
        depth[i] = depth[p] + 1
    rows = {}
    free = [0]  # the next unused row

    def take_row() -> int:
        free[0] += 1
        return free[0] - 1

    def place(node: int) -> float:
        child_rows = [place(child) for child in kids.get(node, [])]
        if node == next_under:
            rows["next"] = take_row()
            child_rows.append(rows["next"])
        rows[node] = (child_rows[0] + child_rows[-1]) / 2 if child_rows else take_row()
        return rows[node]

    place(ROOT)
    nxt = (depth[next_under] + 1, rows["next"]) if next_under is not None else None
    deepest = max([depth[i] for i in range(len(parents))] + [0, nxt[0] if nxt else 0])
    return TreeLayout([(depth[i], rows[i]) for i in range(len(parents))], (0, rows[ROOT]), nxt,
                      max(free[0], 1), deepest + 1)


def label_chars(column_px: float, size: int) -> int:
    """Characters of token text that fit a node's box (the hover has the whole token)."""
    return max(1, int(NODE_W * 0.92 * column_px / (size * CHAR_PX)))


def two_digits(v: float) -> str:
    text = f"{v:.2f}"
    return text[1:] if text.startswith("0.") else text


def number_line(node: dict, stage: int) -> str:
    """Under a node's token: q (the draft's probability), and p (the target's) once it has scored it."""
    q = f"q {two_digits(node['q'])}"
    return f"p {two_digits(node['p'])} · {q}" if stage >= 2 else q


# ---------------------------------------------------------------- the token tree

def node_hover(c: dict, i: int, stage: int, parents: Sequence[int]) -> str:
    tree, node = c["tree"], c["tree"]["nodes"][i]
    parent = "the root" if parents[i] == ROOT else f"node {parents[i]} {shown(tree['nodes'][parents[i]]['text'])}"
    text = (f"node {i} · depth {node['depth']} (position L+{node['depth']})<br><b>{shown(node['text'])}</b> under {parent}"
            f"<br>q (draft) {fmt_p(node['q'])} · score {node['score']:.3f} (sum of log q from the root)")
    if stage >= 2:
        text += f"<br>p (target) {fmt_p(node['p'])}"
    if stage < 3:
        return text
    order = tried_by_node(tree).get(i)
    if order is None:
        return text + f"<br>untried: {why_untried(tree, parents, i)}"
    k, t = order
    verdict = "accepted (u < r[t])" if t["accepted"] else "rejected (u ≥ r[t]): taken out of the residual"
    return text + f"<br>tried {k + 1}.: r[t] = {fmt_p(t['p_residual'])} · u = {t['u']:.4f} → {verdict}"


def next_hover(c: dict, root_text: str) -> str:
    tree = c["tree"]
    last = last_on_path(tree)
    after = f"the root {shown(root_text)}" if last == ROOT else f"node {last} {shown(tree['nodes'][last]['text'])}"
    p, residual = next_token_numbers(tree)
    head = f"next token <b>{shown(c['next_token_text'])}</b> (committed last)"
    if tree["next_token_kind"] == NEXT_BONUS:
        return f"{head}<br>bonus: {after} has no children, so it is drawn from the target there<br>p_target {fmt_p(p)}"
    return (f"{head}<br>every child of {after} was rejected: drawn from the residual there"
            f"<br>residual {fmt_p(residual)} · p_target {fmt_p(p)}")


def _edges(lay: TreeLayout, parents: Sequence[int], path: set[int], last: int) -> list[dict]:
    """Lines from each parent's right edge to its child's left edge; the accepted path drawn thick."""
    def segment(a: tuple[float, float], b: tuple[float, float]) -> tuple[list, list]:
        return [a[0] + NODE_W / 2, b[0] - NODE_W / 2, None], [a[1], b[1], None]
    plain, thick = ([], []), ([], [])
    for i, p in enumerate(parents):
        xs, ys = segment(lay.root if p == ROOT else lay.nodes[p], lay.nodes[i])
        group = thick if i in path else plain
        group[0].extend(xs), group[1].extend(ys)
    if lay.next_token is not None:
        xs, ys = segment(lay.root if last == ROOT else lay.nodes[last], lay.next_token)
        thick[0].extend(xs), thick[1].extend(ys)
    line = dict(type="scatter", mode="lines", hoverinfo="skip", showlegend=False)
    out = [dict(line, x=plain[0], y=plain[1], line=dict(color=GRID, width=1.5))]
    if thick[0]:
        out.append(dict(line, x=thick[0], y=thick[1], line=dict(color=OKABE_ITO["bluish_green"], width=3.5)))
    return out


def tree_title(c: dict, stage: int) -> str:
    tree = c["tree"]
    n, depth = len(tree["nodes"]), max((nd["depth"] for nd in tree["nodes"]), default=0)
    if stage == 1:
        return f"Cycle {c['cycle']}: the draft's tree, {n} nodes over {depth} levels in {tree['draft_forwards']} forwards"
    if stage == 2:
        return f"Cycle {c['cycle']}: the target scores all {n} nodes in one pass"
    outcomes = node_outcomes(tree)
    title = (f"Cycle {c['cycle']}: {outcomes.count(ACCEPTED)} accepted, {outcomes.count(REJECTED)} rejected, "
             f"{outcomes.count(UNTRIED)} untried")
    if stage >= 4:
        kind = "bonus" if tree["next_token_kind"] == NEXT_BONUS else "from the residual"
        title += f"; next token {shown(c['next_token_text'], 12)} ({kind})"
    return title


def depth_axis_title(stage: int) -> str:
    numbers = "p = the target's probability, q = the draft's" if stage >= 2 else "q = the draft's probability"
    return f"depth: node at position L + depth · under each node {numbers}"


def tree_figure(c: dict, root_text: str = "", stage: int = 5) -> go.Figure:
    """The cycle's token tree at a stepper stage: 1 the draft's proposals, 2 with the target's p,
    3 coloured by the walk (accepted / rejected / untried), 4-5 with the next token drawn after
    the path's last node. Up to READABLE_NODES nodes the labels are 16 px with a p/q line; bigger
    trees get 11 px labels and keep the numbers in the hover."""
    tree = c["tree"]
    nodes, parents, path = tree["nodes"], parents_of(tree), tree["path"]
    lay = tree_layout(parents, last_on_path(tree) if stage >= 4 else None)
    outcomes = node_outcomes(tree) if stage >= 3 else [PROPOSED] * len(nodes)
    readable = len(nodes) <= READABLE_NODES
    size = LABEL_PX if readable else SMALL_PX
    chars = label_chars(PROJECTOR_WIDTH_PX / lay.columns, size)
    traces = _edges(lay, parents, set(path) if stage >= 3 else set(), last_on_path(tree))
    traces.append(cells(f"▪ {TREE_STYLES[PROMPT].label}", TREE_STYLES[PROMPT], [lay.root[1]], [-NODE_W / 2], [NODE_W],
                        [f"root: <b>{shown(root_text)}</b>, the last committed token (cache slot L, not a draft node)"],
                        thickness=NODE_H))
    for outcome in dict.fromkeys(outcomes):
        idx = [i for i, o in enumerate(outcomes) if o == outcome]
        traces.append(cells(f"{TREE_STYLES[outcome].mark} {TREE_STYLES[outcome].label}", TREE_STYLES[outcome],
                            [lay.nodes[i][1] for i in idx], [lay.nodes[i][0] - NODE_W / 2 for i in idx],
                            [NODE_W] * len(idx), [node_hover(c, i, stage, parents) for i in idx],
                            outline=[3 if outcome == ACCEPTED else 1] * len(idx), thickness=NODE_H))
    xs = [x for x, _ in lay.nodes] + [lay.root[0]]
    ys = [y for _, y in lay.nodes] + [lay.root[1]]
    texts = [f"{shown(n['text'], chars)}" + (f" {TREE_STYLES[o].mark}" if stage >= 3 else "")
             for n, o in zip(nodes, outcomes)] + [shown(root_text or "root", chars)]
    if lay.next_token is not None:
        kind = BONUS if tree["next_token_kind"] == NEXT_BONUS else RESAMPLED
        traces.append(cells(f"{TREE_STYLES[kind].mark} {TREE_STYLES[kind].label}", TREE_STYLES[kind],
                            [lay.next_token[1]], [lay.next_token[0] - NODE_W / 2], [NODE_W], [next_hover(c, root_text)],
                            outline=[3], thickness=NODE_H))
        xs.append(lay.next_token[0]), ys.append(lay.next_token[1])
        texts.append(f"{shown(c['next_token_text'], chars)} {TREE_STYLES[kind].mark}")
    lift = [0.18 if readable else 0.0] * len(nodes) + [0.0] * (len(xs) - len(nodes))  # tokens above their p/q line
    traces.append(labels(xs, [y - d for y, d in zip(ys, lift)], texts, size=size))
    if readable:
        traces.append(labels([x for x, _ in lay.nodes], [y + 0.24 for _, y in lay.nodes],
                             [number_line(n, stage) for n in nodes], size=NUMBER_PX))
    row_px = 46 if readable else 24  # a 16 px token over a 12 px p/q line, apart
    ticks = ["root"] + [f"depth {d}" for d in range(1, lay.columns)]
    return figure(traces, tree_title(c, stage), 150 + row_px * lay.rows, top=96, barmode="overlay",
                  xaxis=dict(range=[-0.5, lay.columns - 0.5], tickvals=list(range(lay.columns)), ticktext=ticks,
                             title=dict(text=depth_axis_title(stage) if readable else "depth (hover a node for its numbers)"),
                             fixedrange=True, showgrid=False, zeroline=False),
                  yaxis=dict(visible=False, range=[lay.rows - 0.5, -0.5], fixedrange=True))


# ---------------------------------------------------------------- the tree attention mask

def tree_mask(parents: Sequence[int]) -> list[list[bool]]:
    """(N+1) x (N+1): row 0 the root's query, row 1+i node i's; column 0 the root's key slot (L),
    column 1+j node j's (L+1+j). A node attends to the root, its ancestors and itself; the root
    to itself. (Every query also attends to the whole prefix, slots 0..L-1.)"""
    n = len(parents)
    rows = [[True] + [False] * n]
    for i in range(n):
        seen = set(ancestors_or_self(parents, i))
        rows.append([True] + [j in seen for j in range(n)])
    return rows


def _mask_reason(row: int, col: int, attends: bool, parents: Sequence[int]) -> str:
    if col == 0:
        return "attends: every query sees the prefix"
    if col == 1:
        return "attends: the root (the last committed token)" if row > 0 else "attends: itself"
    if row == 0:
        return "masked: the root comes before every node"
    if not attends:
        return "masked: another branch (not an ancestor)"
    return "attends: itself" if col - 2 == row - 1 else "attends: an ancestor"


def _mask_hover(row: int, col: int, attends: bool, full: list[str], nodes: list[dict], parents: Sequence[int]) -> str:
    """One cell: query `row` (0 the root, 1+i node i) against key column `col` (0 the prefix, 1 the root, 2+j node j)."""
    query = "root" if row == 0 else f"node {row - 1}"
    position = "L" if row == 0 else f"L+{nodes[row - 1]['depth']}"
    key = "the prefix (slots 0 to L-1)" if col == 0 else "the root" if col == 1 else f"node {col - 2} <b>{full[col - 1]}</b>"
    return f"query {query} <b>{full[row]}</b> at position {position} → key {key}<br>{_mask_reason(row, col, attends, parents)}"


def tree_mask_figure(c: dict, root_text: str = "") -> go.Figure:
    """The verify pass's attention mask as a grid: one row per query (the root, then the nodes, each
    at position L + its depth), one column per key slot (the whole prefix as one column, the root,
    the nodes). A filled cell with ● attends; an empty one is masked."""
    tree = c["tree"]
    nodes, parents = tree["nodes"], parents_of(tree)
    n, L = len(nodes), c["target_cache_len"]["before"]
    mask = tree_mask(parents)
    z = np.asarray([[1] + [int(v) for v in row] for row in mask])  # (N+1, N+2): prefix column first
    small = n <= 12
    chars = 8 if small else 6
    toks = [shown(nd["text"], chars) for nd in nodes]
    root = shown(root_text or "root", chars)
    col_names = [f"prefix ({L} slot{'' if L == 1 else 's'})", f"root {root}"] + [f"{j} {t}" for j, t in enumerate(toks)]
    row_names = [f"root {root} @L"] + [f"{i} {t} @L+{nd['depth']}" for i, (t, nd) in enumerate(zip(toks, nodes))]
    full = [shown(root_text or "root")] + [shown(nd["text"]) for nd in nodes]
    hover = [[_mask_hover(r, k, bool(z[r, k]), full, nodes, parents) for k in range(n + 2)] for r in range(n + 1)]
    marks = np.where(z == 1, "●", "")
    trace = dict(type="heatmap", z=z, x=np.arange(n + 2), y=np.arange(n + 1), zmin=0, zmax=1, showscale=False,
                 colorscale=[[0, tint(OKABE_ITO["grey"], 0.85)], [1, tint(OKABE_ITO["blue"], 0.45)]],
                 xgap=1, ygap=1, text=marks, texttemplate="%{text}", textfont=dict(color=INK, size=12 if n <= 32 else 8),
                 hovertext=np.asarray(hover), hovertemplate="%{hovertext}<extra></extra>")
    tick = 12 if n <= 16 else 10 if n <= 32 else 8
    row_px = 26 if n <= 32 else 15
    return figure([trace], f"Cycle {c['cycle']}: the tree attention mask of the verify pass (● attends; a node sees "
                           "the prefix, its ancestors and itself)", 150 + row_px * (n + 1) + (0 if small else 60),
                  top=64, xaxis=dict(tickvals=list(range(n + 2)), ticktext=col_names, tickangle=0 if small else -90,
                                     tickfont=dict(size=tick), side="top", fixedrange=True, showgrid=False),
                  yaxis=dict(tickvals=list(range(n + 1)), ticktext=row_names, tickfont=dict(size=tick),
                             range=[n + 0.5, -0.5], fixedrange=True, showgrid=False),
                  margin=dict(l=10, r=10, t=64 + (40 if small else 90), b=10))


# ---------------------------------------------------------------- the cache compaction

ROWS = {"target": (0.0, 1.0), "draft": (2.4, 3.4)}  # y of each model's "after append" and "after compaction" rows


def slot_texts(c: dict, root_text: str) -> dict[int, str]:
    """Token text of each target slot from L on, after the verify's append: L the root, L+1+i node i."""
    L = c["target_cache_len"]["before"]
    return {L: root_text, **{L + 1 + i: nd["text"] for i, nd in enumerate(c["tree"]["nodes"])}}


def _cell_row(key: str, y: float, slots: list[int], texts: list[str], hover: list[str], legend: bool = True) -> list[dict]:
    if not slots:
        return []
    style = TREE_STYLES[key]
    return [cells(f"{style.mark} {style.label}", style, [y] * len(slots), [s - 0.45 for s in slots], [0.9] * len(slots),
                  hover, legend=legend), labels(slots, [y] * len(slots), texts, size=SLOT_PX)]


SLOT_PX = 12  # slot labels of the compaction figure; narrower cells cut the token shorter (the hover has it all)


def slot_chars(slots: int) -> int:
    """Characters of a token that fit one slot's cell when `slots` cells share the projector's width."""
    return max(1, int(0.85 * PROJECTOR_WIDTH_PX / max(slots, 1) / (SLOT_PX * CHAR_PX)))


def cell_text(texts: dict[int, str], slot: int, chars: int = 5) -> str:
    """A slot's label: its token, cut to the cell; blank where the record does not say whose K/V it holds."""
    return shown(texts[slot], chars) if slot in texts else ""


def prefix_words(L: int) -> str:
    return "no prefix" if L <= 0 else "slot 0: the prefix" if L == 1 else f"slots 0–{L - 1}: the prefix"


def _holds(model: str, slot: int, text: str | None) -> str:
    what = f"K/V of <b>{shown(text)}</b>" if text is not None else "K/V of a draft node off the accepted path"
    return f"{model} slot {slot}: {what}"


def _model_rows(model: str, lengths: dict, kept: list[int], texts: dict[int, str], fed: dict[int, str],
                legend: bool, chars: int) -> list[dict]:
    """One model's two rows: every slot after the append (kept or discarded), then the kept ones moved
    left and (the draft) the committed tokens fed after them. `texts`: the token of each slot after the
    append, where known; `fed`: the token of each catch-up slot."""
    top, bottom = ROWS[model]
    before = lengths["before"]
    window = range(before, min(lengths["after_append"], before + MAX_SLOTS))
    keep = set(kept)
    traces = []
    for key, words in ((KEPT, "kept"), (DROPPED, "discarded: not on the accepted path")):
        slots = [s for s in window if (s in keep) == (key == KEPT)]
        traces += _cell_row(key, top, slots, [cell_text(texts, s, chars) for s in slots],
                            [f"{_holds(model, s, texts.get(s))} · {words}" for s in slots], legend)
    moved = [(before + j, src) for j, src in enumerate(kept[:MAX_SLOTS])]
    traces += _cell_row(KEPT, bottom, [d for d, _ in moved], [cell_text(texts, s, chars) for _, s in moved],
                        [f"{_holds(model, d, texts.get(s))} after compaction "
                         + ("(in place)" if d == s else f"(moved from slot {s})") for d, s in moved], legend=False)
    catch_up = [s for s in range(before + len(kept), min(lengths["after_rollback"], before + MAX_SLOTS))]
    traces += _cell_row(CATCH_UP, bottom, catch_up, [cell_text(fed, s, chars) for s in catch_up],
                        [f"{_holds(model, s, fed.get(s))}, fed after the compaction (catch-up)" for s in catch_up])
    return traces


def draft_texts(c: dict, root_text: str) -> tuple[dict[int, str], dict[int, str]]:
    """The draft's kept slots hold the committed positions L, L+1, ... (the root, then the path's tokens);
    which node a discarded draft slot held the record does not say. Returns (append texts, catch-up texts)."""
    before, kept = c["draft_cache_len"]["before"], c["tree"]["compaction"]["draft"]["kept_slots"]
    committed = ([root_text] + list(c["committed_token_texts"]))
    held = {src: committed[j] for j, src in enumerate(kept) if j < len(committed)}
    fed = {s: committed[s - before] for s in range(before + len(kept), c["draft_cache_len"]["after_rollback"])
           if s - before < len(committed)}
    return held, fed


def move_arrows(model: str, moves: list[list[int]]) -> list[dict]:
    """One arrow per move [from, to]: from the slot after the append down to its slot after compaction."""
    top, bottom = ROWS[model]
    return [dict(x=dst, y=bottom - 0.42, ax=src, ay=top + 0.42, xref="x", yref="y", axref="x", ayref="y", text="",
                 showarrow=True, arrowhead=2, arrowsize=1, arrowwidth=1.6, arrowcolor=OKABE_ITO["blue"],
                 name=f"{model} move")
            for src, dst in moves[:MAX_SLOTS]]


def tree_compaction_figure(c: dict, root_text: str = "", layout: str = "dynamic") -> go.Figure:
    """The target's cache slots from L on after the verify (every node's slot, kept or discarded) and after
    the compaction (the path's K/V moved next to the prefix, one arrow per move); the draft's too when
    the record has them. The prefix (slots 0..L-1) is never touched and not drawn."""
    t, comp = c["target_cache_len"], c["tree"]["compaction"]
    L = t["before"]
    d, end = c.get("draft_cache_len"), t["after_append"]
    if d is not None:
        end = max(end, d["after_append"], d["after_rollback"])
    end = min(end, L + MAX_SLOTS)
    chars = slot_chars(end - L)
    traces = _model_rows("target", t, comp["target"]["kept_slots"], slot_texts(c, root_text), {}, True, chars)
    arrows = move_arrows("target", comp["target"]["moves"])
    ticks = {0.0: "target: after the verify", 1.0: "target: after compaction"}
    if d is not None and comp.get("draft") is not None:
        held, fed = draft_texts(c, root_text)
        traces += _model_rows("draft", d, comp["draft"]["kept_slots"], held, fed, False, chars)
        arrows += move_arrows("draft", comp["draft"]["moves"])
        ticks.update({2.4: "draft: after drafting", 3.4: "draft: after compaction, catch-up"})
    dropped = t["after_append"] - L - len(comp["target"]["kept_slots"])
    title = (f"Cycle {c['cycle']}: compaction ({layout} cache), target {t['after_append']} → {t['after_rollback']} "
             f"slots: {len(comp['target']['moves'])} K/V moved left, {dropped} discarded")
    bottom = max(ticks)
    return figure(traces, title, 150 + 70 * len(ticks), top=96, barmode="overlay", annotations=arrows,
                  xaxis=dict(title=dict(text=f"cache slot ({prefix_words(L)}, untouched, not drawn)"),
                             range=[L - 0.5, max(end, L + 1) - 0.5], dtick=1, tickformat="d", fixedrange=True),
                  yaxis=dict(tickvals=list(ticks), ticktext=list(ticks.values()), range=[bottom + 0.6, -0.6],
                             fixedrange=True, showgrid=False, zeroline=False))


# ---------------------------------------------------------------- the words

def tree_summary(c: dict, root_text: str = "") -> str:
    """One line: 'accepted 3 of 15 nodes (5 tried) along 'a' → 'b' → 'c', then a bonus 'x''. Plain text."""
    tree = c["tree"]
    nodes, path = tree["nodes"], tree["path"]
    line = f"accepted {len(path)} of {len(nodes)} nodes ({len(tree['tried'])} tried)"
    if path:
        line += " along " + " → ".join(quoted(nodes[i]["text"]) for i in path)
    nxt = quoted(c["next_token_text"])
    if tree["next_token_kind"] == NEXT_BONUS:
        return line + f", then a bonus {nxt}"
    last = quoted(nodes[path[-1]]["text"]) if path else f"the root {quoted(root_text)}" if root_text else "the root"
    return line + f"; every child of {last} was rejected, so {nxt} came from the residual"


def tree_stage_caption(c: dict, stage: int, root_text: str = "", layout: str = "dynamic") -> str:
    """What happens at a stepper stage of a tree cycle, in one or two plain-text sentences."""
    tree = c["tree"]
    n, t = len(tree["nodes"]), c["target_cache_len"]
    depth = max((nd["depth"] for nd in tree["nodes"]), default=0)
    root = quoted(root_text) if root_text else "the last committed token"
    if stage == 1:
        return (f"The draft grows a tree from the root {root}: {n} nodes, {depth} levels deep, in "
                f"{tree['draft_forwards']} batched forwards (one per level). Each expanded node offers several "
                "candidates for the next position, its most likely first; nothing is decided yet.")
    if stage == 2:
        return (f"The target scores the root and all {n} nodes in one forward of {n + 1} positions. Each node "
                "sits at position L + its depth and, through the tree attention mask, sees only the prefix, its "
                "ancestors and itself: one pass computes every branch as if it were a chain of its own.")
    if stage == 3:
        return ("The walk starts at the root and tries its children in order: a child is accepted if u < r[t], "
                "its probability in the residual r; a rejected token is taken out of r, r is renormalised, and "
                "the next sibling is tried. After an accept the walk moves down to that node. This cycle: "
                + tree_summary(c, root_text) + ".")
    if stage == 4:
        if tree["next_token_kind"] == NEXT_BONUS:
            return (f"The walk reached a node with no children, so one more token, {quoted(c['next_token_text'])}, is "
                    "drawn from the target's distribution there: the bonus. "
                    f"{len(c['committed_token_ids'])} token(s) committed for one target pass.")
        return (f"Every candidate at the last step was rejected, so {quoted(c['next_token_text'])} is drawn from the "
                "residual left after removing them (exactly the multi-round speculative sampling rule). "
                f"{len(c['committed_token_ids'])} token(s) committed for one target pass.")
    return (f"Compaction: the verify wrote K/V for every node ({t['before']} → {t['after_append']} slots) but only the "
            f"accepted path is text now. Its K/V move next to the prefix and the rest is discarded "
            f"({t['after_append']} → {t['after_rollback']}); with this {layout} cache: {COMPACTION_WORDS.get(layout, '')}.")


def tried_rows(c: dict) -> list[dict]:
    """The walk, one row per tried node, in the order tried (plain text: the page escapes it)."""
    nodes = c["tree"]["nodes"]
    rows = []
    for k, t in enumerate(c["tree"]["tried"]):
        node = nodes[t["node"]]
        parent = node["parent"]
        rows.append({"try": k + 1, "node": t["node"], "token": visible_text(node["text"]),
                     "under": "root" if parent == ROOT else f"{parent} {visible_text(nodes[parent]['text'])}",
                     "depth": node["depth"], "p (target)": f"{node['p']:.4f}", "q (draft)": f"{node['q']:.4f}",
                     "r[t]": f"{t['p_residual']:.4f}", "u": f"{t['u']:.4f}",
                     "result": "✓ accepted" if t["accepted"] else "✗ rejected"})
    return rows


def teaching_tree_cycle(cycles: list[dict]) -> int:
    """The most instructive tree cycle: a rejection and then an accept further on, else any accept."""
    def rejected_some(c: dict) -> bool:
        return any(not t["accepted"] for t in c["tree"]["tried"])
    for wanted in (lambda c: c["tree"]["path"] and rejected_some(c), lambda c: c["tree"]["path"]):
        for i, c in enumerate(cycles):
            if wanted(c):
                return i
    return 0


# ---------------------------------------------------------------- what a page shows for a cycle

TREE_CHART_KEYS = {"tree": "tree_chart", "mask": "tree_mask", "compaction": "tree_compaction"}  # stepper widget keys


def root_text(trace, c: dict) -> str:
    """The root's token: the last token of the committed sequence when cycle c starts."""
    texts = committed_texts(trace, c)
    return texts[-1] if texts else ""


def stage_figures(c: dict, root: str, stage: int, layout: str = "dynamic") -> list[tuple[str, go.Figure]]:
    """The three figures of a tree cycle as (name, figure), the one a stage is about first: the mask
    at the verify (2), the compaction at the rollback (5), the tree otherwise."""
    figs = {"tree": tree_figure(c, root, stage), "mask": tree_mask_figure(c, root),
            "compaction": tree_compaction_figure(c, root, layout)}
    return [(name, figs[name]) for name in stage_order(stage)]


def stage_order(stage: int) -> list[str]:
    """The names of stage_figures' figures, in the order it returns them."""
    first = {2: "mask", 5: "compaction"}.get(stage, "tree")
    return [first] + [name for name in ("tree", "mask", "compaction") if name != first]
