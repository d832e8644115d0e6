"""Cropping after a tree (the teaching fault) breaks both caches once a path leaves the first branch;
compacting never does. Real tiny models; the rollback page shows the stored comparison (AppTest)."""
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest

from app.figures.tree_rollback import output_html, tree_cache_figure
from engine.config import SettingsError, SpecSettings, parse_tree
from engine.kv.ops import prefill
from engine.mode import RunMode
from engine.run import run_to_trace
from engine.teaching.faults import TreeFaults
from engine.teaching.runs import first_divergence
from engine.teaching.tree_rollback import (
    CORRECT,
    CROP,
    check_against_fresh_prefill,
    compare_tree_runs,
    left_first_branch,
)
from engine.trace import TraceError, loads_trace
from engine.tree.cycle import path_slots
from tests.tiny import noisy_pair

PROMPT = [1, 2, 4, 6, 7]
TREE = parse_tree("static:3,2,1")
MAIN = str(Path(__file__).resolve().parent.parent / "app" / "main.py")


@pytest.fixture(scope="module")
def pair():
    # Close draft: paths of two and three nodes are accepted often, so paths leave the first branch
    # from cycle 1 on, and at T=0 the cropped run's output departs from greedy's at token 8.
    return noisy_pair(1, noise=0.03)


@pytest.fixture(scope="module")
def greedy(pair):
    return compare_tree_runs(pair, PROMPT, SpecSettings(temperature=0.0, max_new_tokens=24), TREE)


@pytest.fixture(scope="module")
def sampled(pair):
    return compare_tree_runs(pair, PROMPT, SpecSettings(temperature=1.0, max_new_tokens=24, seed=3), TREE)


def test_left_first_branch_is_a_compaction_that_moves():
    assert not left_first_branch([], 1) and not left_first_branch([0], 2)  # nothing kept out of place
    assert left_first_branch([1], 2)  # a second sibling: its K/V sits one slot too far
    assert left_first_branch([0, 3], 3)  # node 0's child is node 3 in static:3,2,1, written at L+4
    assert not left_first_branch([0, 3], 2)  # the budget cut the commit before node 3


def test_the_cache_check_counts_the_slots_that_differ(pair):
    committed = PROMPT + [3, 5]
    same = check_against_fresh_prefill(pair.target, prefill(pair.target, committed), committed)
    assert same.matches and same.slots == len(committed) - 1 and same.first_differing is None
    cache = prefill(pair.target, committed)
    with torch.inference_mode():
        cache.layers[1].values[:, 0, 2, 0] += 0.1  # one head, one channel of slot 2 in the last layer
    broken = check_against_fresh_prefill(pair.target, cache, committed)
    assert (broken.slots_differ, broken.first_differing) == (1, 2)
    longer = check_against_fresh_prefill(pair.target, prefill(pair.target, committed), committed[:-1])
    assert longer.slots_differ == 1 and longer.first_differing == len(committed) - 2  # the extra slot


@pytest.mark.parametrize("which", ["greedy", "sampled"])
def test_compaction_keeps_both_caches_equal_to_a_fresh_prefill(which, request):
    run = request.getfixturevalue(which).runs[CORRECT]
    assert run.bites > 0, "no path left the first branch: compaction never had to move anything"
    for c in run.cycles:
        assert c.target.matches and c.draft.matches, c.cycle
        assert c.target.slots == c.draft.slots == c.committed_len - 1


@pytest.mark.parametrize("which", ["greedy", "sampled"])
def test_cropping_breaks_the_caches_from_the_first_bite_on(which, request):
    run = request.getfixturevalue(which).runs[CROP]
    assert run.bites > 0
    first = run.first_bite
    assert all(c.target.matches and c.draft.matches for c in run.cycles[:first])  # until then crop == compaction
    assert all(not c.target.matches for c in run.cycles[first:])  # the wrong K/V stays in the prefix
    assert run.first_target_mismatch == first and run.cycles[first].target.slots_differ >= 1
    assert any(not c.draft.matches for c in run.cycles)  # the draft is cropped too
    assert all(c.target.slots == c.committed_len - 1 for c in run.cycles)  # the lengths are right: only K/V is wrong


def test_correct_greedy_tree_run_is_plain_greedy_and_the_cropped_one_is_not(greedy):
    correct, crop = greedy.runs[CORRECT], greedy.runs[CROP]
    assert correct.generated == greedy.reference
    assert crop.generated != greedy.reference
    assert greedy.first_divergence == first_divergence(crop.generated, greedy.reference) is not None
    # The tokens of the first bitten cycle were chosen before its crop: the output parts ways later.
    committed_by_then = sum(len(c.committed_token_ids) for c in crop.cycles[: crop.first_bite + 1])
    assert greedy.first_divergence >= committed_by_then


def test_a_faulted_tree_trace_is_marked_and_records_what_the_crop_kept(pair, tmp_path):
    s = SpecSettings(temperature=0.0, max_new_tokens=16)
    broken = run_to_trace(pair, "the cat sat on", s, tmp_path / "crop.jsonl",
                          RunMode(tree=TREE, faults=TreeFaults(crop_instead_of_compact=True)))
    correct = run_to_trace(pair, "the cat sat on", s, tmp_path / "compact.jsonl", RunMode(tree=TREE))
    header = json.loads((tmp_path / "crop.jsonl").read_text(encoding="utf-8").split("\n", 1)[0])
    assert header["faults"] == {"crop_instead_of_compact": True} == broken.header["faults"]
    assert "faults" not in correct.header
    for rec in broken.cycles:  # a crop keeps the slots right after the root and moves nothing
        comp, before = rec["tree"]["compaction"]["target"], rec["target_cache_len"]["before"]
        assert comp["moves"] == [] and comp["kept_slots"] == list(range(before, before + len(rec["committed_token_ids"])))
        assert rec["tree"]["compaction"]["draft"]["moves"] == []
    for rec in correct.cycles:  # compaction records the path's slots, as before the fault existed
        comp, before = rec["tree"]["compaction"]["target"], rec["target_cache_len"]["before"]
        assert comp["kept_slots"] == path_slots(before, rec["tree"]["path"], len(rec["committed_token_ids"]))
    assert any(rec["tree"]["compaction"]["target"]["moves"] for rec in correct.cycles)
    text = (tmp_path / "crop.jsonl").read_text(encoding="utf-8")
    assert loads_trace(text).header["faults"] == {"crop_instead_of_compact": True}  # checked against its bug
    undeclared = json.dumps({k: v for k, v in header.items() if k != "faults"}) + "\n" + text.split("\n", 1)[1]
    with pytest.raises(TraceError, match=r"tree.compaction.target.kept_slots': must be .*path node"):
        loads_trace(undeclared)
    loads_trace((tmp_path / "compact.jsonl").read_text(encoding="utf-8"))
    with pytest.raises(SettingsError, match="need a tree spec"):
        run_to_trace(pair, "the cat sat on", s, tmp_path / "chain.jsonl", RunMode(faults=TreeFaults(True)))


# ---------------------------------------------------------------- the rollback page

HOSTILE = "<img src=x onerror=alert(1)>"


def test_the_outputs_and_the_figure_escape_token_text(greedy):
    cmp = replace(greedy, texts={i: HOSTILE for i in greedy.texts})
    page = output_html(cmp.runs[CROP].generated, cmp.texts, cmp.first_divergence, "<b>label</b>")
    assert "<img" not in page and "&lt;img" in page and "&lt;b&gt;label" in page
    assert page.count("outline:") == 1  # the first divergence, and only it, is outlined
    fig = json.loads(tree_cache_figure(cmp).to_json())
    rings = [t for t in fig["data"] if t["marker"].get("symbol") == "circle-open"]
    crop_target_rings = [t for t in rings if t["xaxis"] == "x" and "crops" in t["hovertemplate"]]
    assert [len(t["x"]) for t in crop_target_rings] == [cmp.runs[CROP].bites]


@pytest.fixture
def bundled_pairs_only(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECLAB_TEACHING_PAIR", raising=False)
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(tmp_path / "runs"))


def test_the_rollback_page_shows_the_tree_section_from_the_stored_result(bundled_pairs_only, monkeypatch):
    from app.runs import live

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded: the stored tree result was not used")

    monkeypatch.setattr(live, "load_preset", refuse)
    monkeypatch.setattr(live, "load_pair", refuse)
    at = AppTest.from_file(MAIN, default_timeout=60)
    at.run()
    at.switch_page("views/rollback_demo.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert "After a tree: crop is not enough" in [s.value for s in at.subheader]
    assert sum("Precomputed with the real engine" in c.value for c in at.caption) == 2  # the chain's and the tree's
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Correct engine: wrong caches"] == "0"
    assert metrics["First output token that differs"] != "none"
    assert metrics["Paths off the first branch"].split()[0] != "0"
    assert metrics["Broken cache wrong from"].startswith("cycle ")
    [fig] = [json.loads(e.proto.spec) for e in at.get("plotly_chart") if e.proto.id.endswith("-rb_tree_cache")]
    assert {t["name"] for t in fig["data"]} >= {"correct engine (compacts)", "broken: crops like a chain"}
    outputs = [h.proto.body for h in at.get("html") if "crops like a chain" in h.proto.body]
    assert len(outputs) == 1 and "the first that differs" in outputs[0]
    assert any("it does, token for token" in c.value for c in at.caption)
    at.text_input(key="rb_tree").set_value("static:2,2").run()  # another tree: nothing stored, a button
    assert not at.exception
    assert any("No stored tree result" in i.value for i in at.info)
    at.text_input(key="rb_tree").set_value("chain:3").run()  # a clear one-line error, nothing else breaks
    assert at.error and "must look like" in at.error[0].value and not at.exception


@pytest.fixture(scope="module")
def teaching_folder(tmp_path_factory) -> Path:
    from tests.test_teaching_pages import make_teaching_folder
    return make_teaching_folder(tmp_path_factory.mktemp("tree_fault"))


def test_the_tree_section_runs_live_on_a_pair_with_nothing_stored(teaching_folder, monkeypatch, tmp_path):
    from tests.app_jobs import finish_job
    from tests.test_teaching_pages import open_page
    monkeypatch.setenv("SPECLAB_TEACHING_PAIR", str(teaching_folder / "pair"))
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(teaching_folder / "traces"))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(tmp_path / "runs"))
    at = open_page("rollback")
    assert any("No stored tree result" in i.value for i in at.info)
    at.button(key="rb_tree_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    finish_job(at)
    [(cmp, seconds)] = at.session_state["rb_tree_live"].values()
    assert any(c.value == f"Run live in this session ({seconds:.0f} s)." for c in at.caption)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Paths off the first branch"] == f"{cmp.runs[CROP].bites} of {len(cmp.runs[CROP].cycles)}"
    assert metrics["Correct engine: wrong caches"] == "0"
    assert cmp.tree == TREE.describe() and cmp.settings["k"] == TREE.max_depth
    assert [s for s in chart_ids(at) if s.endswith("-rb_tree_cache")]


def chart_ids(at: AppTest) -> list[str]:
    return [e.proto.id for e in at.get("plotly_chart")]
