"""Was a trace recorded on a quiet machine? Its own timings say.

On an idle machine the verify passes of one run cost about the same: same model, same
widths. Another process taking the core shows as verify passes many times the run's
median (a class once saw 4.2 s cycles in a trace whose others took 45 ms). Such a trace
teaches a wrong speed, so the bundled traces must pass this rule, the recording script
re-records those that fail, and the app says so when a trace fails it.
"""
import statistics

from engine.trace import Trace

MAX_VERIFY_OVER_MEDIAN = 3.0  # no cycle's verify pass (or whole cycle) may take more than 3x the trace's median


def _over_median(trace: Trace, field: str) -> set[int]:
    times = [c[field] for c in trace.cycles]
    if not times:
        return set()
    limit = MAX_VERIFY_OVER_MEDIAN * statistics.median(times)
    return {c["cycle"] for c in trace.cycles if c[field] > limit}


def loud_cycles(trace: Trace) -> list[int]:
    """Cycle numbers whose verify pass, or whole cycle, took more than MAX_VERIFY_OVER_MEDIAN x
    the trace's median of that time: the outliers the stepper marks. A cycle's time barely
    depends on how many tokens it accepted (it always drafts K and verifies K+1), so 3x is a
    stall, never the method."""
    return sorted(_over_median(trace, "verify_time_s") | _over_median(trace, "cycle_time_s"))


def median_cycle_s(trace: Trace) -> float:
    """The trace's median cycle time, which the stepper compares each cycle's time with."""
    return statistics.median(c["cycle_time_s"] for c in trace.cycles) if trace.cycles else 0.0


def verify_seconds_per_position(trace: Trace) -> float:
    """Median over cycles of the verify pass's time per scored position (K + 1 of them, or a
    tree's nodes + 1), a figure that traces of one target at different K should roughly share."""
    return statistics.median(c["verify_time_s"] / c["verify_positions"] for c in trace.cycles)


def quiet_words(trace: Trace) -> str | None:
    """Why this trace's timings cannot be trusted, or None when it passes the rule."""
    loud = loud_cycles(trace)
    if not loud:
        return None
    return (f"{len(loud)} of {len(trace.cycles)} cycles (first: cycle {loud[0]}) took over "
            f"{MAX_VERIFY_OVER_MEDIAN:g}x the median time (verify pass or whole cycle): the machine was busy "
            "while this trace was recorded, so its timings and speedups are not a measurement of the method.")
