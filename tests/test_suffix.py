"""Suffix decoding (engine/drafters/suffix.py, suffix_tree.py): the trees on hand-built sequences, exactness
(greedy equal to the target, sampled by chi-square), the global tree across requests, and its trace checks."""
import copy
import json

import pytest
import torch

import tests.test_exactness as exactness
from engine.cli import main
from engine.config import SettingsError, SpecSettings
from engine.cycle.pair import Pair
from engine.cycle.plain import target_generate
from engine.cycle.reference import speculative_generate
from engine.drafters.registry import DrafterOptions, options_from_header
from engine.drafters.suffix import SuffixDrafter
from engine.drafters.suffix_tree import GlobalCache, SuffixTrie, speculate
from engine.run import run_to_trace
from engine.teaching.faults import Faults
from engine.trace import TraceError, load_trace, loads_trace
from tests.checks import assert_self_consistent
from tests.test_exactness import chi_square_p_value, exact_two_token_distribution
from tests.tiny import save_tiny, tiny_pair

SEQ = [1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2]  # "1 2" four times, followed by 3, 4, 3 and (now) nothing
PROMPT = [1, 2, 4, 6, 7, 8, 1, 2, 4, 6]


def trie_of(seq: list[int], depth: int = 8) -> SuffixTrie:
    trie = SuffixTrie(depth)
    trie.add(seq)
    return trie


# ---------------------------------------------------------------- the trees, by hand

def test_counts_are_occurrences_and_the_best_scoring_match_wins():
    trie = trie_of(SEQ)
    assert trie.find([1, 2]).count == 4 and trie.find([1, 2, 3]).count == 2 and trie.find([2, 4]).count == 1
    assert trie.find([4, 4]) is None
    # [3, 1, 2] occurred at 2 (then 4 1 2 3 1) and now: 1/2 each; 5 tokens reach the depth 8. Score 2.5 beats
    # [1, 2] (0.5, 0.5, 0.5, 0.25: 1.75), [2, 3, 1, 2] (4 tokens, 2.0) and the rest.
    draft = speculate(trie, SEQ, k=8, factor=2.0, min_prob=0.0)
    assert (draft.tokens, draft.probs, draft.match_len, draft.score) == ((4, 1, 2, 3, 1), (0.5,) * 5, 3, 2.5)


def test_the_draft_is_capped_by_factor_times_match_and_by_k():
    trie = trie_of(SEQ)
    assert speculate(trie, SEQ, k=8, factor=0.5, min_prob=0.0).tokens == (4, 1)  # match 5 x 0.5 = 2 tokens
    assert speculate(trie, SEQ, k=8, factor=0.5, min_prob=0.0).match_len == 5
    assert speculate(trie, SEQ, k=1, factor=4.0, min_prob=0.0).tokens == (4,)  # K = 1


def test_tokens_below_the_minimum_probability_are_pruned():
    trie = trie_of(SEQ)
    context = [9, 1, 2]  # [9, 1, 2] never occurred: matches of 1 and 2 only
    full = speculate(trie, context, k=8, factor=4.0, min_prob=0.0)
    assert (full.tokens, full.probs, full.match_len) == ((3, 1, 2, 4, 1, 2), (0.5, 0.5, 0.5, 0.25, 0.25, 0.25), 2)
    pruned = speculate(trie, context, k=8, factor=4.0, min_prob=0.3)  # 0.25 < 0.3: cut after 3 1 2
    assert (pruned.tokens, pruned.probs, pruned.match_len) == ((3, 1, 2), (0.5, 0.5, 0.5), 2)
    assert speculate(trie, context, k=8, factor=4.0, min_prob=0.6).tokens == ()  # even the first is too rare


def test_the_global_tree_evicts_the_oldest_request_first():
    cache = GlobalCache(depth=6, max_requests=2)
    for output in ([10, 11, 12], [20, 21, 22], [30, 31, 32]):
        cache.add_request(output)
    assert len(cache) == 2 and cache.trie.find([10, 11]) is None and cache.trie.find([11]) is None
    assert cache.trie.find([20, 21, 22]).count == 1 and cache.trie.root.count == 6
    cache.add_request([30, 31, 5])  # a shared prefix: counts add up, and survive the next eviction
    assert cache.trie.find([30, 31]).count == 2 and cache.trie.find([20]) is None
    cache.add_request([7])
    assert cache.trie.find([30, 31]).count == 1 and cache.trie.find([30, 31, 5]).count == 1


def test_the_global_tree_proposes_when_the_request_has_no_match():
    drafter = SuffixDrafter(64, depth=8)
    drafter.remember([40, 41, 42, 43, 44])
    state = drafter.start([5, 41, 42])
    p = drafter.propose(state, [5, 41, 42], 4, SpecSettings(k=4), torch.Generator())
    assert p.token_ids == [43, 44] and p.state["source"] == "global" and p.state["match_len"] == 2
    assert p.state["token_probs"] == [1.0, 1.0] and p.state["request"] == {"match_len": 0, "score": 0.0, "proposed": 0}
    assert p.state["match_start"] is None and torch.equal(p.p_draft.argmax(-1), torch.tensor([43, 44]))


def test_a_finished_request_joins_the_global_tree_and_a_tie_goes_to_the_request_tree():
    drafter = SuffixDrafter(64, depth=8, factor=1.0, min_prob=0.0)
    first = drafter.start([1, 2])
    drafter.roll_back(first, [1, 2, 3, 4, 5])  # the request's output: 3 4 5
    assert len(drafter.cache) == 0  # in flight: not in the global tree yet
    second = drafter.start([3, 4, 5, 3, 4])  # the next request ends the first one
    assert len(drafter.cache) == 1 and drafter.cache.trie.find([3, 4, 5]).count == 1
    assert drafter.cache.trie.find([1]) is None  # outputs only, not prompts
    p = drafter.propose(second, [3, 4, 5, 3, 4], 2, SpecSettings(k=2), torch.Generator())
    # The request: "3 4" twice (once now), then 5 3: 1/2, 1/2. The global tree: "3 4" once, then 5: 1/1.
    assert p.state["request"] == {"match_len": 2, "score": 1.0, "proposed": 2}
    assert p.state["global"] == {"match_len": 2, "score": 1.0, "proposed": 1}
    assert p.state["source"] == "request" and p.token_ids == [5, 3] and p.state["match_start"] == 0
    assert p.state["token_probs"] == [0.5, 0.5]


def test_the_request_in_flight_joins_the_global_tree_before_each_draft_as_in_vllm():
    drafter = SuffixDrafter(64, depth=8, factor=1.0, min_prob=0.0)
    drafter.remember([7, 8, 9])  # an earlier output: "7 8" then 9
    state = drafter.start([1, 2])
    p = drafter.propose(state, [1, 2, 7, 8, 5, 7, 8], 1, SpecSettings(k=1), torch.Generator())
    # Global: "7 8" three times (9 once, 5 once, and the current end); alone, the earlier output would score 1.0.
    assert drafter.cache.trie.find([7, 8]).count == 3 and drafter.cache.trie.find([1]) is None  # output, not prompt
    assert p.state["global"]["score"] == pytest.approx(1 / 3) and p.state["request"]["score"] == 0.5
    assert p.state["source"] == "request" and p.token_ids == [5]
    state.catch_up([1, 2, 7, 8, 5, 7, 8, 5])  # the last cycle's token, committed after the last draft
    drafter.start([3])
    assert [list(o) for o in drafter.cache.outputs] == [[7, 8, 9], [7, 8, 5, 7, 8, 5]]
    assert drafter.cache.trie.find([8, 5]).count == 2  # the whole output, each token counted once


def test_a_run_restarted_from_an_earlier_state_replaces_the_output_in_flight():
    drafter = SuffixDrafter(64, depth=8, factor=1.0, min_prob=0.0)
    state = drafter.start([1, 2])
    branch = copy.deepcopy(state)
    drafter.propose(state, [1, 2, 7, 8, 9], 2, SpecSettings(k=2), torch.Generator())
    drafter.propose(branch, [1, 2, 7, 5], 2, SpecSettings(k=2), torch.Generator())
    assert drafter.cache.trie.find([7, 8]) is None and drafter.cache.trie.find([7, 5]).count == 1
    assert drafter.cache.trie.root.count == 2  # two output tokens in the tree, the first branch's gone


def test_options_are_refused_out_of_range():
    for bad in ({"suffix_depth": 1}, {"suffix_factor": 0.0}, {"suffix_min_prob": 1.5},
                {"suffix_cached_requests": -1}, {"suffix_depth": True}):
        with pytest.raises(SettingsError, match="--suffix-"):
            DrafterOptions("suffix", **bad)
    with pytest.raises(SettingsError, match="--suffix-factor"):
        SuffixDrafter(16, factor=float("nan"))


# ---------------------------------------------------------------- exactness

def primed(target, **options) -> Pair:
    """A suffix drafter whose global tree already holds an earlier output like the prompt."""
    drafter = SuffixDrafter(target.full_vocab_size, **options)
    drafter.remember([4, 6, 7, 8, 1, 2, 4, 6, 7, 9, 3])
    return Pair(target, None, set(), drafter)


@pytest.mark.parametrize("k,seed", [(1, 0), (3, 1), (8, 0)])
def test_greedy_equals_plain_target_decoding(k, seed):
    pair = primed(tiny_pair(seed).target, depth=8, min_prob=0.0)
    s = SpecSettings(k=k, temperature=0, max_new_tokens=40)
    records = list(speculative_generate(pair, PROMPT, s))
    assert [t for r in records for t in r["committed_token_ids"]] == target_generate(pair.target, PROMPT, s, pair.eos_ids)
    sources = {r["drafter_state"]["source"] for r in records}
    assert sum(r["num_accepted"] for r in records) > 0 and {"request", "global"} <= sources


SAMPLES = 1000  # fewer than the other drafters: two chi-square runs within a few seconds each


@pytest.fixture(scope="module")
def lab():
    pair = primed(tiny_pair(0).target, depth=8, min_prob=0.0)
    s = SpecSettings(k=2, temperature=1.0, max_new_tokens=2, seed=8765)
    with torch.inference_mode():
        exact = exact_two_token_distribution(pair, s, PROMPT)
    return pair, s, exact


def sample_two_tokens(pair, s, rule, n):
    tally: dict = {}
    counts = exactness.sample_two_tokens(pair, s, rule, n, PROMPT, tally)
    assert tally["drafted"] > n  # the trees proposed, so the ratio test was exercised
    return counts


def test_suffix_sampling_matches_target_distribution(lab):
    pair, s, exact = lab
    p = chi_square_p_value(sample_two_tokens(pair, s, Faults(), SAMPLES), exact)
    assert p > 0.01, f"correct rule rejected by chi-square, p={p:.2g}"


def test_chi_square_catches_suffix_decoding_that_skips_the_residual(lab):
    pair, s, exact = lab
    p = chi_square_p_value(sample_two_tokens(pair, s, Faults(acceptance_rule="no_residual"), SAMPLES), exact)
    assert p < 1e-4, f"broken rule not caught, p={p:.2g}"


# ---------------------------------------------------------------- traces, the CLI

@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """Two requests through one drafter: the second drafts from the first's output too."""
    folder = tmp_path_factory.mktemp("suffix")
    pair = Pair(tiny_pair(0).target, None, set(), SuffixDrafter(tiny_pair(0).target.full_vocab_size, depth=8,
                                                                min_prob=0.0))
    s = SpecSettings(k=4, temperature=0.0, max_new_tokens=30)
    for name in ("first", "second"):
        run_to_trace(pair, "the cat sat on a mat the cat sat", s, folder / f"{name}.jsonl")
    return folder


def test_trace_records_both_trees_and_the_second_request_drafts_from_the_first(traces):
    first, second = load_trace(traces / "first.jsonl"), load_trace(traces / "second.jsonl")
    assert first.header["drafter"] == {"kind": "suffix", "suffix_depth": 8, "suffix_factor": 1.0,
                                       "suffix_min_prob": 0.0, "suffix_cached_requests": 10000}
    assert_self_consistent(second)
    assert {c["drafter_state"]["cached_requests"] for c in second.cycles} == {1}
    assert any(c["drafter_state"]["source"] == "global" for c in second.cycles)
    assert sum(c["num_accepted"] for c in second.cycles) > sum(c["num_accepted"] for c in first.cycles)
    assert options_from_header(first.header) == DrafterOptions("suffix", suffix_depth=8, suffix_min_prob=0.0)


def first_from(records: list[dict], source: str) -> dict:
    return next(r for r in records if r.get("drafter_state", {}).get("source") == source)


@pytest.mark.parametrize("name,edit,message", [
    ("a request probability", lambda rs: first_from(rs, "request")["drafter_state"]["token_probs"].__setitem__(0, 0.99),
     "token_probs"),
    ("the wrong place", lambda rs: first_from(rs, "request")["drafter_state"].__setitem__("match_start", 10**6),
     "match_start"),
    ("the losing tree", lambda rs: first_from(rs, "global")["drafter_state"].__setitem__("source", "request"),
     "source"),
    ("a rising probability", lambda rs: first_from(rs, "global")["drafter_state"]["token_probs"].__setitem__(0, 0.01),
     "token_probs"),
    ("a state that is not one", lambda rs: first_from(rs, "global").__setitem__("drafter_state", {"kind": "suffix"}),
     "drafter_state"),
])
def test_a_tampered_drafter_state_is_refused(traces, name, edit, message):
    header, *lines = (traces / "second.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    edit(records)
    with pytest.raises(TraceError, match=message):
        loads_trace("\n".join([header] + [json.dumps(r) for r in records]) + "\n")


def test_a_header_with_a_bad_option_is_refused(traces):
    text = (traces / "first.jsonl").read_text().replace('"suffix_depth": 8', '"suffix_depth": 900', 1)
    with pytest.raises(TraceError, match="suffix_depth"):
        loads_trace(text)


def test_a_global_draft_under_a_header_that_keeps_no_outputs_is_refused(traces):
    text = (traces / "second.jsonl").read_text().replace('"suffix_cached_requests": 10000', '"suffix_cached_requests": 0', 1)
    records = [json.loads(line) for line in text.splitlines()[1:]]
    for r in records:  # consistent counts, so only the global draft itself is wrong
        if "drafter_state" in r:
            r["drafter_state"]["cached_requests"] = 0
    with pytest.raises(TraceError, match="drafter_state.global"):
        loads_trace("\n".join([text.splitlines()[0]] + [json.dumps(r) for r in records]) + "\n")


def test_cli_runs_suffix_decoding_with_its_flags(tmp_path, capsys):
    target, _ = save_tiny(tiny_pair(0), tmp_path / "models")
    out = tmp_path / "cli.jsonl"
    rc = main(["run", "--target", target, "--drafter", "suffix", "--suffix-depth", "6", "--suffix-factor", "1.5",
               "--suffix-min-prob", "0.2", "--k", "3", "--prompt", "the cat sat on the cat", "--temperature", "0",
               "--max-new-tokens", "12", "--no-chat-template", "--out", str(out)])
    assert rc == 0 and "drafter: suffix" in capsys.readouterr().out
    drafter = load_trace(out).header["drafter"]
    assert (drafter["suffix_depth"], drafter["suffix_factor"], drafter["suffix_min_prob"]) == (6, 1.5, 0.2)


def test_a_workload_is_one_session_its_global_tree_grows_request_by_request(tmp_path):
    target, _ = save_tiny(tiny_pair(0), tmp_path / "models")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n"
                               for p in ("the cat sat on a mat", "the dog sat on a log", "the cat ran")))
    rc = main(["run", "--target", target, "--drafter", "suffix", "--suffix-depth", "8", "--k", "3", "--prompts",
               str(prompts), "--temperature", "0", "--max-new-tokens", "20", "--no-chat-template",
               "--out", str(tmp_path / "out")])
    assert rc == 0
    held = [{c["drafter_state"]["cached_requests"] for c in load_trace(tmp_path / "out" / f"request-000{i}.jsonl").cycles}
            for i in (1, 2, 3)]
    assert held == [{0}, {1}, {2}]
    last = load_trace(tmp_path / "out" / "request-0003.jsonl")
    assert any(c["drafter_state"]["source"] == "global" for c in last.cycles)


def test_tiny_shakespeare_with_suffix_decoding_is_greedy_equal_to_its_target():
    from engine.models.presets import PRESETS
    from engine.run import encode_prompt, load_preset
    pair = load_preset("tiny-shakespeare", device="cpu", drafter=DrafterOptions("suffix"))
    ids = encode_prompt(pair.target.tokenizer, "Romeo.\nO Romeo, Romeo, wherefore art thou Romeo?\nRomeo.\nO Romeo, Romeo",
                        PRESETS["tiny-shakespeare"].use_chat_template)
    for k in (2, 5):
        s = SpecSettings(k=k, temperature=0, max_new_tokens=24)
        records = list(speculative_generate(pair, ids, s))
        assert [t for r in records for t in r["committed_token_ids"]] == target_generate(pair.target, ids, s, pair.eos_ids)
        assert sum(r["num_accepted"] for r in records) > 0


def test_stats_split_acceptance_by_the_tree_that_proposed(traces):
    from engine.stats.analysis import trace_stats
    from engine.stats.report import format_stats
    trace = load_trace(traces / "second.jsonl")
    rows = {r.value: r for r in trace_stats(trace).by_source}
    for source in ("request", "global"):
        mine = [c for c in trace.cycles if c["drafter_state"]["source"] == source]
        assert (rows[source].cycles, rows[source].accepted) == (len(mine), sum(c["num_accepted"] for c in mine))
    assert sum(r.cycles for r in rows.values()) == len(trace.cycles)
    assert "acceptance by the tree that proposed" in format_stats(trace)
