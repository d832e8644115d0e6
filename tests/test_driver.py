"""The one cycle driver and the one run mode: every cycle kind runs through them.

What each kind computes is tested in its own files (test_engine.py, test_fast_path.py,
test_tree_engine.py); here: that every kind can run untraced and commits the same tokens,
that one record builder gives a tree record the chain's fields, that the empty prompt is
refused one way, that the run mode refuses each impossible combination in one place (a batch's
too), and that the engine has one loop that runs cycles.
"""
import ast
from dataclasses import asdict
from pathlib import Path

import pytest

from engine.batch.cycle import BatchedChainCycle
from engine.config import EMPTY_PROMPT, SettingsError, SpecSettings, parse_tree, refuse_empty_prompt
from engine.cycle import driver
from engine.cycle.fast import FastChainCycle, static_settings
from engine.cycle.reference import ChainCycle
from engine.cycle.trace_record import TREE_HEAD
from engine.mode import RunMode, refuse_tree_auto
from engine.teaching.faults import Faults, TreeFaults
from engine.trace.format import CYCLE_FIELDS
from engine.tree.cycle import TreeCycle
from tests.test_kv_layouts import PROMPT
from tests.tiny import noisy_pair

SPEC = parse_tree("dynamic:top_k=2,depth=3,nodes=6")


def kinds(pair, temperature: float):
    s = SpecSettings(k=3, temperature=temperature, max_new_tokens=24, seed=4)
    return {"chain": ChainCycle(pair, s), "fast": FastChainCycle(pair, static_settings(s)),
            "tree": TreeCycle(pair, s, SPEC)}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_kind_runs_untraced_and_commits_what_a_traced_run_commits(temperature):
    pair = noisy_pair(2, noise=0.08)
    for name, kind in kinds(pair, temperature).items():
        traced = list(driver.generate(kind, PROMPT))
        untraced = list(driver.generate(kind, PROMPT, record=False))
        assert [r["committed_token_ids"] for r in untraced] == [r["committed_token_ids"] for r in traced], name
        assert all("committed_token_texts" not in r and "tree" not in r for r in untraced), name
        assert all("committed_token_texts" in r for r in traced), name


def test_a_tree_record_is_the_chain_record_with_its_tree():
    pair = noisy_pair(2, noise=0.08)
    chain = next(driver.generate(kinds(pair, 1.0)["chain"], PROMPT))
    tree = next(driver.generate(kinds(pair, 1.0)["tree"], PROMPT))
    shared = {"type", "cycle", "committed_len_before", "num_accepted", "committed_token_ids",
              "committed_token_texts", "finished", "next_token_text", "target_cache_len", "draft_cache_len",
              "draft_catch_up", "verify_positions", "draft_time_s", "draft_step_times_s", "verify_time_s",
              "catch_up_time_s", "cycle_time_s"}
    assert shared <= set(chain) and shared <= set(CYCLE_FIELDS)
    assert set(tree) == shared | {"tree"}
    assert tree["verify_positions"] == len(tree["tree"]["nodes"]) + 1
    assert list(tree)[:len(TREE_HEAD)] == list(TREE_HEAD)  # the key order tree traces have always had


def test_the_empty_prompt_is_refused_one_way_by_every_kind():
    for prompt in ("", " \n\t", []):
        with pytest.raises(SettingsError) as refused:
            refuse_empty_prompt(prompt)
        assert str(refused.value) == EMPTY_PROMPT
    for name, kind in kinds(noisy_pair(0), 0.0).items():
        with pytest.raises(SettingsError, match="the prompt is empty") as refused:
            driver.start(kind, [])
        assert str(refused.value) == EMPTY_PROMPT, name
    refuse_empty_prompt("x")  # a prompt with text passes


@pytest.mark.parametrize(("mode", "words"), [
    (dict(tree=SPEC, fast="none"), "--tree does not run with --fast yet"),
    (dict(tree=SPEC, faults=Faults(keep_rejected_kv=True)), "--tree does not run with a teaching fault yet"),
    (dict(tree=SPEC, calibrate=True), "--tree does not run with calibration yet"),
    (dict(tree=SPEC, tp_size=2), "--tree does not run with --tp yet"),
    (dict(faults=TreeFaults(crop_instead_of_compact=True)), "tree faults break a tree's rollback"),
    (dict(fast="none", faults=Faults(acceptance_rule="token_match")), "teaching faults need the reference path"),
    (dict(fast="none", tp_size=2), "under --tp use the normal path"),
    (dict(fast="warp"), "unknown capture mode 'warp'"),
    (dict(batch=0), "--batch must be an integer from 1 to"),
    (dict(batch=True), "--batch must be an integer from 1 to"),
    (dict(batch=2, tree=SPEC), "--batch does not run with --tree"),
    (dict(batch=2, fast="none"), "--batch does not run with --fast"),
    (dict(batch=2, calibrate=True), "--batch does not run with --calibrate"),
    (dict(batch=2, faults=Faults(keep_rejected_kv=True)), "--batch does not run with a teaching fault"),
    (dict(batch=2, tp_size=2), "--batch does not run with --tp"),
])
def test_the_run_mode_refuses_each_impossible_combination(mode, words):
    with pytest.raises(SettingsError, match=words):
        RunMode(**mode)


def test_the_run_mode_accepts_what_can_run_and_picks_its_kind():
    pair = noisy_pair(0)
    s = SpecSettings(k=4, temperature=0.0)
    assert isinstance(RunMode().cycle_kind(pair, s), ChainCycle)
    assert isinstance(RunMode(fast="none").cycle_kind(pair, s), FastChainCycle)
    tree = RunMode(tree=SPEC, faults=TreeFaults(crop_instead_of_compact=True))
    assert isinstance(tree.cycle_kind(pair, s), TreeCycle)
    assert tree.settings_for(s).k == SPEC.max_depth
    assert RunMode(fast="none").settings_for(s).cache_layout == "static"
    assert RunMode(faults=Faults(keep_rejected_kv=True)).header_fields({}) == {"faults": asdict(Faults(keep_rejected_kv=True))}
    with pytest.raises(SettingsError, match="--tree auto measures on its own"):
        refuse_tree_auto("model", fast=True, calibrate=False)


@pytest.mark.parametrize(("call", "words"), [
    (lambda m: m.check_drafter("prompt-lookup"), "the prompt-lookup drafter proposes for one"),
    (lambda m: m.check_drafter("eagle"), "the eagle drafter proposes for one"),
    (lambda m: m.check_drafter("other-tokenizer"), "the other-tokenizer drafter proposes for one"),
    (lambda m: m.check_drafter("model", decoder="own"), "--batch does not run with --decoder own"),
    (lambda m: m.check_drafter("model", mis_set=True), "--batch does not run with --draft-prompt"),
    (lambda m: m.check_batch_settings(SpecSettings(), resume=True), "--batch does not run with --resume"),
    (lambda m: m.check_batch_settings(SpecSettings(cache_layout="paged")), "--batch does not run with --cache paged"),
    (lambda m: m.check_batch_settings(SpecSettings(cache_layout="static")), "--batch does not run with --cache static"),
])
def test_the_run_mode_refuses_what_a_batch_cannot_run(call, words):
    with pytest.raises(SettingsError, match=words):
        call(RunMode(batch=2))
    call(RunMode())  # the same is no refusal without a batch


def test_a_batch_mode_picks_the_batched_kind_over_static_rows():
    pair, s = noisy_pair(0), SpecSettings(k=2)
    mode = RunMode(batch=3)
    mode.check_drafter("model")
    mode.check_batch_settings(s)
    assert isinstance(mode.cycle_kind(pair, s), BatchedChainCycle)
    assert mode.settings_for(s).cache_layout == "static" and mode.header_fields({}) == {}


def test_a_drafter_batches_exactly_when_its_class_proposes_for_rows():
    from engine.drafters.registry import DRAFTERS
    assert any(spec.batches for spec in DRAFTERS.values())
    for kind, spec in DRAFTERS.items():
        assert spec.batches == hasattr(spec.cls, "propose_rows"), kind


def calls_a_cycle(loop: ast.While) -> bool:
    """Does the loop's body call something that runs a cycle: a kind's `step` method, or a function named for
    cycles? (Plain decoding's loop calls a plain function `step`: one target forward, no cycle.)"""
    for node in ast.walk(loop):
        if isinstance(node, ast.Call):
            method = isinstance(node.func, ast.Attribute)
            name = node.func.attr if method else getattr(node.func, "id", "")
            if (method and name == "step") or "cycle" in name.lower():
                return True
    return False


def test_one_loop_in_the_engine_runs_cycles():
    """Every cycle kind, the batch included, runs in the driver's loop: no other module loops over cycles."""
    root = Path(__file__).resolve().parent.parent / "engine"
    loops = [(path.relative_to(root).as_posix(), node.lineno) for path in sorted(root.rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.While) and calls_a_cycle(node)]
    assert [path for path, _ in loops] == ["cycle/driver.py"], loops


def test_the_loop_check_sees_a_second_loop():
    second = ast.parse("while not done:\n    run_batch_cycle(state)\n").body[0]
    stepping = ast.parse("while not all(finished):\n    kind.step(state, gens)\n").body[0]
    plain = ast.parse("while len(out) < n:\n    last = step(last)\n").body[0]
    assert calls_a_cycle(second) and calls_a_cycle(stepping) and not calls_a_cycle(plain)
