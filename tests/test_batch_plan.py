"""Plain batched decoding (engine/cycle/plain.py) and the K advisor per batch size (engine/stats/batch_plan.py)."""
import pytest

from engine.config import SpecSettings
from engine.cycle.plain import batched_plain_generate, target_generate
from engine.stats.batch_plan import PLAIN_K, BatchCosts, BatchLoad, advise_batch_k, measure_batch_costs
from engine.trace.metrics import expected_tokens_per_cycle
from tests.test_batch_cycle import BUDGETS, PROMPTS
from tests.tiny import noisy_pair


def test_plain_batched_decoding_is_each_rows_greedy_decoding():
    pair = noisy_pair(2, noise=0.02)
    s = SpecSettings(temperature=0)
    out = batched_plain_generate(pair.target, PROMPTS, s, list(range(8)), pair.eos_ids, BUDGETS)
    for prompt, budget, got in zip(PROMPTS, BUDGETS, out.outputs):
        assert got == target_generate(pair.target, prompt, SpecSettings(temperature=0, max_new_tokens=budget),
                                      pair.eos_ids)
    assert out.steps == max(BUDGETS)
    assert out.idle_row_steps == sum(max(BUDGETS) - b for b in BUDGETS)  # finished rows stay, counted


def costs(batch: int, step: float, verify_per_extra: float, draft: float = 0.0) -> BatchCosts:
    """A verify of width w costs one step plus (w - 1) x verify_per_extra: flat when memory-bound, steep when not."""
    return BatchCosts(batch, step, draft, {w: step + (w - 1) * verify_per_extra for w in range(2, 8)})


def test_the_advisor_speculates_while_a_verify_is_nearly_free_and_stops_when_it_is_not():
    alpha = 0.7
    load = BatchLoad((alpha,))  # continuous batching: every row busy
    cheap = costs(1, 0.010, 0.0002, 0.001)  # batch 1: verify of K+1 costs about one step
    k = advise_batch_k(load, cheap)
    assert k >= 3 and cheap.goodput(load, k) > cheap.plain_goodput()
    # by hand, K=3: 1 row x E[tokens] / (4 draft steps + a verify of 4)
    assert cheap.goodput(load, 3) == pytest.approx(expected_tokens_per_cycle(alpha, 3) / (4 * 0.001 + 0.0106))
    busy = costs(16, 0.040, 0.040, 0.004)  # batch 16: every extra position costs a whole step
    assert advise_batch_k(load, busy) == PLAIN_K
    assert all(busy.goodput(load, k) < busy.plain_goodput() for k in range(1, 7))


def test_a_static_batch_waits_for_its_slowest_row():
    """Rows that accept everything need ceil(N / (K+1)) cycles; rows that accept nothing need N; a static batch
    mixing them needs the slower row's count, and more rows make a slow one likelier."""
    k, n = 3, 12
    assert BatchLoad((1.0,), n).batch_cycles(k, 4) == 3 and BatchLoad((0.0,), n).batch_cycles(k, 4) == n
    mixed = BatchLoad((1.0, 0.0), n, trials=400)
    assert mixed.batch_cycles(k, 1) == pytest.approx((3 + n) / 2, rel=0.15)  # one row: either, evenly drawn
    assert mixed.batch_cycles(k, 8) == pytest.approx(n, rel=0.01)  # 8 rows: almost surely one slow row
    middling = BatchLoad((0.7,), n)
    assert middling.batch_cycles(k, 1) < middling.batch_cycles(k, 4) < middling.batch_cycles(k, 16)
    assert middling.batch_cycles(k, 4) == middling.batch_cycles(k, 4)  # seeded: the same advice every time
    # goodput: B x N tokens over the batch's cycles
    c = costs(4, 0.010, 0.0002, 0.001)
    assert c.goodput(BatchLoad((1.0,), n), k) == pytest.approx(4 * n / (3 * c.cycle_s(k)))


def test_measured_costs_time_every_width_asked_for():
    pair = noisy_pair(2, noise=0.02)
    c = measure_batch_costs(pair, PROMPTS[:3], [2, 5], repeats=3)
    assert c.batch == 3 and set(c.verify_s) == {2, 5}
    assert min(c.target_step_s, c.draft_step_s, *c.verify_s.values()) > 0
