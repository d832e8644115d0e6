"""The one cycle driver and the one run mode: every cycle kind runs through them.

What each kind computes is tested in its own files (test_engine.py, test_fast_path.py,
test_tree_engine.py); here: that every kind can run untraced and commits the same tokens,
that one record builder gives a tree record the chain's fields, that the empty prompt is
refused one way, and that the run mode refuses each impossible combination in one place.
"""
from dataclasses import asdict

import pytest

from engine.config import EMPTY_PROMPT, SettingsError, SpecSettings, parse_tree, refuse_empty_prompt
from engine.cycle import driver
from engine.cycle.fast import FastChainCycle, static_settings
from engine.cycle.record import TREE_HEAD
from engine.cycle.reference import ChainCycle
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
