"""The fast path's last cycle: a full accept that EOS or the token budget cuts short.

The fast path feeds the draft d_K in every cycle, but its record's `draft_catch_up` says what the
reference path's catch-up would do: the draft needed d_K only when all K+1 tokens were committed.
A last cycle that accepts every draft and is then cut by --max-new-tokens commits at most K tokens,
which the draft's K steps already cover, so there is no catch-up (the reference path records false
and load_trace requires it). The fast path used to record true there, and its trace was refused.
"""
import pytest

from engine.cli import main
from engine.config import SpecSettings
from engine.mode import RunMode
from engine.run import run_to_trace
from engine.trace import load_trace
from tests.tiny import noisy_pair, save_tiny

PROMPT = "the cat sat on the"
TIMING = {"draft_time_s", "draft_step_times_s", "verify_time_s", "catch_up_time_s", "cycle_time_s"}


def comparable(rec: dict) -> dict:
    """The fields both paths must agree on: everything but the timings."""
    return {k: v for k, v in rec.items() if k not in TIMING}


def full_accept_cut(rec: dict, k: int) -> bool:
    """All K drafts accepted, yet fewer than K+1 tokens committed: the budget (or EOS) cut the cycle."""
    return rec["num_accepted"] == k and len(rec["committed_token_ids"]) < k + 1


@pytest.fixture(scope="module")
def pair():
    return noisy_pair()


def test_cli_fast_run_whose_last_full_accept_is_cut_by_the_budget_loads(tmp_path):
    """The reported run: K 3, 24 new tokens, greedy, on the CPU."""
    target, draft = save_tiny(noisy_pair(), tmp_path / "models")
    args = ["run", "--prompt", PROMPT, "--target", target, "--draft", draft, "--k", "3", "--max-new-tokens", "24",
            "--temperature", "0", "--device", "cpu"]
    assert main(args + ["--fast", "--out", str(tmp_path / "fast.jsonl")]) == 0
    assert main(args + ["--cache", "static", "--out", str(tmp_path / "ref.jsonl")]) == 0
    fast, ref = load_trace(tmp_path / "fast.jsonl"), load_trace(tmp_path / "ref.jsonl")  # refused before the fix
    assert fast.header["fast_path"] == {"capture": "none"}
    last = fast.cycles[-1]
    assert last["finished"] and full_accept_cut(last, 3)  # the case under test really happened
    assert last["draft_catch_up"] is False and ref.cycles[-1]["draft_catch_up"] is False
    assert last["draft_cache_len"]["after_rollback"] <= last["draft_cache_len"]["after_append"]
    assert [comparable(c) for c in fast.cycles] == [comparable(c) for c in ref.cycles]
    assert fast.summary["generated_token_ids"] == ref.summary["generated_token_ids"]
    assert fast.summary["stop_reason"] == ref.summary["stop_reason"]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_last_cycle_records_what_the_reference_path_records(pair, tmp_path, temperature):
    """Budgets that end the run at every point of a cycle, full accepts among them: both traces load,
    and the fast path's cycles equal the reference path's (draft_catch_up included)."""
    k, seen_cut, seen_whole = 3, 0, 0
    for budget in range(14, 27):
        s = SpecSettings(k=k, temperature=temperature, max_new_tokens=budget, seed=5, cache_layout="static")
        paths = tmp_path / f"fast-{budget}.jsonl", tmp_path / f"ref-{budget}.jsonl"
        run_to_trace(pair, PROMPT, s, paths[0], RunMode(fast="none"))
        run_to_trace(pair, PROMPT, s, paths[1])
        fast, ref = load_trace(paths[0]), load_trace(paths[1])  # both checked as a reader would
        assert [comparable(c) for c in fast.cycles] == [comparable(c) for c in ref.cycles], budget
        assert fast.summary["generated_token_ids"] == ref.summary["generated_token_ids"]
        last = fast.cycles[-1]
        if full_accept_cut(last, k):
            seen_cut += 1
            assert not last["draft_catch_up"]
        elif last["num_accepted"] == k:  # a full accept whose bonus token fits the budget: d_K was needed
            seen_whole += 1
            assert last["draft_catch_up"]
    assert seen_cut and seen_whole  # the budgets covered both kinds of last full accept


def test_a_full_accept_cut_at_eos_records_no_catch_up(tmp_path):
    """The same cut made by EOS among the drafts (seed 10 draws d3 = EOS with all three accepted)."""
    pair = noisy_pair(0, noise=0.3, eos=True)
    s = SpecSettings(k=3, temperature=1.0, max_new_tokens=40, seed=10, cache_layout="static")
    paths = tmp_path / "fast.jsonl", tmp_path / "ref.jsonl"
    run_to_trace(pair, "the cat", s, paths[0], RunMode(fast="none"))
    run_to_trace(pair, "the cat", s, paths[1])
    fast, ref = load_trace(paths[0]), load_trace(paths[1])
    last = fast.cycles[-1]
    assert fast.summary["stop_reason"] == "eos" and full_accept_cut(last, 3)
    assert not last["draft_catch_up"]
    assert [comparable(c) for c in fast.cycles] == [comparable(c) for c in ref.cycles]
