"""The engine against plain target decoding and against fresh prefills."""
import pytest
import torch

from engine.config import SpecSettings
from engine.cycle.pair import TokenTexts
from engine.cycle.plain import target_generate
from engine.cycle.reference import run_cycle, speculative_generate, start_run
from engine.kv.ops import cache_len, prefill
from tests.tiny import noisy_pair, tiny_pair

PROMPT = [1, 2, 4, 6, 7]


def spec_tokens(pair, settings, prompt=PROMPT) -> list[int]:
    return [t for rec in speculative_generate(pair, prompt, settings) for t in rec["committed_token_ids"]]


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_equals_plain_target_decoding(k, seed):
    pair = noisy_pair(seed)
    s = SpecSettings(k=k, temperature=0, max_new_tokens=40)
    records = list(speculative_generate(pair, PROMPT, s))
    spec = [t for r in records for t in r["committed_token_ids"]]
    assert spec == target_generate(pair.target, PROMPT, s, pair.eos_ids)
    # The noisy draft must exercise both accepts and rejections, or this proves little.
    accepted = [r["num_accepted"] for r in records]
    assert max(accepted) >= 1 and min(accepted) < k


def test_greedy_with_unrelated_draft_still_equals_target():
    pair = tiny_pair(3)
    s = SpecSettings(k=4, temperature=0, max_new_tokens=30)
    assert spec_tokens(pair, s) == target_generate(pair.target, PROMPT, s, pair.eos_ids)


def layer_tensors(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def assert_cache_matches_fresh_prefill(model, cache, committed):
    fresh = prefill(model, committed)
    assert cache_len(cache) == len(committed) - 1 == cache_len(fresh)
    for (k, v), (fk, fv) in zip(layer_tensors(cache), layer_tensors(fresh)):
        torch.testing.assert_close(k, fk, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(v, fv, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_caches_hold_exactly_the_committed_sequence_after_every_cycle(temperature):
    pair = noisy_pair(1, noise=0.04)
    s = SpecSettings(k=4, temperature=temperature, max_new_tokens=40, seed=5)
    gen = torch.Generator().manual_seed(s.seed)
    state = start_run(pair, PROMPT)
    texts = TokenTexts(pair.target.tokenizer)
    saw_full_accept = saw_reject = False
    cycle = 0
    while not state.finished:
        rec = run_cycle(pair, state, s, gen, cycle, texts)
        saw_full_accept |= rec["bonus_token_id"] is not None
        saw_reject |= rec["resampled_token_id"] is not None
        assert_cache_matches_fresh_prefill(pair.target, state.target_cache, state.committed)
        assert_cache_matches_fresh_prefill(pair.draft, state.draft_cache, state.committed)
        cycle += 1
    assert saw_full_accept and saw_reject  # both rollback paths were exercised


def test_never_commits_past_max_new_tokens():
    pair = noisy_pair(0)
    for n in (1, 2, 3, 7):
        s = SpecSettings(k=4, temperature=0, max_new_tokens=n)
        assert len(spec_tokens(pair, s)) == n


def test_stops_at_eos_and_commits_nothing_after_it():
    pair = noisy_pair(2, eos=True)
    s = SpecSettings(k=4, temperature=1.0, max_new_tokens=200, seed=3)
    stopped_at_eos = 0
    for seed in range(8):
        s = SpecSettings(k=4, temperature=1.5, max_new_tokens=200, seed=seed)
        tokens = spec_tokens(pair, s)
        assert 0 not in tokens[:-1]
        stopped_at_eos += tokens[-1] == 0
    assert stopped_at_eos > 0


def strip_timings(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if not k.endswith("_s")}


def test_same_seed_same_trace_and_other_seed_differs():
    pair = noisy_pair(0, noise=0.1)
    s = SpecSettings(k=3, temperature=1.0, max_new_tokens=30, seed=11)
    first = [strip_timings(r) for r in speculative_generate(pair, PROMPT, s)]
    again = [strip_timings(r) for r in speculative_generate(pair, PROMPT, s)]
    other = [strip_timings(r) for r in speculative_generate(pair, PROMPT, SpecSettings(k=3, max_new_tokens=30, seed=12))]
    assert first == again
    assert first != other


def test_prefill_skips_prompt_logits_but_caches_the_same_keys_and_values():
    target = tiny_pair(0).target
    assert target.can_skip_logits  # a Llama takes logits_to_keep, so prefill asks for one position only
    ids = PROMPT + [3, 4]
    filled, forwarded = target.new_cache(), target.new_cache()
    target.fill(ids, filled)
    target.forward(ids, forwarded)
    assert cache_len(filled) == cache_len(forwarded) == len(ids)
    for (k, v), (fk, fv) in zip(layer_tensors(filled), layer_tensors(forwarded)):
        torch.testing.assert_close(k, fk)
        torch.testing.assert_close(v, fv)
