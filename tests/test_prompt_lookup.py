"""Prompt lookup (n-gram) drafting: exact, greedy-equal to the target, and honest about misses."""

import pytest
import torch

import tests.test_exactness as exactness
from engine.cli import main
from engine.config import SpecSettings
from engine.cycle.pair import Pair, TokenTexts
from engine.cycle.plain import target_generate
from engine.cycle.reference import run_cycle, speculative_generate, start_run
from engine.drafters.prompt_lookup import PromptLookupDrafter, find_match
from engine.drafters.registry import DrafterOptions
from engine.kv.ops import cache_len
from engine.run import load_with_drafter, run_to_trace
from engine.teaching.faults import Faults
from engine.trace import TraceError, load_trace
from tests.checks import assert_self_consistent
from tests.test_engine import assert_cache_matches_fresh_prefill
from tests.test_exactness import chi_square_p_value, exact_two_token_distribution
from tests.tiny import save_tiny, tiny_pair

# Repeats "the cat sat on" so the lookup finds matches from the start.
PROMPT = [1, 2, 4, 6, 7, 8, 1, 2, 4, 6]


def lookup_pair(seed: int = 0, max_ngram: int = 3, min_ngram: int = 1, eos: bool = False) -> Pair:
    target = tiny_pair(seed, eos=eos).target
    return Pair(target, None, {0} if eos else set(), PromptLookupDrafter(target.full_vocab_size, max_ngram, min_ngram))


# ---------------------------------------------------------------- the lookup itself

def test_finds_the_most_recent_earlier_occurrence_of_the_longest_ngram():
    seq = [5, 1, 2, 9, 7, 1, 2, 3, 4, 1, 2]
    m = find_match(seq, max_ngram=3, min_ngram=1)
    # [4, 1, 2] never occurred before; [1, 2] did, most recently at 5, followed by 3, 4.
    assert (m.ngram_size, m.match_start, m.continuation_start) == (2, 5, 7)
    assert find_match(seq, max_ngram=1, min_ngram=1).match_start == 6  # [2] most recently at 6
    assert find_match([1, 2, 3], 3, 1) is None  # no token repeats
    assert find_match([3, 3], 2, 1).continuation_start == 1  # an overlapping match is allowed
    assert find_match([1, 2, 1, 2], 3, 3) is None  # min_ngram 3: [2, 1, 2] never occurred before


def test_earliest_finds_the_first_occurrence_as_vllms_ngram_proposer_does():
    seq = [5, 1, 2, 9, 7, 1, 2, 3, 4, 1, 2]
    m = find_match(seq, max_ngram=3, min_ngram=1, earliest=True)
    assert (m.ngram_size, m.match_start, m.continuation_start) == (2, 1, 3)  # [1, 2] first at 1, followed by 9
    assert find_match(seq, max_ngram=1, min_ngram=1, earliest=True).match_start == 2  # [2] first at 2
    assert find_match([3, 3, 3], 1, 1, earliest=True).continuation_start == 1
    assert find_match([1, 2, 3], 3, 1, earliest=True) is None
    # The longest n still wins over an earlier shorter match: [7, 1, 2] at 4 beats [1, 2] at 1.
    assert find_match([5, 1, 2, 9, 7, 1, 2, 3, 7, 1, 2], 3, 1, earliest=True).match_start == 4


def test_a_header_names_the_earliest_match_and_refuses_another_word(tmp_path):
    drafter = PromptLookupDrafter(32, 3, 1, "earliest")
    assert drafter.settings()["ngram_match"] == "earliest"
    assert "ngram_match" not in PromptLookupDrafter(32, 3, 1).settings()  # the default, as every older trace
    target = lookup_pair().target
    pair = Pair(target, None, set(), PromptLookupDrafter(target.full_vocab_size, 3, 1, "earliest"))
    out = tmp_path / "earliest.jsonl"
    run_to_trace(pair, "the cat sat", SpecSettings(k=3, temperature=0.0, max_new_tokens=8), out)
    assert load_trace(out).header["drafter"]["ngram_match"] == "earliest"
    text = out.read_text().replace('"ngram_match": "earliest"', '"ngram_match": "nearest"', 1)
    out.write_text(text)
    with pytest.raises(TraceError, match="ngram_match"):
        load_trace(out)


def test_proposes_the_continuation_one_hot_and_fewer_than_k_at_the_end():
    drafter = PromptLookupDrafter(16, 2, 1)
    p = drafter.propose(None, [4, 5, 6, 7, 4, 5], 8, SpecSettings(k=8), torch.Generator())
    assert p.token_ids == [6, 7, 4, 5]  # copies to the end of the sequence: 4 of the 8 allowed
    assert torch.equal(p.p_draft, torch.nn.functional.one_hot(torch.tensor([6, 7, 4, 5]), 16).float())
    assert p.state["ngram_size"] == 2 and p.state["match_start"] == 0
    miss = drafter.propose(None, [1, 2, 3], 4, SpecSettings(k=4), torch.Generator())
    assert miss.token_ids == [] and miss.p_draft.shape == (0, 16) and not miss.state["matched"]
    assert "plain target step" in miss.state["note"]


# ---------------------------------------------------------------- runs

@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_equals_plain_target_decoding(k, seed):
    pair = lookup_pair(seed)
    s = SpecSettings(k=k, temperature=0, max_new_tokens=40)
    records = list(speculative_generate(pair, PROMPT, s))
    spec = [t for r in records for t in r["committed_token_ids"]]
    assert spec == target_generate(pair.target, PROMPT, s, pair.eos_ids)
    assert any(r["num_accepted"] > 0 for r in records)  # the lookup did find tokens the target keeps


def test_after_first_token_the_first_cycle_is_a_plain_step_then_lookup_goes_on(tmp_path):
    """vLLM's first token comes from the prefill, before its proposer runs: the first cycle proposes nothing
    even where the prompt alone has a match (PROMPT repeats 1 2 4 6), and the next cycle looks up again."""
    target = lookup_pair().target
    s = SpecSettings(k=3, temperature=0, max_new_tokens=6)
    usual = list(speculative_generate(lookup_pair(), PROMPT, s))
    assert usual[0]["draft_token_ids"]  # the prompt alone has a match
    drafter = PromptLookupDrafter(target.full_vocab_size, 3, 1, "latest", after_first_token=True)
    cycles = list(speculative_generate(Pair(target, None, set(), drafter), PROMPT, s))
    assert cycles[0]["draft_token_ids"] == [] and cycles[0]["drafter_state"]["matched"] is False
    first = cycles[0]["committed_token_ids"]
    match = find_match(PROMPT + first, 3, 1)  # prompt + the first token: the lookup runs from here on
    assert cycles[1]["drafter_state"]["matched"] is (match is not None)
    assert "note" not in cycles[1]["drafter_state"] or match is None
    assert [t for c in cycles for t in c["committed_token_ids"]] == [t for c in usual for t in c["committed_token_ids"]]
    out = tmp_path / "first.jsonl"
    run_to_trace(Pair(target, None, set(), drafter), "the cat sat", SpecSettings(k=3, temperature=0.0, max_new_tokens=8), out)
    assert load_trace(out).header["drafter"]["after_first_token"] is True
    out.write_text(out.read_text().replace('"after_first_token": true', '"after_first_token": false', 1))
    with pytest.raises(TraceError, match="after_first_token"):
        load_trace(out)
    assert "after_first_token" not in PromptLookupDrafter(32, 3, 1).settings()  # the default, as every older trace


def test_no_match_is_a_plain_target_step():
    pair = lookup_pair(0, max_ngram=2, min_ngram=2)
    rec = next(speculative_generate(pair, [1, 2, 3, 4], SpecSettings(k=4, temperature=0, max_new_tokens=1)))
    assert rec["draft_token_ids"] == [] and rec["verify_positions"] == 1 and rec["num_accepted"] == 0
    assert rec["bonus_token_id"] == rec["committed_token_ids"][0] and rec["rejected_position"] is None
    assert rec["drafter_state"]["matched"] is False and rec["draft_cache_len"] is None


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_target_cache_holds_exactly_the_committed_sequence_after_every_cycle(temperature):
    pair = lookup_pair(1)
    s = SpecSettings(k=4, temperature=temperature, max_new_tokens=40, seed=5)
    gen = torch.Generator().manual_seed(s.seed)
    state = start_run(pair, PROMPT)
    texts = TokenTexts(pair.target.tokenizer)
    kinds = set()
    cycle = 0
    while not state.finished:
        rec = run_cycle(pair, state, s, gen, cycle, texts)
        kinds.add("bonus" if rec["bonus_token_id"] is not None and rec["draft_token_ids"] else
                  "none" if not rec["draft_token_ids"] else "reject")
        assert rec["target_cache_len"]["after_append"] == rec["target_cache_len"]["before"] + len(rec["draft_token_ids"]) + 1
        assert_cache_matches_fresh_prefill(pair.target, state.target_cache, state.committed)
        cycle += 1
    assert "reject" in kinds  # a rollback of rejected positions happened
    if temperature == 0:
        assert "bonus" in kinds  # and, greedy, full accepts (a random tiny target rarely repeats at T=1)


def test_trace_records_the_match_and_loads(tmp_path):
    pair = lookup_pair(0)
    out = tmp_path / "pl.jsonl"
    run_to_trace(pair, "the cat sat on a mat the cat sat", SpecSettings(k=4, temperature=1.0, max_new_tokens=30, seed=2), out)
    trace = load_trace(out)
    assert trace.header["drafter"] == {"kind": "prompt-lookup", "max_ngram": 3, "min_ngram": 1}
    assert trace.header["draft"]["parameters"] == 0
    assert_self_consistent(trace)
    committed = list(trace.header["prompt_token_ids"])
    for c in trace.cycles:
        st = c["drafter_state"]
        if st["matched"]:  # the proposal really is what followed the matched n-gram
            n, start = st["ngram_size"], st["match_start"]
            assert committed[start:start + n] == committed[-n:]
            assert c["draft_token_ids"] == committed[start + n:start + n + len(c["draft_token_ids"])]
        committed += c["committed_token_ids"]
    # c close to 0: the lookup is far cheaper than a verify pass
    draft = sum(c["draft_time_s"] for c in trace.cycles)
    verify = sum(c["verify_time_s"] for c in trace.cycles)
    assert draft < verify


# ---------------------------------------------------------------- exactness at T > 0

SAMPLES = 2000


@pytest.fixture(scope="module")
def lab():
    pair = lookup_pair(0)
    s = SpecSettings(k=2, temperature=1.0, max_new_tokens=2, seed=4321)
    with torch.inference_mode():  # the same two-token law, after a prompt the lookup matches
        exact = exact_two_token_distribution(pair, s, PROMPT)
    return pair, s, exact


def sample_two_tokens(pair, s, rule, n):
    tally: dict = {}
    counts = exactness.sample_two_tokens(pair, s, rule, n, PROMPT, tally)
    assert tally["drafted"] > n  # the lookup proposed tokens, so the ratio test was exercised
    return counts


def test_prompt_lookup_sampling_matches_target_distribution(lab):
    pair, s, exact = lab
    p = chi_square_p_value(sample_two_tokens(pair, s, Faults(), SAMPLES), exact)
    assert p > 0.01, f"correct rule rejected by chi-square, p={p:.2g}"


def test_chi_square_catches_a_lookup_that_skips_the_residual(lab):
    pair, s, exact = lab
    p = chi_square_p_value(sample_two_tokens(pair, s, Faults(acceptance_rule="no_residual"), SAMPLES), exact)
    assert p < 1e-4, f"broken rule not caught, p={p:.2g}"


# ---------------------------------------------------------------- loading and the CLI

def test_cli_runs_prompt_lookup_on_a_model_folder(tmp_path, capsys):
    target, _ = save_tiny(tiny_pair(0), tmp_path / "models")
    out = tmp_path / "cli.jsonl"
    rc = main(["run", "--target", target, "--drafter", "prompt-lookup", "--max-ngram", "2", "--k", "3",
               "--prompt", "the cat sat on the cat", "--temperature", "0", "--max-new-tokens", "12",
               "--no-chat-template", "--out", str(out)])
    assert rc == 0
    trace = load_trace(out)
    assert trace.drafter_kind == "prompt-lookup" and trace.header["drafter"]["max_ngram"] == 2
    assert_self_consistent(trace)
    assert "drafter: prompt-lookup" in capsys.readouterr().out


def test_cli_refuses_a_draft_model_with_prompt_lookup(tmp_path, capsys):
    rc = main(["run", "--preset", "tiny-shakespeare", "--drafter", "prompt-lookup", "--draft", "x",
               "--prompt", "a", "--out", str(tmp_path / "x.jsonl")])
    assert rc == 2 and "drop --draft" in capsys.readouterr().err


def test_load_with_drafter_builds_a_lookup_pair(tmp_path):
    target, _ = save_tiny(tiny_pair(0), tmp_path / "models")
    pair = load_with_drafter(target, DrafterOptions("prompt-lookup", max_ngram=4, min_ngram=2), device="cpu")
    assert pair.draft is None and pair.drafter.settings() == {"kind": "prompt-lookup", "max_ngram": 4, "min_ngram": 2}
    assert cache_len(start_run(pair, [1, 2, 3]).target_cache) == 2


# ---------------------------------------------------------------- the presets

GROUNDED = {"chat": "Repeat this sentence exactly: the quick brown fox jumps over the lazy dog near the river bank.",
            "tiny-shakespeare": "Romeo.\nO Romeo, Romeo, wherefore art thou Romeo?\nRomeo.\nO Romeo, Romeo"}


@pytest.mark.parametrize("name", ["tiny-shakespeare", "chat"])
def test_preset_with_prompt_lookup_is_greedy_equal_to_its_target(name):
    from engine.models.presets import PRESETS
    from engine.run import encode_prompt, load_preset
    preset = PRESETS[name]
    pair = load_preset(name, device="cpu", drafter=DrafterOptions("prompt-lookup"))
    ids = encode_prompt(pair.target.tokenizer, GROUNDED[name], preset.use_chat_template)
    for k in (2, 4) if name == "chat" else (1, 2, 4, 8):
        s = SpecSettings(k=k, temperature=0, max_new_tokens=24)
        records = list(speculative_generate(pair, ids, s))
        assert [t for r in records for t in r["committed_token_ids"]] == target_generate(pair.target, ids, s, pair.eos_ids)
        assert sum(r["num_accepted"] for r in records) > 0
