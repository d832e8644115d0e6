"""The token tree of one tree cycle, and the figures a page shows for a tree cycle.

- tree_figure: the token tree, the root (the last committed token) on the left, depth to the
  right, siblings top to bottom in the order the walk tries them; coloured by the walk's outcome.
- stage_figures: the tree with its attention mask (tree_mask.py) and its cache compaction
  (tree_compaction.py), the one a stepper stage is about first.
What a record says is read in tree_record.py; the words about a tree cycle are in tree_captions.py.
No Streamlit here. Token texts go through style.shown/esc (html.escape) before they reach a
label, a tick or a hover.
"""
from dataclasses import dataclass
from typing import Sequence

import plotly.graph_objects as go

from app.figures.derive import ACCEPTED, BONUS, PROMPT, REJECTED, RESAMPLED, committed_texts
from app.figures.style import (
    CHAR_PX,
    GRID,
    OKABE_ITO,
    PROJECTOR_WIDTH_PX,
    PROPOSED,
    TREE_STYLES,
    UNTRIED,
    cells,
    figure,
    fmt_p,
    labels,
    shown,
)
from app.figures.tree_compaction import tree_compaction_figure
from app.figures.tree_mask import tree_mask_figure
from app.figures.tree_record import last_on_path, next_token_numbers, node_outcomes, parents_of, tried_by_node, why_untried
from engine.trace.schema import NEXT_BONUS, ROOT

READABLE_NODES = 32  # up to this many nodes the tree's labels are projector-sized (16 px)
LABEL_PX, NUMBER_PX, SMALL_PX = 16, 12, 11  # token text, the p/q line under it, labels of bigger trees
NODE_W, NODE_H = 0.84, 0.8  # a node's box, in columns and rows: under 1, so neighbours never touch


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
