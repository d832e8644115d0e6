"""The tree cycle's figures (app/figures/tree.py) and the pages that show them, on hand-built tree records.

The records (tests/tree_records.py) follow /work/tree-contract.md; every expectation here is read off
the record's own fields (nodes, tried, path, compaction), not through the figure module's helpers.
"""
import json
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.figures import cycle as figures
from app.figures import derive, overview, style, tree_captions, tree_compaction, tree_mask
from app.figures import tree as tf
from app.ui import state
from app.ui.safe import md
from engine.mode import RunMode
from engine.trace import loads_trace
from engine.trace.schema import ROOT
from tests.tree_records import (
    SMALL_US,
    Node,
    hostile_tree,
    small_tree,
    tree_cycle,
    tree_trace,
    wide_tree,
)

MAIN = str(Path(__file__).resolve().parent.parent / "app" / "main.py")
HOSTILE_ROOT = "<script>alert('root')</script>"


def small() -> dict:
    return tree_cycle(0, 3, small_tree(), SMALL_US, "mat")


def bonus() -> dict:
    return tree_cycle(1, 5, hostile_tree(), [0.1, 0.1], "far")


def wide(n: int = 32) -> dict:
    nodes = wide_tree(n)
    # accept the first child of the root, reject the first two children under it, then accept the third
    us = [0.0] + [0.999, 0.999, 0.0] + [0.999] * n
    return tree_cycle(2, 9, nodes, us, "log")


def expected_outcomes(c: dict) -> list[str]:
    """From the record alone: the path accepted, the other tried nodes rejected, the rest untried."""
    tried = {t["node"] for t in c["tree"]["tried"]}
    return ["accepted" if i in c["tree"]["path"] else "rejected" if i in tried else "untried"
            for i in range(len(c["tree"]["nodes"]))]


def node_cells(fig) -> dict[int, dict]:
    """Node index -> its cell's colour and centre, read from each bar's hover ('node i · ...')."""
    out = {}
    for bar in (t for t in fig.data if t.type == "bar"):
        for hover, base, width, y in zip(bar.hovertext, bar.base, bar.x, bar.y):
            found = re.match(r"node (\d+) ·", hover)
            if found:
                out[int(found.group(1))] = {"colour": bar.marker.color, "x": base + width / 2, "y": y}
    return out


def strings_in(obj) -> list[str]:
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in strings_in(v)]
    if isinstance(obj, (list, tuple)) or hasattr(obj, "tolist"):
        return [s for v in (obj.tolist() if hasattr(obj, "tolist") else obj) for s in strings_in(v)]
    return []


# ---------------------------------------------------------------- the records themselves

def test_hand_built_records_follow_the_contract():
    """The builder's walk, on its own numbers: a residual cycle and a bonus cycle."""
    c = small()
    tree = c["tree"]
    assert tree["path"] == [1, 3] and tree["next_token_kind"] == "residual"
    assert [t["node"] for t in tree["tried"]] == [0, 1, 3, 5]
    assert tree["tried"][1]["p_residual"] == pytest.approx(0.6 / (1 - 0.2))  # 'dog' (p 0.2) rejected before it
    assert c["committed_token_texts"] == ["sat", "on", "mat"]
    L = c["target_cache_len"]["before"]
    assert tree["compaction"]["target"] == {"kept_slots": [L, L + 2, L + 4], "moves": [[L + 2, L + 1], [L + 4, L + 2]]}
    assert L + len(tree["compaction"]["target"]["kept_slots"]) == c["target_cache_len"]["after_rollback"]
    b = bonus()
    assert b["tree"]["next_token_kind"] == "bonus" and b["tree"]["residual_top"] is None


# ---------------------------------------------------------------- layout

def lopsided() -> dict:
    """A root child with one child of its own, then a leaf sibling, then a chain: rows a centred parent can collide on."""
    nodes = [Node("dog", ROOT, 0.5, 0.3), Node("sat", ROOT, 0.3, 0.3), Node("ran", ROOT, 0.1, 0.3),
             Node("on", 0, 0.9, 0.5), Node("a", 2, 0.9, 0.5), Node("mat", 4, 0.9, 0.5)]
    return tree_cycle(0, 3, nodes, [0.9, 0.9, 0.1, 0.1, 0.1], "log")


TREES = {"small": small, "bonus": bonus, "lopsided": lopsided, "wide32": wide, "wide64": lambda: wide(64)}


@pytest.mark.parametrize("name", list(TREES))
def test_layout_places_children_right_of_parents_without_overlap(name):
    c = TREES[name]()
    n = len(c["tree"]["nodes"])
    parents = [nd["parent"] for nd in c["tree"]["nodes"]]
    last = c["tree"]["path"][-1] if c["tree"]["path"] else ROOT
    lay = tf.tree_layout(parents, last)
    assert lay == tf.tree_layout(parents, last)  # a pure function: the same record, the same picture
    boxes = [lay.root] + lay.nodes + [lay.next_token]
    for i, (x1, y1) in enumerate(boxes):
        for x2, y2 in boxes[i + 1:]:  # node boxes are NODE_W x NODE_H, both under 1: a unit apart never touch
            assert abs(x1 - x2) >= 1 or abs(y1 - y2) >= 1, f"boxes at {(x1, y1)} and {(x2, y2)} overlap"
    for i, p in enumerate(parents):
        parent_x = lay.root[0] if p == ROOT else lay.nodes[p][0]
        assert lay.nodes[i][0] == parent_x + 1  # a child one column right of its parent
    for p in [ROOT] + list(range(n)):  # siblings top to bottom in the order the walk tries them
        rows = [lay.nodes[i][1] for i, q in enumerate(parents) if q == p]
        assert rows == sorted(rows)
    last_x = lay.root[0] if last == ROOT else lay.nodes[last][0]
    assert lay.next_token[0] == last_x + 1  # the next token after the path's last node


# ---------------------------------------------------------------- the tree figure

@pytest.mark.parametrize("make", [small, bonus, wide])
def test_tree_colours_follow_the_walk(make):
    c = make()
    fig = tf.tree_figure(c, "cat", 5)
    style.validated(fig)
    cells = node_cells(fig)
    assert sorted(cells) == list(range(len(c["tree"]["nodes"])))
    colours = {"accepted": style.STYLES["accepted"].colour, "rejected": style.STYLES["rejected"].colour,
               "untried": style.OKABE_ITO["grey"]}
    for i, outcome in enumerate(expected_outcomes(c)):
        assert cells[i]["colour"] == style.tint(colours[outcome]), f"node {i} should be {outcome}"
    kind = c["tree"]["next_token_kind"]
    name = "next token: bonus" if kind == "bonus" else "next token: from the residual"
    (next_bar,) = [t for t in fig.data if t.type == "bar" and t.name.endswith(name)]
    assert next_bar.marker.color == style.tint(style.STYLES["bonus" if kind == "bonus" else "resampled"].colour)
    last = c["tree"]["path"][-1]
    assert next_bar.base[0] + next_bar.x[0] / 2 == pytest.approx(cells[last]["x"] + 1)  # drawn after the path's end
    assert kind in next_bar.hovertext[0] or "residual" in next_bar.hovertext[0]


def test_tree_stages_reveal_the_walk_step_by_step():
    c = small()
    proposed = node_cells(tf.tree_figure(c, "cat", 1))
    assert {v["colour"] for v in proposed.values()} == {style.tint(style.OKABE_ITO["sky_blue"])}
    hovers = [h for t in tf.tree_figure(c, "cat", 1).data if t.type == "bar" for h in t.hovertext]
    assert not any("p (target)" in h for h in hovers) and not any("tried" in h for h in hovers)
    stage2 = [h for t in tf.tree_figure(c, "cat", 2).data if t.type == "bar" for h in t.hovertext]
    assert any("p (target) 0.600" in h for h in stage2) and not any("→ accepted" in h for h in stage2)
    stage3 = tf.tree_figure(c, "cat", 3)
    assert not any(t.name and t.name.startswith("★") or (t.name or "").endswith("from the residual") for t in stage3.data)
    hover = next(h for t in stage3.data if t.type == "bar" for h in t.hovertext if h.startswith("node 1 ·"))
    assert "tried 2." in hover and "accepted" in hover and "u = 0.1000" in hover  # its place in the walk, u and r[t]
    untried = next(h for t in stage3.data if t.type == "bar" for h in t.hovertext if h.startswith("node 2 ·"))
    assert "untried" in untried and "never accepted" in untried  # 'ran' hangs under the rejected 'dog'


@pytest.mark.parametrize("n", [32, 64])
def test_tree_labels_fit_a_projector(n):
    """Up to 32 nodes: 16 px token labels and a p/q line inside each box; beyond, 11 px labels. Every label
    fits its box at the projector's plot width (style.text_px, as the chain figures' layout tests do)."""
    c = wide(n)
    fig = tf.tree_figure(c, "cat", 5)
    style.validated(fig)
    lo, hi = fig.layout.xaxis.range
    box_px = tf.NODE_W * style.PROJECTOR_WIDTH_PX / (hi - lo)
    text_rows = [t for t in fig.data if t.type == "scatter" and t.mode == "text"]
    sizes = sorted({t.textfont.size for t in text_rows})
    assert sizes == ([tf.NUMBER_PX, tf.LABEL_PX] if n <= tf.READABLE_NODES else [tf.SMALL_PX])
    for row in text_rows:
        for text in row.text:
            assert style.text_px(text, row.textfont.size) <= box_px, f"{text!r} is wider than its box"
    if n <= tf.READABLE_NODES:
        rows = len({round(y, 3) for y in (v["y"] for v in node_cells(fig).values())})
        assert fig.layout.height / max(rows, 1) >= 2 * tf.LABEL_PX  # a row is tall enough for the token and its p/q


# ---------------------------------------------------------------- the mask

def ancestors_or_self(parents: list[int], i: int) -> set[int]:
    seen = set()
    while i != ROOT:
        seen.add(i)
        i = parents[i]
    return seen


@pytest.mark.parametrize("make", [small, bonus, wide])
def test_mask_cells_are_ancestors_or_self(make):
    c = make()
    fig = tree_mask.tree_mask_figure(c, "cat")
    style.validated(fig)
    (heat,) = fig.data
    z = [list(row) for row in heat.z]
    parents = [nd["parent"] for nd in c["tree"]["nodes"]]
    n = len(parents)
    assert len(z) == n + 1 and all(len(row) == n + 2 for row in z)
    assert z[0] == [1, 1] + [0] * n  # the root sees the prefix and itself
    for i in range(n):
        seen = ancestors_or_self(parents, i)
        assert z[1 + i] == [1, 1] + [int(j in seen) for j in range(n)], f"row of node {i}"
    marks = [list(row) for row in heat.text]
    assert all((m == "●") == bool(v) for mr, zr in zip(marks, z) for m, v in zip(mr, zr))  # not colour alone
    assert f"prefix ({c['target_cache_len']['before']} slots)" in heat.x.tolist() or \
        fig.layout.xaxis.ticktext[0].startswith(f"prefix ({c['target_cache_len']['before']} slot")
    depths = [nd["depth"] for nd in c["tree"]["nodes"]]
    assert [t.split("@")[-1] for t in fig.layout.yaxis.ticktext] == ["L"] + [f"L+{d}" for d in depths]


# ---------------------------------------------------------------- the compaction

@pytest.mark.parametrize("make", [small, bonus, wide])
def test_compaction_arrows_are_the_moves_and_cells_the_kept_slots(make):
    c = make()
    fig = tree_compaction.tree_compaction_figure(c, "cat")
    style.validated(fig)
    comp = c["tree"]["compaction"]
    for model in ("target", "draft"):
        arrows = [(a.ax, a.x) for a in fig.layout.annotations if a.name == f"{model} move"]
        assert arrows == [tuple(m) for m in comp[model]["moves"]]
    kept = set(comp["target"]["kept_slots"])
    t = c["target_cache_len"]
    appended, compacted = {}, []
    for bar in (b for b in fig.data if b.type == "bar"):
        for hover, base in zip(bar.hovertext, bar.base):
            slot = round(base + 0.45)
            if hover.startswith(f"target slot {slot}:") and "after compaction" not in hover:
                appended[slot] = bar.marker.color
            elif hover.startswith("target slot") and "after compaction" in hover:
                compacted.append(slot)
    assert sorted(appended) == list(range(t["before"], t["after_append"]))  # every node's slot, and the root's
    for slot, colour in appended.items():
        want = style.STYLES["accepted"].colour if slot in kept else style.STYLES["rejected"].colour
        assert colour == style.tint(want), f"slot {slot}"
    assert sorted(compacted) == list(range(t["before"], t["after_rollback"]))  # the kept ones, moved left


def test_compaction_draws_the_drafts_catch_up():
    c = bonus()  # the path ends on the deepest level, which the draft never fed: it is fed after the compaction
    d = c["draft_cache_len"]
    fed = d["before"] + len(c["tree"]["compaction"]["draft"]["kept_slots"])
    assert fed < d["after_rollback"]
    fig = tree_compaction.tree_compaction_figure(c, "cat")
    hovers = [h for b in fig.data if b.type == "bar" for h in b.hovertext if "catch-up" in h]
    assert [int(re.match(r"draft slot (\d+)", h).group(1)) for h in hovers] == list(range(fed, d["after_rollback"]))


# ---------------------------------------------------------------- words

def test_summary_names_the_path_and_the_next_token():
    assert tree_captions.tree_summary(small(), "cat") == ("accepted 2 of 6 nodes (4 tried) along “sat” → “on”; every child of "
                                               "“on” was rejected, so “mat” came from the residual")
    hostile = tree_captions.tree_summary(bonus())
    assert hostile.startswith("accepted 2 of 2 nodes (2 tried) along “<script>") and hostile.endswith(", then a bonus “far”")
    assert "<script>" not in md(hostile)  # the pages show it through app.ui.safe.md
    none = tree_cycle(0, 3, [Node("dog", ROOT, 0.5, 0.1)], [0.9], "cat")
    assert tree_captions.tree_summary(none, "the") == ("accepted 0 of 1 nodes (1 tried); every child of the root “the” was "
                                            "rejected, so “cat” came from the residual")


# ---------------------------------------------------------------- escaping

def test_token_text_is_escaped_in_every_figure():
    c = bonus()  # node texts '<script>…' and '<img …>', and a hostile root
    figs = [tf.tree_figure(c, HOSTILE_ROOT, stage) for stage in range(1, 6)]
    figs += [tree_mask.tree_mask_figure(c, HOSTILE_ROOT), tree_compaction.tree_compaction_figure(c, HOSTILE_ROOT)]
    trace = tree_trace()
    figs.append(figures.text_figure(derive.token_table(trace), 1))
    for fig in figs:
        texts = strings_in(json.loads(fig.to_json()))
        assert not [t for t in texts if "<script" in t or "<img" in t], fig.layout.title.text
        assert [t for t in texts if "&lt;script" in t or "&lt;img" in t]


# ---------------------------------------------------------------- the text and the all-cycles grid

def test_token_table_and_overview_of_a_tree_trace():
    trace = tree_trace()
    tokens = derive.token_table(trace)
    origins = [t.origin for t in tokens[len(trace.header["prompt_token_texts"]):]]
    want = []
    for c in trace.cycles:
        last = "bonus" if c["tree"]["next_token_kind"] == "bonus" else "resampled"
        want += ["accepted"] * len(c["tree"]["path"]) + [last]
    assert origins == want
    first = tokens[len(trace.header["prompt_token_texts"])]
    node = trace.cycles[0]["tree"]["nodes"][trace.cycles[0]["tree"]["path"][0]]
    assert (first.p_target, first.p_draft, first.depth) == (node["p"], node["q"], 1)
    hover = figures.token_hover(first)
    assert "depth 1" in hover and "r[t]" in hover and "min(1" not in hover  # a tree's test, not the ratio
    ov = derive.overview(trace)
    for c in trace.cycles:
        accepted = [p for cyc, p in zip(*ov.points["accepted"]) if cyc == c["cycle"]]
        assert accepted == list(range(1, len(c["tree"]["path"]) + 1))
    assert style.validated(overview.overview_figure(ov, len(trace.cycles), 0))


# ---------------------------------------------------------------- the pages (AppTest)

def open_app(trace, page: str | None = None, cycle: int = 0, stage: int = 1) -> AppTest:
    """The app with a tree trace already open: the parsed Trace is put into the session the way
    state.set_current leaves it, without going through the file loader;
    "_opened" marks the session as started, so the URL and the default trace are not read."""
    at = AppTest.from_file(MAIN, default_timeout=60)
    opened = {"_opened": True, state.REF: state.TraceRef("bundled", "hand-made-tree.jsonl"), state.TRACE: trace,
              state.TRACE_KEY: "hand-made-tree", state.CYCLE: cycle, state.STAGE: stage}
    for key, value in opened.items():
        at.session_state[key] = value
    at.run()
    if page:
        at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def chart_ids(at: AppTest) -> list[str]:
    return [c.proto.id.rsplit("-", 1)[-1] for c in at.get("plotly_chart")]


@pytest.fixture
def no_bundled(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(tmp_path))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)


def test_stepper_shows_a_tree_cycle_at_every_stage(no_bundled):
    trace = tree_trace()
    for stage in range(1, 6):
        at = open_app(trace, cycle=0, stage=stage)
        assert at.subheader[0].value.startswith(f"Cycle 0 · stage {stage} ")
        ids = chart_ids(at)
        assert {"tree_chart", "tree_mask", "tree_compaction", "cycle_time", "overview"} <= set(ids)
        first = {2: "tree_mask", 5: "tree_compaction"}.get(stage, "tree_chart")
        assert ids[0] == first  # the stage's own figure comes first
    assert "static tree" in at.caption[0].value or "dynamic tree" in at.caption[0].value
    at.button(key="nav_next").click().run()
    assert not at.exception and at.subheader[0].value.startswith("Cycle 1 · stage 5")
    at.button(key="nav_last").click().run()  # the 32-node cycle
    assert not at.exception and at.subheader[0].value.startswith("Cycle 2 ")


def test_stepper_stage_3_lists_the_walk(no_bundled):
    trace = tree_trace()
    at = open_app(trace, cycle=0, stage=3)
    table = next(m.value for m in at.markdown if m.value.startswith("| try |"))
    assert table.count("\n") == 1 + len(trace.cycles[0]["tree"]["tried"])  # header, rule, one line per try
    assert "accepted" in table and "rejected" in table


def test_walkthrough_and_interview_show_the_open_tree_trace(no_bundled):
    trace = tree_trace()
    at = open_app(trace, "views/walkthrough.py")
    assert {"wt_tree_tree", "wt_tree_mask", "wt_tree_compaction"} <= set(chart_ids(at))
    assert any("Li et al. (2024)" in m.value for m in at.markdown)  # the figures' sources are cited
    at = open_app(trace, "views/interview.py")
    labels = " ".join(e.label for e in at.expander)
    assert "tree of candidates" in labels and "tree attention mask" in labels and "after a tree cycle" in labels
    assert {"iv_tree_tree", "iv_tree_mask", "iv_tree_compaction"} <= set(chart_ids(at))
    words = " ".join(m.value for m in at.markdown)
    assert "2.29×" in words and "Xia et al. 2024" in words


def test_walkthrough_says_when_there_is_no_bundled_tree_trace(no_bundled, example_traces, monkeypatch):
    monkeypatch.setenv("SPECLAB_TRACE", str(example_traces["sampled"]))
    at = AppTest.from_file(MAIN, default_timeout=60).run()
    at.switch_page("views/walkthrough.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("No bundled tree trace yet" in i.value for i in at.info)
    assert not any(i.endswith("wt_tree_tree") for i in chart_ids(at))


def write_trace(trace, path: Path) -> Path:
    lines = [trace.header] + trace.cycles + [trace.summary]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines), encoding="utf-8")
    return path


def test_stepper_opens_a_tree_trace_file(tmp_path, monkeypatch):
    """Through the real loader: the file a real tree run writes, opened from SPECLAB_TRACE."""
    from engine.config import SpecSettings, parse_tree
    from engine.run import run_to_trace
    from tests.tiny import noisy_pair

    path = tmp_path / "tree.jsonl"
    run_to_trace(noisy_pair(2, noise=0.1), "the cat sat on", SpecSettings(k=3, temperature=1.0, max_new_tokens=24),
                 path, RunMode(tree=parse_tree("static:3,2,1")))
    loads_trace(path.read_bytes(), "tree.jsonl")  # what the app will open
    monkeypatch.setenv("SPECLAB_TRACE", str(path))
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(tmp_path / "none"))
    at = AppTest.from_file(MAIN, default_timeout=60)
    at.query_params.update({"trace": "env", "cycle": "2", "stage": "3"})
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert {"tree_chart", "tree_mask", "tree_compaction"} <= set(chart_ids(at))
    at.switch_page("views/walkthrough.py").run()
    assert not at.exception and {"wt_tree_tree", "wt_tree_mask"} <= set(chart_ids(at))


def test_the_draft_caption_counts_its_forwards_against_the_levels_kept():
    """A dynamic tree runs every forward its depth allows: shakespeare-tree-dynamic-greedy's cycle 0 ran 6 and
    kept 5 levels, and the caption said "5 levels deep, in 6 batched forwards (one per level)"."""
    from engine.trace import load_trace
    trace = load_trace(Path(__file__).resolve().parent.parent / "assets" / "traces" / "shakespeare-tree-dynamic-greedy.jsonl")
    seen = set()
    for c in trace.cycles:
        tree = c["tree"]
        depth, forwards, n = max(nd["depth"] for nd in tree["nodes"]), tree["draft_forwards"], len(tree["nodes"])
        said = tree_captions.tree_stage_caption(c, 1, "u")
        assert f"{depth} levels deep, in {forwards} batched forwards" in said
        assert ("(one per level)" in said) == (forwards == depth), said
        if forwards > depth:
            assert f"all fell outside the {n} nodes kept" in said
        seen.add(forwards > depth)
    assert seen == {True, False}  # the trace has both
    assert "those of the last 2 all fell outside the 9 nodes kept" in tree_captions.forwards_words(5, 3, 9)
