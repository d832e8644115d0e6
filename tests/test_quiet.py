"""engine/stats/quiet.py: a trace's own timings say whether its machine was busy."""
import copy
from pathlib import Path

from engine.stats.quiet import (
    MAX_VERIFY_OVER_MEDIAN,
    loud_cycles,
    median_cycle_s,
    quiet_words,
    verify_seconds_per_position,
)
from engine.trace import load_trace

DEFAULT = Path(__file__).resolve().parent.parent / "assets" / "traces" / "default.jsonl"


def with_verify_times(times: list[float]):
    trace = copy.deepcopy(load_trace(DEFAULT))
    trace.cycles[:] = [dict(c, verify_time_s=t) for c, t in zip(trace.cycles, times)]
    return trace


def test_one_stalled_verify_pass_marks_the_trace():
    trace = with_verify_times([0.05, 0.06, 0.05, 0.05 * MAX_VERIFY_OVER_MEDIAN * 1.1, 0.055])
    assert loud_cycles(trace) == [trace.cycles[3]["cycle"]]
    words = quiet_words(trace)
    assert words is not None and "1 of 5 cycles" in words and "busy" in words


def test_even_timings_pass_and_the_limit_itself_is_allowed():
    assert quiet_words(with_verify_times([0.05, 0.06, 0.05, 0.05 * MAX_VERIFY_OVER_MEDIAN, 0.055])) is None


def test_time_per_position_divides_by_the_scored_positions():
    trace = with_verify_times([0.05, 0.05, 0.05])
    positions = sorted(len(c["draft_token_ids"]) + 1 for c in trace.cycles)  # K + 1 scored per cycle
    assert verify_seconds_per_position(trace) == 0.05 / positions[1]  # the median of three


def test_a_cycle_stalled_outside_its_verify_pass_is_marked_too():
    # A stall in the draft steps leaves the verify time alone but triples the cycle's time.
    trace = copy.deepcopy(load_trace(DEFAULT))
    trace.cycles[:] = [dict(c, verify_time_s=0.05, cycle_time_s=0.1) for c in trace.cycles[:5]]
    trace.cycles[2]["cycle_time_s"] = 0.1 * MAX_VERIFY_OVER_MEDIAN * 1.1
    assert loud_cycles(trace) == [trace.cycles[2]["cycle"]]
    assert median_cycle_s(trace) == 0.1
