"""The numbers the pages state, computed in the engine and app/figures rather than on the pages,
checked on hand-built records: each function gives what the page used to work out in place."""
from types import SimpleNamespace

import pytest
import torch

from app.figures.acceptance import (
    STEPPER_COLUMNS,
    STEPPER_GREEDY_COLUMNS,
    TEST_TABLE_WIDTHS,
    WALKTHROUGH_COLUMNS,
    position_rows,
)
from engine.stats.analysis import (
    Calibration,
    acceptance_lengths,
    drafted_positions,
    extra_position_in_steps,
    median_draft_step_s,
)
from engine.stats.calibrate import median_calibration
from engine.stats.repeats import Repeated, disagreeing, untrustworthy_widths, widest_spread, width_cost_ratio
from engine.stats.trees import committed_and_nodes_per_cycle
from engine.teaching.exactness import ChiSquare, LabResult
from engine.teaching.numerics import closest_tie
from engine.teaching.power import DEFAULT_SAMPLES, approximate_power, catch_chance, rule_distance, samples_for_result
from engine.teaching.rollback_facts import largest_target_drift, stale_cycle_to_show, wrong_cache_cycles


def chain_cycle(num_accepted: int, k: int = 3) -> dict:
    """A sampled chain cycle with K draft positions: u drawn up to the first rejection."""
    tested = k if num_accepted == k else num_accepted + 1
    return {"cycle": 0, "num_accepted": num_accepted, "draft_token_texts": ["a", " b", "c\n"][:k],
            "p_target": [0.5, 0.25, 0.125][:k], "p_draft": [0.5, 0.5, 0.25][:k], "accept_prob": [1.0, 0.5, 0.5][:k],
            "u": [0.1, 0.75, 0.2][:tested], "target_top": [[{"text": "a", "p": 0.5}], [{"text": "x", "p": 0.6}], []][:k],
            "beta": [0.9, 0.6, 0.3][:k], "draft_step_times_s": [0.003, 0.001, 0.002]}


def test_the_test_table_has_each_pages_columns():
    c = chain_cycle(1)
    stepper = position_rows(c, 3, STEPPER_COLUMNS)
    assert [list(r) for r in stepper] == [["pos", "draft token", "p_target", "p_draft", "min(1, ratio)", "u", "result"]] * 3
    assert stepper[1] == {"pos": 2, "draft token": "·b", "p_target": "0.250", "p_draft": "0.500",  # as the note prints them
                          "min(1, ratio)": "0.500", "u": "0.750", "result": "✗ rejected"}
    assert stepper[2]["u"] == "not drawn" and stepper[2]["result"] == "– discarded"
    greedy = position_rows(c, 3, STEPPER_GREEDY_COLUMNS)
    assert [r["target's argmax"] for r in greedy] == ["a", "x", "not drawn"]
    assert {h for r in stepper + greedy for h in r} <= set(TEST_TABLE_WIDTHS)  # every column has its width
    walkthrough = position_rows(c, 3, WALKTHROUGH_COLUMNS)
    assert walkthrough[0] == {"position": 1, "draft token": "a", "p_target": 0.5, "p_draft": 0.5,
                              "min(1, p_target/p_draft)": 1.0, "u": "0.100", "result": "accepted"}
    assert [r["result"] for r in walkthrough] == ["accepted", "rejected", "discarded (not tested)"]


def test_acceptance_numbers_of_a_trace():
    cycles = [chain_cycle(1), chain_cycle(3), dict(chain_cycle(0), draft_step_times_s=[], beta=[])]
    assert acceptance_lengths(cycles) == [2, 4, 1]
    assert drafted_positions(cycles) == 6
    assert median_draft_step_s(cycles[0]) == 0.002 and median_draft_step_s(cycles[2]) is None
    cal = Calibration(10, 0.01, 0.002, [1, 2, 3], [0.01, 0.012, 0.014])
    assert extra_position_in_steps(cal) == pytest.approx(0.2)


def test_closest_tie_is_the_smallest_top_two_gap_and_its_cycle():
    rows = [[{"p": 0.6}, {"p": 0.3}], [{"p": 0.41}, {"p": 0.4}], [{"p": 1.0}]]
    trace = SimpleNamespace(cycles=[{"cycle": 0, "target_top": rows[:1]}, {"cycle": 1, "target_top": rows[1:]}])
    gap, cycle = closest_tie(trace)
    assert gap == pytest.approx(0.01) and cycle == 1
    assert closest_tie(SimpleNamespace(cycles=[{"cycle": 0, "target_top": [[{"p": 1.0}]]}])) is None


def test_three_calibrations_become_their_medians_and_spreads():
    rounds = [{"cache_len": 9, "repeats": 7, "threads": 1, "target_step_s": t, "draft_step_s": t / 4,
               "verify_positions": [1, 2], "verify_s": [t, 2 * t]} for t in (0.010, 0.030, 0.011)]
    median, spread = median_calibration(rounds)
    assert median["target_step_s"] == 0.011 and median["draft_step_s"] == 0.011 / 4
    assert median["verify_s"] == [0.011, 0.022] and median["repeats"] == 21 and median["cache_len"] == 9
    assert list(spread) == ["target step", "draft step", "verify over 1", "verify over 2"]
    assert spread["target step"].times_s == (0.010, 0.030, 0.011)
    assert set(disagreeing(spread)) == set(spread)  # 0.010 to 0.030: far over MAX_SPREAD
    name, worst = widest_spread(spread)
    assert worst == max(r.spread for r in spread.values()) and spread[name].spread == worst


def test_forward_times_by_width():
    times = [Repeated((1.0, 1.0, 1.0)), Repeated((1.2, 1.2, 1.2)), Repeated((1.0, 3.0, 2.0))]
    assert untrustworthy_widths(times) == [3]
    assert width_cost_ratio(times, 2) == pytest.approx(1.2)


def test_a_tree_traces_tokens_and_nodes_per_cycle():
    cycles = [{"committed_token_ids": [1, 2, 3], "tree": {"nodes": [{}] * 6}},
              {"committed_token_ids": [4], "tree": {"nodes": [{}] * 3}}]
    assert committed_and_nodes_per_cycle(cycles) == (2.0, 4.5)


def lab(predicted: list[float] | None, exact: list[float], samples: int = 200) -> LabResult:
    test = ChiSquare(0.0, 1, 1.0, 2)
    return LabResult(1, samples, exact, predicted, [0, 0], [0, 0], test, test, 0.5)


def test_the_labs_verdict_on_a_result():
    exact = [0.5, 0.3, 0.2]
    assert rule_distance(lab(None, exact)) is None
    assert rule_distance(lab([0.6, 0.3, 0.1], exact)) == pytest.approx(0.1)
    assert catch_chance(lab(exact, exact)) is None  # a correct rule: nothing to catch
    broken = lab([0.7, 0.2, 0.1], exact, 400)
    assert catch_chance(broken) == approximate_power(torch.tensor(broken.predicted), torch.tensor(exact), 400, 0.01)
    assert samples_for_result(None) == samples_for_result(lab(None, exact)) == DEFAULT_SAMPLES
    assert samples_for_result(lab(exact, exact)) == DEFAULT_SAMPLES


def test_what_the_rollback_page_states():
    def probe(tv: float, stale: int) -> SimpleNamespace:
        return SimpleNamespace(target_tv=tv, target_cache=SimpleNamespace(num_stale=stale))

    bug = SimpleNamespace(cycles=[probe(0.0, 0), probe(0.3, 2), probe(0.1, 1), probe(0.2, 1)])
    static = SimpleNamespace(cycles=[SimpleNamespace(stale_slots=s) for s in (3, 1, 2, 2)])
    assert largest_target_drift(bug) == 0.3
    assert stale_cycle_to_show(bug, static) == 2  # the first with both kinds of leftovers
    assert stale_cycle_to_show(bug, SimpleNamespace(cycles=static.cycles[:2])) == 1  # none: cycle 2, or the last
    check = SimpleNamespace
    tree_run = SimpleNamespace(cycles=[check(target=check(matches=True), draft=check(matches=True)),
                                       check(target=check(matches=False), draft=check(matches=True)),
                                       check(target=check(matches=True), draft=check(matches=False))])
    assert wrong_cache_cycles(tree_run) == 2
