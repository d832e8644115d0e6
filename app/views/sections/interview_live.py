"""What the interview page's answers point at: a cycle of the open trace, the trace's own c, and
measurements made on request on a real model pair (never on open), run on a worker thread.

Shared by every question module (interview_*.py); the numbers come from the engine.
"""
import streamlit as st

from app.runs import teaching_pair
from app.ui import jobs, state
from app.ui.live_work import one_torch_thread
from engine.cycle.pair import Pair
from engine.stats.repeats import Repeated
from engine.teaching.runs import forward_times
from engine.trace import Trace

MEASURED = "iv_measured"  # session_state: {name: result} of the measurements made on request


# ---------------------------------------------------------------- picking cycles of the open trace

def find_cycle(trace: Trace | None, wanted) -> dict | None:
    return next((c for c in trace.cycles if wanted(c)), None) if trace else None


def needs_trace() -> None:
    st.caption("Open a trace (**Choose a trace**) to see this on real cycles.")


def trace_c() -> float | None:
    """The open trace's c, as Statistics and speed shows it (engine/stats/analysis.py); None
    without a step-time calibration."""
    stats = state.current_stats()
    return stats.speed.c if stats is not None and stats.speed is not None else None


# ---------------------------------------------------------------- live measurements (on request)

def timings(pair: Pair, prefix: list[int], k: int) -> list[Repeated]:
    with one_torch_thread():
        return forward_times(pair.target, prefix, k + 1)


def live_pair() -> tuple[teaching_pair.PairChoice, Pair] | None:
    """The first available teaching pair, loaded once; None if there is none."""
    options = teaching_pair.choices()
    if not options:
        st.caption("No model pair is available for the live measurement on this machine.")
        return None
    pair = teaching_pair.load(options[0])
    return (options[0], pair) if pair else None


def measured(name: str, label: str, measure) -> object | None:
    """A result measured in this session, or a button that measures it now on a worker thread
    (nothing runs on open): `measure(choice, pair)` runs there and its result is kept by name."""
    found = st.session_state.get(MEASURED, {})
    if name not in found:
        if st.button(label, key=f"iv_measure_{name}", icon=":material/timer:"):
            live = live_pair()
            if live is not None:
                choice, pair = live
                jobs.start(f"interview:{name}", f"{label.removesuffix(' now')} on {choice.key}",
                           lambda report: measure(choice, pair), lambda result: keep_measured(name, choice.label, result),
                           alone=True)
        jobs.show(f"interview:{name}")
    return st.session_state.get(MEASURED, {}).get(name)


def keep_measured(name: str, pair_label: str, result) -> None:
    st.session_state.setdefault(MEASURED, {})[name] = (pair_label, result)
