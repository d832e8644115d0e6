"""Tree statistics (engine/stats/trees.py), their figures, the statistics page and `engine stats` on tree traces.

Counts are checked twice: on hand-built records whose numbers are written out here, and on real
runs of tiny random models, where the test recounts each quantity from the records by its own
route (the walk's `tried` list, node depths), not through the module's helpers.
"""
import dataclasses
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.figures import tree_stats as figs
from app.ui import state
from app.ui.safe import md
from app.views.sections import statistics_tree
from engine.config import SpecSettings, parse_tree
from engine.mode import RunMode
from engine.run import run_to_trace
from engine.stats.report import format_stats
from engine.stats.trees import compare_chain_tree, pair_differences, tree_stats
from engine.trace import Trace
from engine.trace.metrics import decoding_tokens_per_s
from engine.trace.schema import ROOT
from tests.tiny import noisy_pair, tiny_pair
from tests.tree_records import Node, hostile_tree, small_tree, tree_cycle, tree_header

ROOT_DIR = Path(__file__).resolve().parent.parent
MAIN = str(ROOT_DIR / "app" / "main.py")
PAGE = "views/statistics.py"
PROMPT = "the cat sat"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Real runs on one tiny pair and prompt: trees (static greedy, dynamic sampled) and chains.

    Files: chains in traces/ (the page's bundled folder), trees in trees/ (today's loader refuses them)."""
    root = tmp_path_factory.mktemp("tree_stats")
    pair = noisy_pair(0, noise=0.05)
    greedy = SpecSettings(k=3, temperature=0.0, max_new_tokens=40)
    sampled = SpecSettings(k=3, temperature=1.0, seed=5, max_new_tokens=40)
    out = {"root": root}
    out["static"] = run_to_trace(pair, PROMPT, greedy, root / "trees" / "static.jsonl",
                                 RunMode(tree=parse_tree("static:3,2,1")))
    out["dynamic"] = run_to_trace(pair, PROMPT, sampled, root / "trees" / "dynamic.jsonl",
                                  RunMode(tree=parse_tree("dynamic:top_k=3,depth=3,nodes=8")))
    out["chain3"] = run_to_trace(pair, PROMPT, greedy, root / "traces" / "chain-k3.jsonl")
    out["chain2"] = run_to_trace(pair, PROMPT, SpecSettings(k=2, temperature=0.0, max_new_tokens=40),
                                 root / "traces" / "chain-k2.jsonl")
    other = tiny_pair(0)  # another draft (and target): not the tree's pair
    out["other_pair"] = run_to_trace(other, PROMPT, SpecSettings(k=3, temperature=0.0, max_new_tokens=12),
                                     root / "other" / "other-pair.jsonl")
    out["other_prompt"] = run_to_trace(pair, "the dog ran", SpecSettings(k=3, temperature=0.0, max_new_tokens=12),
                                       root / "other" / "other-prompt.jsonl")
    return out


# ---------------------------------------------------------------- counted by hand

def hand_trace() -> Trace:
    """Three hand-built cycles (tests/tree_records.py, /work/tree-contract.md), depth 3:
    0: small tree, path 'sat' (2nd child of the root) → 'on' (1st child of 'sat'), residual;
    1: two nodes, path root → '<script>' (1st) → '<img>' (1st), a leaf: bonus;
    2: one child of the root, rejected (u 0.9 >= p 0.1): empty path, residual."""
    cycles, committed = [], 2
    for i, (nodes, us, word) in enumerate([(small_tree(), [0.5, 0.1, 0.2, 0.9], "mat"),
                                           (hostile_tree(), [0.1, 0.1], "far"),
                                           ([Node("dog", ROOT, 0.5, 0.1)], [0.9], "cat")]):
        cycles.append(tree_cycle(i, committed, nodes, us, word))
        committed += len(cycles[-1]["committed_token_ids"])
    return Trace(tree_header(3), cycles, None)


def test_tree_stats_on_hand_built_cycles():
    trace = hand_trace()
    assert [c["tree"]["path"] for c in trace.cycles] == [[1, 3], [0, 1], []]  # the walks as the docstring says
    ts = tree_stats(trace)
    assert ts.num_cycles == 3 and (ts.nodes_mean, ts.nodes_min, ts.nodes_max) == (3.0, 1, 6)  # 6, 2 and 1 nodes
    assert ts.tokens_per_cycle == pytest.approx(1 + 4 / 3)  # paths of 2, 2, 0 nodes, each + 1
    assert ts.tokens_per_cycle_counts == [1, 0, 2, 0]  # n = 1, 2, 3, 4 tokens
    assert ts.acceptance_by_depth == pytest.approx([2 / 3, 2 / 3, 0.0])
    assert ts.acceptance_rate == pytest.approx(4 / 9)  # 4 accepted of 6 + 2 + 1 nodes
    assert (ts.bonus_cycles, ts.residual_cycles) == (1, 2)
    assert ts.rank_counts == [3, 1]  # 'on', '<script>', '<img>' first children; 'sat' the second
    assert ts.saved_cycles == 1  # only cycle 0 took a later sibling
    # the builder's draft forwards: one per depth it feeds (the deepest is never fed): 3, 2 and 1
    assert ts.draft_forwards == pytest.approx(2.0)
    assert [(w.width, w.cycles, w.verify_s.median) for w in ts.verify_by_width] == [(2, 1, 0.02), (3, 1, 0.02),
                                                                                    (7, 1, 0.02)]
    # cycle times 0.004 x forwards + 0.025: 0.037, 0.033, 0.029 s; 3 + 3 + 1 tokens committed
    assert ts.cycle_s.median == pytest.approx(0.033)
    assert ts.tokens_per_s == pytest.approx((7 / 3) / 0.033)
    assert ts.tokens_per_s == pytest.approx(decoding_tokens_per_s(trace.cycles))  # the project's one tokens/s


def test_tree_stats_refuses_a_chain_trace(runs):
    with pytest.raises(ValueError, match="not a tree trace"):
        tree_stats(runs["chain3"])


# ---------------------------------------------------------------- recounted from real runs

def depth_reached(c: dict) -> int:
    """The deepest node on the accepted path, read from the nodes' own depth fields."""
    nodes = c["tree"]["nodes"]
    return max((nodes[p]["depth"] for p in c["tree"]["path"]), default=0)


def ranks_from_walk(c: dict) -> list[int]:
    """Each accepted child's rank: how many of its parent's children the walk tried up to and including it."""
    nodes, ranks, tried_here = c["tree"]["nodes"], [], {}
    for t in c["tree"]["tried"]:
        parent = nodes[t["node"]]["parent"]
        tried_here[parent] = tried_here.get(parent, 0) + 1
        if t["accepted"]:
            ranks.append(tried_here[parent])
    return ranks


@pytest.mark.parametrize("name", ["static", "dynamic"])
def test_tree_stats_equal_a_recount_of_the_records(runs, name):
    trace = runs[name]
    ts, cycles, depth = tree_stats(trace), trace.cycles, trace.k
    reached = [depth_reached(c) for c in cycles]
    assert max(reached) >= 2 and min(reached) == 0  # a run that exercises several depths
    assert ts.acceptance_by_depth == [sum(r >= d for r in reached) / len(cycles) for d in range(1, depth + 1)]
    assert ts.tokens_per_cycle_counts == [reached.count(n - 1) for n in range(1, depth + 2)]
    assert ts.tokens_per_cycle == pytest.approx(statistics.mean(r + 1 for r in reached))
    ranks = [r for c in cycles for r in ranks_from_walk(c)]
    assert ts.rank_counts == [ranks.count(r) for r in range(1, max(ranks) + 1)]
    assert ts.saved_cycles == sum(any(r > 1 for r in ranks_from_walk(c)) for c in cycles) > 0  # siblings did save some
    assert ts.bonus_cycles == sum(c["tree"]["residual_top"] is None for c in cycles)
    assert ts.bonus_cycles + ts.residual_cycles == len(cycles)
    sizes = [len(c["tree"]["nodes"]) for c in cycles]
    assert (ts.nodes_min, ts.nodes_max) == (min(sizes), max(sizes))
    assert ts.nodes_mean == pytest.approx(statistics.mean(sizes))
    assert ts.draft_forwards == pytest.approx(statistics.mean(len(c["draft_step_times_s"]) for c in cycles))
    by_width = {}
    for c in cycles:
        by_width.setdefault(len(c["tree"]["nodes"]) + 1, []).append(c["verify_time_s"])
    assert [(w.width, w.cycles, w.verify_s.median) for w in ts.verify_by_width] == \
        [(w, len(v), statistics.median(v)) for w, v in sorted(by_width.items())]
    committed = sum(len(c["committed_token_ids"]) for c in cycles)
    assert ts.tokens_per_s == pytest.approx(committed / len(cycles) / statistics.median(c["cycle_time_s"] for c in cycles))


# ---------------------------------------------------------------- chain against tree

def test_compare_a_chain_and_a_tree_of_one_pair(runs):
    chain, tree = runs["chain3"], runs["static"]
    cmp = compare_chain_tree(chain, tree)
    chain_tokens = 1 + statistics.mean(c["num_accepted"] for c in chain.cycles)
    tree_tokens = 1 + statistics.mean(len(c["tree"]["path"]) for c in tree.cycles)
    assert (cmp.chain.tokens_per_cycle, cmp.tree.tokens_per_cycle) == (pytest.approx(chain_tokens), pytest.approx(tree_tokens))
    assert cmp.tokens_ratio == pytest.approx(tree_tokens / chain_tokens)
    assert cmp.speedup == pytest.approx(decoding_tokens_per_s(tree.cycles) / decoding_tokens_per_s(chain.cycles))
    assert cmp.chain.acceptance == pytest.approx(chain.summary["per_position_acceptance"])  # the run's own summary
    assert cmp.tree.acceptance == tree_stats(tree).acceptance_by_depth
    assert (cmp.chain.draft_forwards, cmp.tree.draft_forwards) == (3, 3)  # K = 3 and a tree of depth 3
    assert (cmp.chain.verify_width, cmp.tree.verify_width) == (4, 16)  # K+1; the root and 3 + 6 + 6 nodes
    assert cmp.chain.verify_s.median == statistics.median(c["verify_time_s"] for c in chain.cycles)
    assert cmp.fair and cmp.fairness.startswith("Fair: both spend 3 draft forwards per cycle")
    assert cmp.notes == []
    assert cmp.target == "tiny-target" and cmp.draft == "tiny-noisy-draft"
    unfair = compare_chain_tree(runs["chain2"], tree)
    assert not unfair.fair and "chain spends 2 draft forwards per cycle and the tree 3" in unfair.fairness
    sampled = compare_chain_tree(chain, runs["dynamic"])
    assert sampled.notes == ["temperature differs: 0.0 in the chain, 1.0 in the tree"]


def with_header(trace: Trace, **changes) -> Trace:
    return dataclasses.replace(trace, header={**trace.header, **changes})


def test_compare_refuses_another_pair_or_prompt(runs):
    tree, chain = runs["static"], runs["chain3"]
    with pytest.raises(ValueError, match=r"the draft models differ \('tiny-draft' in the chain, 'tiny-noisy-draft'"):
        compare_chain_tree(runs["other_pair"], tree)
    with pytest.raises(ValueError, match=r"the prompts differ \('the dog ran' in the chain, 'the cat sat' in the tree\)"):
        compare_chain_tree(runs["other_prompt"], tree)
    bigger = with_header(chain, target={**chain.header["target"], "parameters": 1})
    with pytest.raises(ValueError, match="target models share the name 'tiny-target' but differ in parameters"):
        compare_chain_tree(bigger, tree)
    renamed = with_header(chain, target={**chain.header["target"], "name": "another-target"})
    with pytest.raises(ValueError, match="target models differ"):
        compare_chain_tree(renamed, tree)
    retokenised = with_header(chain, prompt_token_ids=chain.header["prompt_token_ids"] + [1])
    with pytest.raises(ValueError, match="prompts' tokens differ"):
        compare_chain_tree(retokenised, tree)
    with pytest.raises(ValueError, match="needs a chain trace, then a tree trace"):
        compare_chain_tree(tree, chain)  # swapped
    with pytest.raises(ValueError, match="the chain trace has no cycles"):
        compare_chain_tree(dataclasses.replace(chain, cycles=[]), tree)
    assert compare_chain_tree(chain, tree).fair  # the unchanged pair still compares


# ---------------------------------------------------------------- the figures draw the stats

def bars(fig) -> list:
    return [t for t in fig.data if t.type == "bar"]


def test_figures_show_the_stats(runs):
    tree = runs["static"]
    ts, cmp = tree_stats(tree), compare_chain_tree(runs["chain3"], tree)
    tree_bars, chain_bars = bars(figs.acceptance_depth_figure(ts, cmp))
    assert list(tree_bars.y) == ts.acceptance_by_depth and list(chain_bars.y) == cmp.chain.acceptance
    assert list(tree_bars.x) == [1, 2, 3] and "by depth" in tree_bars.name and "by position" in chain_bars.name
    (alone,) = bars(figs.acceptance_depth_figure(ts))
    assert list(alone.y) == ts.acceptance_by_depth
    tree_tok, chain_tok = bars(figs.tokens_distribution_figure(ts, cmp))
    assert list(tree_tok.customdata) == ts.tokens_per_cycle_counts
    assert list(tree_tok.y) == pytest.approx([n / ts.num_cycles for n in ts.tokens_per_cycle_counts])
    assert list(chain_tok.customdata) == cmp.chain.tokens_per_cycle_counts
    # the decimals of the page's headline, metric and comparison table (1.81 beside 1.815 read as two values)
    assert f"mean {ts.tokens_per_cycle:.3f})" in tree_tok.name
    assert f"mean {cmp.chain.tokens_per_cycle:.3f})" in chain_tok.name
    tree_pts, chain_pt = figs.verify_width_figure(ts, cmp).data
    assert list(tree_pts.x) == [w.width for w in ts.verify_by_width]
    assert list(tree_pts.y) == pytest.approx([w.verify_s.median * 1000 for w in ts.verify_by_width])
    assert (chain_pt.x[0], chain_pt.y[0]) == (4, pytest.approx(cmp.chain.verify_s.median * 1000))
    (ranks,) = bars(figs.sibling_rank_figure(ts))
    assert list(ranks.y) == ts.rank_counts and list(ranks.x) == list(range(1, len(ts.rank_counts) + 1))


def strings_in(obj) -> list[str]:
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in strings_in(v)]
    if isinstance(obj, list):
        return [s for v in obj for s in strings_in(v)]
    return []


def test_figures_escape_run_labels(runs):
    tree = runs["static"]
    ts, cmp = tree_stats(tree), compare_chain_tree(runs["chain3"], tree)
    hostile = dataclasses.replace(cmp, chain=dataclasses.replace(cmp.chain, label="<script>alert(1)</script>"))
    for make in (figs.acceptance_depth_figure, figs.tokens_distribution_figure, figs.verify_width_figure):
        texts = strings_in(json.loads(make(ts, hostile).to_json()))
        assert not [t for t in texts if "<script" in t] and [t for t in texts if "&lt;script&gt;" in t]


# ---------------------------------------------------------------- `engine stats`

def test_format_stats_of_a_tree_trace(runs):
    trace = runs["dynamic"]
    ts = tree_stats(trace)
    text = format_stats(trace)
    assert text.startswith("TREE: tree dynamic:top_k=3,depth=3,nodes=8   max depth 3")
    assert "acceptance by depth: " + " ".join(f"{d}: {p:.3f}" for d, p in enumerate(ts.acceptance_by_depth, 1)) in text
    assert f"cycles saved by a later sibling: {ts.saved_cycles} of {ts.num_cycles}" in text
    assert f"next token: bonus {ts.bonus_cycles} " in text
    assert f"decoding tokens/s: {ts.tokens_per_s:.1f}" in text
    for w in ts.verify_by_width:
        assert f"{w.width:>3} positions: {w.verify_s.median * 1000:.2f} ms" in text
    assert "KV-CACHE LAYOUT: dynamic" in text and "ACCEPTANCE (vLLM V1" not in text  # no chain section
    assert "DRAFTER:" in format_stats(runs["chain3"])  # a chain trace still gets the chain's report


def test_engine_stats_command_prints_the_tree_lines(runs):
    path = runs["root"] / "trees" / "dynamic.jsonl"
    out = subprocess.run([sys.executable, "-m", "engine", "stats", str(path)], capture_output=True, text=True,
                         cwd=ROOT_DIR, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "TREE: tree dynamic:top_k=3,depth=3,nodes=8" in out.stdout and "acceptance by depth: 1: " in out.stdout
    assert "cycles saved by a later sibling" in out.stdout


# ---------------------------------------------------------------- the statistics page (AppTest)

def open_tree(runs, monkeypatch, traces: Path, name: str = "static", tab: str | None = None) -> AppTest:
    """The statistics page with a tree run open: the parsed Trace is put into the session the way
    state.set_current leaves it, without going through the file loader.
    The key is this run's own: the pages' caches are per process and keyed by it."""
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(traces))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(runs["root"] / "no-runs"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    at = AppTest.from_file(MAIN, default_timeout=120)
    opened = {"_opened": True, state.REF: state.TraceRef("bundled", f"tree-{name}.jsonl"), state.TRACE: runs[name],
              state.TRACE_KEY: f"test-tree-stats-{name}-{runs['root'].name}", state.CYCLE: 0, state.STAGE: 1}
    for key, value in opened.items():
        at.session_state[key] = value
    if tab:
        at.session_state[statistics_tree.TAB] = tab
    at.run()
    at.switch_page(PAGE).run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def chart_ids(at: AppTest) -> list[str]:
    return [c.proto.id.rsplit("-", 1)[-1] for c in at.get("plotly_chart")]


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_page_shows_a_tree_traces_statistics(runs, monkeypatch):
    ts = tree_stats(runs["static"])
    at = open_tree(runs, monkeypatch, runs["root"] / "traces")
    m = metrics(at)
    assert m["Tokens per cycle"] == f"{ts.tokens_per_cycle:.3f}"  # the headline's figure, at the same decimals
    assert at.markdown[0].value.startswith(f"This tree run: **{m['Tokens per cycle']}** tokens per cycle")
    assert m["Cycles saved by a later sibling"] == f"{ts.saved_cycles} of {ts.num_cycles}"
    assert {"tree_fig_depth", "tree_fig_tokens", "tree_fig_ranks"} <= set(chart_ids(at))
    at.session_state[statistics_tree.TAB] = "Cost"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert metrics(at)["Tokens/s (decoding)"] == f"{ts.tokens_per_s:.1f}"
    assert "tree_fig_verify" in chart_ids(at)


def test_page_compares_the_tree_with_a_chain_of_its_pair(runs, monkeypatch):
    traces = runs["root"] / "traces"  # chain-k2 and chain-k3 of the tree's pair
    other = runs["root"] / "other" / "other-pair.jsonl"
    (traces / "zz-other-pair.jsonl").write_bytes(other.read_bytes())  # a chain of another pair: not offered
    try:
        at = open_tree(runs, monkeypatch, traces, tab="Compare with a chain")
        (box,) = at.selectbox
        assert [o for o in box.options] == ["example: chain-k2.jsonl", "example: chain-k3.jsonl"]
        box.select_index(1).run()
        assert not at.exception, [e.value for e in at.exception]
        cmp = compare_chain_tree(runs["chain3"], runs["static"])
        assert metrics(at)["Measured speedup of the tree over the chain"] == f"{cmp.speedup:.2f}×"
        assert [s.value for s in at.success] == [md(cmp.fairness)]  # cmp.fairness: 'Fair: both spend 3 ...'
        assert cmp.fair
        table = at.dataframe[0].value
        assert list(table["tree / chain"])[0] == f"{cmp.tokens_ratio:.2f}×"  # tokens per cycle, the first row
        assert {"tree_fig_compare_depth", "tree_fig_compare_tokens", "tree_fig_compare_verify"} <= set(chart_ids(at))
        (why,) = [e for e in at.expander if "not offered" in e.label]
        reason = "; ".join(pair_differences(runs["other_pair"].header, runs["static"].header))
        assert reason.startswith("the draft models differ")
        assert why.markdown[0].value == f"- {md('example: zz-other-pair.jsonl')}: {md(reason)}"  # escaped as shown
    finally:
        (traces / "zz-other-pair.jsonl").unlink()


def test_page_says_when_no_chain_matches(runs, monkeypatch):
    lonely = runs["root"] / "lonely"
    lonely.mkdir(exist_ok=True)
    (lonely / "other-prompt.jsonl").write_bytes((runs["root"] / "other" / "other-prompt.jsonl").read_bytes())
    at = open_tree(runs, monkeypatch, lonely, name="dynamic", tab="Compare with a chain")
    assert not at.selectbox
    assert any(i.value.startswith("None of the 1 other traces here is a chain run of this pair") for i in at.info)
    assert not [c for c in chart_ids(at) if c.startswith("tree_fig_compare")]


def test_an_uploaded_chain_is_checked_against_the_trees_pair(runs, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECLAB_UPLOADS_DIR", str(tmp_path / "uploads"))
    tree = runs["static"]
    good = (runs["root"] / "traces" / "chain-k3.jsonl").read_bytes()
    ref, why = statistics_tree.check_upload(tree, "mine.jsonl", good, "abc123")
    assert why is None and ref == state.TraceRef("upload", "abc123.jsonl") and ref.path.read_bytes() == good
    bad = (runs["root"] / "other" / "other-pair.jsonl").read_bytes()
    ref, why = statistics_tree.check_upload(tree, "theirs.jsonl", bad, "def456")
    assert ref is None and "draft models differ" in why and not (tmp_path / "uploads" / "def456.jsonl").exists()
    ref, why = statistics_tree.check_upload(tree, "junk.jsonl", b'{"type": "cycle"}\n{}\n', "0")
    assert ref is None and why == "junk.jsonl line 1: the first record must be the header"  # the loader's words


def test_prometheus_counts_a_trees_nodes_as_its_draft_tokens(runs):
    """`engine stats --prometheus` on a tree trace: vLLM's draft-token counter holds the drafted nodes."""
    from engine.servers.export import prometheus_text
    trace = runs["static"]
    text = prometheus_text(trace)
    nodes = sum(len(c["tree"]["nodes"]) for c in trace.cycles)
    assert f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="tiny-target"}} {float(nodes)}' in text
    accepted = sum(len(c["tree"]["path"]) for c in trace.cycles)
    assert f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="tiny-target"}} {float(accepted)}' in text


def test_chain_page_compares_with_a_bundled_tree_trace(runs, monkeypatch):
    """A chain trace open, a tree trace of its pair among the bundled ones: Compare two traces shows the
    tree view's comparison, this trace as the chain."""
    traces = runs["root"] / "with-tree"
    traces.mkdir(exist_ok=True)
    for name, folder in (("chain-k3.jsonl", "traces"), ("static.jsonl", "trees")):
        (traces / name).write_bytes((runs["root"] / folder / name).read_bytes())
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(traces))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(runs["root"] / "no-runs"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.query_params["trace"] = "bundled:chain-k3.jsonl"
    at.run()
    at.switch_page(PAGE).run()
    at.session_state["stats_tab"] = "Compare two traces"
    at.session_state["compare_with"] = state.TraceRef("bundled", "static.jsonl")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    cmp = compare_chain_tree(runs["chain3"], runs["static"])
    assert metrics(at)["Measured speedup of the tree over the chain"] == f"{cmp.speedup:.2f}×"
    assert "tree_fig_compare_depth" in chart_ids(at)
