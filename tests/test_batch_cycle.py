"""The batched speculative cycle (engine/batch/): B ragged rows, each exact on its own."""
from dataclasses import replace

import pytest
import torch

import engine.batch.cycle as batch_cycle
from engine.batch.cycle import batched_generate, run_batch, start_batch
from engine.config import SpecSettings
from engine.cycle.pair import Pair
from engine.cycle.plain import target_generate
from engine.cycle.reference import speculative_generate
from engine.kv.layouts import attended_kv
from engine.kv.rows import row_kv
from engine.teaching.faults import Faults
from tests.test_exactness import PROMPT, chi_square_p_value, exact_two_token_distribution
from tests.tiny import noisy_pair, tiny_pair

# Lengths 3, 7, 1, 4, 2, 6, 2, 5: ragged from the prefill on, and one prompt of a single token (nothing to prefill).
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 1], [2], [3, 3, 1, 2], [5, 9], [10, 11, 12, 13, 14, 15], [7, 7], [8, 1, 6, 3, 2]]
BUDGETS = [12, 5, 9, 16, 3, 11, 14, 7]


@pytest.fixture(scope="module")
def pair() -> Pair:
    """A draft that is the target plus noise: it accepts 0..K tokens in a cycle, varying by row (checked below)."""
    return noisy_pair(2, noise=0.02)


def plain_greedy(pair: Pair, prompt: list[int], budget: int) -> list[int]:
    return target_generate(pair.target, prompt, SpecSettings(temperature=0, max_new_tokens=budget), pair.eos_ids)


@pytest.mark.parametrize("b", [1, 3, 8])
def test_every_row_at_temperature_0_is_plain_greedy_decoding(pair, b):
    s = SpecSettings(k=3, temperature=0)
    prompts, budgets = PROMPTS[-b:], BUDGETS[-b:]  # b = 1 is the 5-token prompt alone
    outputs, cycles = batched_generate(pair, prompts, s, list(range(b)), budgets)
    assert len(outputs) == b
    for row, (prompt, budget) in enumerate(zip(prompts, budgets)):
        assert outputs[row] == plain_greedy(pair, prompt, budget), f"row {row} parts from greedy decoding"
        assert len(outputs[row]) == budget


def test_each_rows_caches_hold_a_fresh_prefill_of_its_committed_sequence_after_every_cycle(pair):
    """Both caches, row by row, after every cycle: length committed - 1, and the valid slots' K/V equal a
    single-row prefill of the committed sequence. Tolerance 1e-4 (values here are O(1)): float32 matrix
    products round differently with the number of rows they multiply (B*T rows here, one prompt's there; oneDNN's
    packed path or MKL's, per width) and with the CPU, so a batched slot and a fresh one agree to about 1e-6,
    not bit for bit; a slot from another row, a stale one or a shifted position differs by O(0.1)."""
    s = SpecSettings(k=3, temperature=0.8)
    batch = start_batch(pair, PROMPTS, s, seeds=list(range(10, 18)), max_new_tokens=BUDGETS)
    state, cycle, worst = batch.state, 0, 0.0
    for _ in run_batch(batch):
        cycle += 1
        for model, cache in ((pair.target, state.target_cache), (pair.draft, state.draft_cache)):
            for row, committed in enumerate(r.committed for r in state.rows):
                assert cache.lengths[row] == len(committed) - 1
                fresh = model.new_cache()
                if len(committed) > 1:
                    model.fill(committed[:-1], fresh)
                for (k, v), (k0, v0) in zip(row_kv(cache, row), attended_kv(fresh), strict=True):
                    torch.testing.assert_close(k, k0, atol=1e-4, rtol=1e-4)
                    torch.testing.assert_close(v, v0, atol=1e-4, rtol=1e-4)
                    worst = max(worst, float((k - k0).abs().max()), float((v - v0).abs().max()))
    assert cycle > 3 and worst < 1e-4


def test_rows_accept_different_counts_in_one_cycle_and_roll_back_to_their_own_lengths(pair):
    s = SpecSettings(k=3, temperature=0)
    _, cycles = batched_generate(pair, PROMPTS, s, list(range(8)), BUDGETS)
    ragged = [c for c in cycles if len({r.num_accepted for r in c.rows if not r.idle}) > 1]
    assert ragged, "every cycle accepted the same count in every row: the test does not exercise ragged rollback"
    for c in ragged:
        for r in c.rows:
            if not r.idle:
                # appended K+1 in the verify, kept the accepted ones and the next token's predecessor
                assert r.target_cache_len["after_append"] == r.target_cache_len["before"] + s.k + 1
                assert r.target_cache_len["after_rollback"] == r.target_cache_len["before"] + len(r.committed)
                assert r.draft_cache_len == r.target_cache_len
    counts = {r.num_accepted for c in cycles for r in c.rows if not r.idle}
    assert counts == {0, 1, 2, 3}


def test_finished_rows_turn_idle_are_counted_and_keep_their_caches(pair):
    """Row 0 stops on its budget, row 1 on an EOS (a token its greedy output reaches), row 2 runs on."""
    prompts, budgets = [[1, 2, 3], [4, 5, 6, 7], [3, 3, 1, 2]], [2, 20, 16]
    eos = plain_greedy(pair, prompts[1], 20)[4]
    eos_pair = Pair(pair.target, pair.draft, {eos})
    outputs, cycles = batched_generate(eos_pair, prompts, SpecSettings(k=3, temperature=0), [0, 1, 2], budgets)
    assert outputs[1] == plain_greedy(eos_pair, prompts[1], 20) and outputs[1][-1] == eos and len(outputs[1]) < 20
    assert outputs[0] == plain_greedy(eos_pair, prompts[0], 2)
    assert outputs[2] == plain_greedy(eos_pair, prompts[2], 16)
    for row in (0, 1):
        done = next(c.cycle for c in cycles if c.rows[row].finished)
        for c in cycles[done + 1:]:
            r = c.rows[row]
            assert r.idle and r.draft_token_ids == [] and r.committed == [] and r.next_token_id is None
            final_len = len(prompts[row]) - 1 + len(outputs[row])
            assert r.target_cache_len["before"] == r.target_cache_len["after_rollback"] == final_len
            assert r.draft_cache_len == r.target_cache_len
    assert [c.idle_rows for c in cycles][-1] == 2 and cycles[0].idle_rows == 0
    assert all(c.idle_rows + c.active_rows == 3 for c in cycles)
    assert all(c.draft_s > 0 and c.verify_s > 0 and c.bookkeeping_s >= 0 for c in cycles)


def test_a_sampled_row_draws_what_the_single_request_run_with_its_seed_draws(pair):
    """Per-row generators consume draws in the reference path's order: same drafts, u, decisions and tokens."""
    s = SpecSettings(k=3, temperature=1.0)
    seeds = [5, 6, 7]
    _, cycles = batched_generate(pair, PROMPTS[:3], s, seeds, BUDGETS[:3])
    for row, (prompt, budget, seed) in enumerate(zip(PROMPTS, BUDGETS, seeds)):
        ref = list(speculative_generate(pair, prompt, replace(s, seed=seed, max_new_tokens=budget)))
        mine = [c.rows[row] for c in cycles if not c.rows[row].idle]
        assert [r.draft_token_ids for r in mine] == [r["draft_token_ids"] for r in ref]
        assert [r.num_accepted for r in mine] == [r["num_accepted"] for r in ref]
        assert [r.committed for r in mine] == [r["committed_token_ids"] for r in ref]
        assert [r.u for r in mine] == [r["u"] for r in ref]
        for r, rr in zip(mine, ref):
            assert r.p_target == pytest.approx(rr["p_target"], abs=1e-5)
            assert r.p_draft == pytest.approx(rr["p_draft"], abs=1e-5)


SAMPLED_ROWS = 12  # rows of PROMPT in each batch; other prompts around them keep the batch ragged
SAMPLES = 1800


def batched_two_token_counts(pair: Pair, s: SpecSettings) -> torch.Tensor:
    """Counts (V, V) of the first two tokens of PROMPT's rows over SAMPLES independently seeded rows."""
    others = [[4, 5, 6, 7, 8, 9, 1], [2], [10, 11, 12, 13, 14, 15], [3, 3]]
    prompts = others[:2] + [PROMPT] * SAMPLED_ROWS + others[2:]
    budgets = [3, 2] + [2] * SAMPLED_ROWS + [3, 2]
    v = pair.target.full_vocab_size
    counts = torch.zeros(v, v)
    for run in range(SAMPLES // SAMPLED_ROWS):
        seeds = [run * len(prompts) + r for r in range(len(prompts))]
        outputs, _ = batched_generate(pair, prompts, s, seeds, budgets)
        for out in outputs[2:2 + SAMPLED_ROWS]:
            counts[out[0], out[1]] += 1
    return counts


@pytest.fixture(scope="module")
def sampling_setup():
    pair = tiny_pair(0, draft_seed=5)  # a different draft: many rejections, so the residual decides often
    s = SpecSettings(k=2, temperature=1.0)
    with torch.inference_mode():
        return pair, s, exact_two_token_distribution(pair, s)


def test_batched_rows_sample_the_targets_two_token_distribution(sampling_setup):
    pair, s, exact = sampling_setup
    p = chi_square_p_value(batched_two_token_counts(pair, s), exact)
    assert p > 0.01, f"batched rows rejected by chi-square against the target's distribution, p={p:.2g}"


def test_the_chi_square_check_catches_a_row_decided_by_a_wrong_rule(sampling_setup, monkeypatch):
    """The same check fails when each row's decision skips the residual (the teaching fault): it has the power."""
    pair, s, exact = sampling_setup
    monkeypatch.setattr(batch_cycle, "accept_reject", Faults(acceptance_rule="no_residual").decide)
    p = chi_square_p_value(batched_two_token_counts(pair, s), exact)
    assert p < 1e-4, f"a wrong rule went unnoticed, p={p:.2g}"
