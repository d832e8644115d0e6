"""The tree advisor (engine/stats/tree_plan.py): a(B) from chain records, tokens per cycle, the
measured verify-cost curve, the pick, and the pilot on a real tiny pair (nothing here is timed)."""
import pytest

import engine.stats.calibrate as calibrate_module
from engine.config import SpecSettings, parse_tree
from engine.cycle.pair import Pair
from engine.drafters.prompt_lookup import PromptLookupDrafter
from engine.stats.analysis import advise_k, calibration_of
from engine.stats.calibrate import TREE_WIDTHS, calibrate, calibrate_widths, time_widths
from engine.stats.tree_plan import (
    CHAIN,
    PLAIN,
    TREE,
    WidthCurve,
    acceptance_by_branching,
    advise_tree,
    chain_candidates,
    costs_of,
    expected_tree_tokens,
    fed_widths,
    node_count,
    pilot_cycles,
    plan_tree,
    tree_candidates,
    tree_family,
)
from engine.trace.metrics import expected_tokens_per_cycle
from tests.tiny import noisy_pair


def rec(committed_len: int, drafted: list[int], accepted: int, draft_top: list[list[tuple]],
        target_top: list[list[tuple]], p_target: list[float], beta: list[float]) -> dict:
    """The fields of a chain cycle record the estimate reads; top lists as (token, p) pairs."""
    rows = lambda top: [[{"token_id": t, "p": p} for t, p in row] for row in top]  # noqa: E731
    return {"committed_len_before": committed_len, "draft_token_ids": drafted, "num_accepted": accepted,
            "committed_token_ids": drafted[:accepted] + [0], "draft_top": rows(draft_top),
            "target_top": rows(target_top), "p_target": p_target, "beta": beta}


# Three cycles written with trace_top_k = 3 (a row of 3 may have left tokens out, a shorter one only zeros).
RECORDS = [
    # rejected at position 2: positions 1 and 2 are tested, the third target row is not
    rec(5, [5, 6], 1, [[(5, .6), (7, .3), (8, .1)], [(6, .5), (9, .4)]],
        [[(5, .5), (7, .2), (9, .1)], [(7, .6), (9, .2), (3, .1)], [(1, 1.0)]], [.5, .05], [.8, .3]),
    # both accepted: the bonus position has no draft row, so positions 1 and 2
    rec(7, [1, 2], 2, [[(1, .9), (2, .05)], [(2, .7), (4, .2), (5, .1)]],
        [[(1, 1.0)], [(4, .5), (2, .3), (6, .2)], [(3, 1.0)]], [1.0, .3], [.95, .6]),
    # rejected at position 1: the rows after it (a perfect match there) must not count
    rec(10, [3, 9, 9], 0, [[(3, .5), (4, .3), (5, .2)], [(9, 1.0)], [(9, 1.0)]],
        [[(4, .7), (3, .2), (5, .1)], [(9, 1.0)], [(9, 1.0)], [(9, 1.0)]], [.2, 1.0, 1.0], [.2, .9, .9]),
]

WIDE = TREE_WIDTHS  # 1..9, 12, 16, 24, 32, 48, 65


def calibration(verify: list[float], widths: list[int] = WIDE, step: float = 0.010, draft: float = 0.001,
                **extra) -> dict:
    return {"cache_len": 8, "repeats": 1, "threads": 1, "target_step_s": step, "draft_step_s": draft,
            "verify_positions": widths, "verify_s": verify, **extra}


FLAT = calibration([0.011] * len(WIDE))  # a verify over 65 positions costs what one over 1 does
STEEP = calibration([0.010 + 0.002 * w for w in WIDE])  # each verified position adds 0.2 target steps
A = (0.90, 0.92, 0.93, 0.94)  # a draft whose top token mostly matches: little gained by branching


# ---------------------------------------------------------------- a(B) from hand-built records

def test_a_of_b_sums_target_probabilities_over_the_draft_top_b_at_committed_positions_only():
    acc = acceptance_by_branching(RECORDS, listed=3, max_b=3)
    assert acc.positions == 5  # 2 + 2 + 1: no bonus row, nothing past a rejection
    # by position (a(1), a(2), a(3)): (.5, .7, .7), (.05 the drafted token's own p_target, .25, .25),
    # (1, 1, 1), (.3, .8, .8), (.2, .9, 1.0)
    assert acc.low == pytest.approx((2.05 / 5, 3.65 / 5, 3.75 / 5))
    # token 8 (cycle 1, position 1) is missing from a full target row: at most its smallest entry, .1;
    # cycle 1's position 2 has 2 draft entries, so a third child is unknown: at most .1 (the room left)
    assert acc.high == pytest.approx((2.05 / 5, 3.65 / 5, 3.95 / 5))
    assert acc.chain_alpha == pytest.approx((.8 + .3 + .95 + .6 + .2) / 5)  # beta at the tested drafted positions


def test_a_of_b_refuses_what_the_records_cannot_tell():
    with pytest.raises(ValueError, match="at least 4 entries"):
        acceptance_by_branching(RECORDS, listed=3, max_b=4)
    with pytest.raises(ValueError, match="no position"):
        acceptance_by_branching([], listed=3, max_b=3)


# ---------------------------------------------------------------- tokens per cycle and shapes

@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.75, 1.0])
def test_a_chain_of_k_is_branching_one_and_gives_the_chain_expectation(alpha):
    for k in range(1, 9):
        assert expected_tree_tokens((1,) * k, (alpha, 0.99)) == pytest.approx(expected_tokens_per_cycle(alpha, k))


def test_tree_shapes_by_hand():
    assert expected_tree_tokens((2, 1), (0.8, 0.5)) == pytest.approx(1 + 0.5 + 0.5 * 0.8)
    assert node_count((3, 2, 1)) == 3 + 6 + 6 and fed_widths((3, 2, 1)) == [1, 3, 6]
    family = tree_family()
    assert (3, 2, 1) in family and (2, 3) not in family and (1, 1) not in family and (4, 4, 4) not in family
    assert all(node_count(b) <= 64 and max(b) >= 2 and list(b) == sorted(b, reverse=True) for b in family)


# ---------------------------------------------------------------- the measured curve

def test_the_curve_interpolates_between_measured_widths_and_never_beyond():
    curve = costs_of(calibration([0.010, 0.012, 0.020, 0.040], widths=[1, 2, 4, 8])).verify
    assert curve.at(2) == 0.012 and curve.at(3) == pytest.approx(0.016) and curve.at(6) == pytest.approx(0.030)
    assert curve.at(8) == 0.040 and curve.at(9) is None and curve.at(0) is None
    assert WidthCurve((1,), (0.01,)).at(1) == 0.01


def test_chains_agree_with_the_k_advisor_at_measured_widths():
    cal = calibration([0.010 + 0.003 * w for w in range(1, 10)], widths=list(range(1, 10)), draft=0.002)
    chains = chain_candidates(0.7, costs_of(cal))
    refined = [a.refined for a in advise_k(0.7, 0.002, calibration_of({"calibration": cal}), list(range(1, 9)))]
    assert [c.speedup for c in chains] == pytest.approx(refined)


# ---------------------------------------------------------------- the pick

def test_a_flat_verify_curve_picks_a_wide_tree():
    advice = advise_tree(A, FLAT)
    assert advice.best.kind == TREE and advice.best.nodes >= 16 and advice.best.speedup > advice.best_chain.speedup
    assert advice.sentence.startswith(f"Draft a tree {advice.best.text} ({advice.best.nodes} nodes): predicted "
                                      f"{advice.best.speedup:.2f}x") and "The best chain, K=" in advice.sentence


def test_a_steep_verify_curve_picks_a_chain_or_plain_decoding():
    advice = advise_tree(A, STEEP)  # the same a(B) as the flat machine: only the curve differs
    assert advice.best.kind == CHAIN and advice.best.speedup > 1 and advice.best.speedup > advice.best_tree.speedup
    assert advice.sentence.startswith(f"Draft a chain, {advice.best.text}: predicted")
    dear = advise_tree((0.5, 0.6, 0.65, 0.7), calibration([0.010 + 0.004 * w for w in WIDE], draft=0.006))
    assert dear.best.kind == PLAIN and dear.best.depth == 0
    assert dear.best_chain.speedup < 1 and dear.best_tree.speedup < 1
    assert dear.sentence.startswith("Decode plainly (K=0): no tree or chain beats plain decoding")
    assert f"{dear.best_tree.speedup:.2f}x" in dear.sentence


def test_no_tree_wider_than_the_measured_widths_is_considered():
    chain_only = calibration([0.011] * 9, widths=list(range(1, 10)))  # what calibrate() measures
    costs = costs_of(chain_only)
    trees = tree_candidates(A, costs, tree_family())
    assert trees and max(t.nodes for t in trees) + 1 == 9
    assert advise_tree(A, chain_only).best.nodes + 1 <= 9  # flat: it would take a wider tree if measured
    gap = calibration([0.011] * 10, widths=[*range(1, 10), 16])  # 10..15 interpolated, nothing past 16
    assert max(t.nodes for t in tree_candidates(A, costs_of(gap), tree_family())) + 1 == 16


def test_a_measured_draft_curve_prices_each_level_and_bounds_the_widest_one():
    steep_draft = calibration([0.011] * len(WIDE), draft_positions=[1, 2, 3, 4],
                              draft_s=[0.001, 0.004, 0.008, 0.012])
    costs = costs_of(steep_draft)
    trees = tree_candidates(A, costs, tree_family())
    assert trees and all(max(fed_widths(t.branching)) <= 4 for t in trees)
    two = next(t for t in trees if t.branching == (2, 2))  # forwards over 1 and 2 nodes, verify over 7
    assert two.cycle_steps == pytest.approx((0.001 + 0.004 + 0.011) / 0.010)
    with pytest.raises(ValueError, match="draft_positions"):
        costs_of({**steep_draft, "draft_s": [0.001]})
    with pytest.raises(ValueError, match="malformed"):
        costs_of({**steep_draft, "draft_positions": None})


# ---------------------------------------------------------------- measuring and the pilot (real tiny models)

@pytest.fixture(scope="module")
def pair():
    return noisy_pair(0, noise=0.1)  # a draft close enough to the target to be accepted sometimes


def test_every_width_is_timed_at_its_own_width_even_past_the_context(pair, monkeypatch):
    seen = []
    real_step = calibrate_module._step
    monkeypatch.setattr(calibrate_module, "_step", lambda m, c, ids, *a: seen.append(len(ids)) or real_step(m, c, ids, *a))
    time_widths(pair.target, [1, 2], [1, 5, 9], SpecSettings(), repeats=1, draw=False)
    assert sorted(set(seen)) == [1, 5, 9]  # a context of 2 once fed 2 positions for widths 5 and 9


def test_tree_calibration_adds_widths_and_a_draft_curve_and_leaves_calibrate_as_it_was(pair):
    s = SpecSettings(k=3, max_new_tokens=8)
    chain = calibrate(pair, [1, 2, 3], s, repeats=1)
    assert set(chain) == {"cache_len", "repeats", "threads", "target_step_s", "draft_step_s", "verify_positions",
                          "verify_s"} and chain["verify_positions"] == list(range(1, 10))
    tree = calibrate_widths(pair, [1, 2, 3], s, [1, 2, 8, 24], repeats=1, draft_widths=[1, 4])
    assert tree["verify_positions"] == [1, 2, 8, 24] and len(tree["verify_s"]) == 4
    assert tree["draft_positions"] == [1, 4] and tree["draft_s"][0] == tree["draft_step_s"]
    assert costs_of(tree).draft.at(3) is not None and costs_of(tree).verify.at(25) is None
    with pytest.raises(ValueError, match="include 1"):
        calibrate_widths(pair, [1, 2, 3], s, [1, 2], repeats=1, draft_widths=[2, 4])


@pytest.fixture(scope="module")
def greedy_pilot(pair):
    s = SpecSettings(k=3, temperature=0.0, max_new_tokens=16, seed=1)
    cycles, listed = pilot_cycles(pair, [1, 2, 4, 6], s, 16)
    return s, cycles, listed


def test_a_greedy_pilot_ranks_the_draft_at_the_positions_the_chain_tested(greedy_pilot):
    s, cycles, listed = greedy_pilot
    assert listed >= 4 and sum(len(c["committed_token_ids"]) for c in cycles) == 16
    for c in cycles:
        assert len(c["draft_top"]) == min(c["num_accepted"] + 1, len(c["committed_token_ids"]) + 1)
        for i, row in enumerate(c["draft_top"]):
            assert [e["p"] for e in row] == sorted((e["p"] for e in row), reverse=True) and len(row) > 1
            if i < len(c["draft_token_ids"]):  # the greedy chain drafted the draft's argmax: row 0 of the ranking
                assert row[0]["token_id"] == c["draft_token_ids"][i]
            if i < len(c["committed_token_ids"]):  # at T=0 the target's only listed token is what was committed
                assert [e["token_id"] for e in c["target_top"][i]] == [c["committed_token_ids"][i]]
    acc = acceptance_by_branching(cycles, listed)
    assert acc.low == acc.high  # greedy: the target's rows are one-hot, nothing is unknown
    assert all(round(a * acc.positions, 9).is_integer() for a in acc.low) and list(acc.low) == sorted(acc.low)
    drafted_tested = sum(min(c["num_accepted"] + 1, len(c["draft_token_ids"])) for c in cycles)
    assert acc.chain_alpha == pytest.approx(sum(c["num_accepted"] for c in cycles) / drafted_tested)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_plan_tree_on_a_real_pair_is_well_formed(pair, temperature):
    s = SpecSettings(k=3, temperature=temperature, max_new_tokens=16, seed=1)
    cal = calibrate_widths(pair, [1, 2, 4, 6], s, TREE_WIDTHS, repeats=1, draft_widths=[1, 2, 4, 8, 16, 32])
    plan = plan_tree(pair, [1, 2, 4, 6], s, cal, tokens=16)
    acc, best = plan.acceptance, plan.advice.best
    assert 0 < acc.positions and all(0 <= lo <= hi <= 1 for lo, hi in zip(acc.low, acc.high))
    assert list(acc.low) == sorted(acc.low) and plan.pilot_tokens == 16
    assert plan.advice.trees_rated > 0 and plan.advice.best_chain is not None
    assert plan.plain == (best.kind == PLAIN) and plan.k == best.depth
    if best.kind == TREE:
        assert plan.tree == parse_tree(best.text) and best.nodes + 1 <= 65
        assert max(fed_widths(best.branching)) <= 32
    else:
        assert plan.tree is None
    assert plan.sentence.startswith(plan.advice.sentence) and f"{acc.positions} pilot positions" in plan.sentence


def test_plan_tree_needs_a_draft_model(pair):
    lookup = Pair(pair.target, None, set(), PromptLookupDrafter(pair.target.full_vocab_size))
    with pytest.raises(ValueError, match="draft model"):
        plan_tree(lookup, [1, 2, 4, 6], SpecSettings(k=2, max_new_tokens=8), FLAT)
