"""Live work a page starts (a teaching run, a measurement): on app/ui/jobs.py's worker thread,
with its progress, an estimate of the time left, and torch on one thread."""
import time
from contextlib import contextmanager

import streamlit as st

from app.ui import jobs

RATES = "live_rates"  # session_state: {(page, pair key): seconds per unit of work measured here}


@contextmanager
def one_torch_thread():
    """Small models on a shared CPU run many times faster on one thread: with two threads each
    tiny matrix product waits for a core that another process holds (25x slower measured under load)."""
    import torch  # here, not at the top: the stepper imports this module and must open without torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def estimate_s(page: str, pair_key: str, units: float, stored_rate: float | None) -> float | None:
    """Seconds a live run of `units` of work should take: from this session's last run of the page
    and pair if there was one, else from the rate stored with the precomputed results."""
    rate = st.session_state.get(RATES, {}).get((page, pair_key), stored_rate)
    return None if rate is None else rate * units


def estimate_words(seconds: float | None) -> str:
    if seconds is None:
        return "time unknown on this pair (no earlier run to go by)"
    return f"about {seconds:.0f} s here" if seconds >= 1 else "under a second"


def job_name(page: str) -> str:
    """The name of a teaching page's live run in app/ui/jobs.py."""
    return f"teaching:{page}"


def start_live(page: str, pair_key: str, units: float, label: str, work, on_done) -> bool:
    """Run `work(on_progress)` on a worker thread (app/ui/jobs.py; `show_live` draws its progress and
    the time left). Once it has ended, on the script thread: remember the rate for the next
    estimate (unless other jobs ran beside it: a time under load is no estimate), then
    `on_done(result, seconds)`. False if this session is already busy. Teaching runs time
    nothing the page calls a measurement, so they share the server with other jobs."""
    def timed(report):
        start = time.perf_counter()
        with one_torch_thread():
            result = work(lambda fraction: report(fraction, "running"))
        return result, time.perf_counter() - start

    def done(out) -> None:
        result, seconds = out
        job = jobs.current()  # still the session's job while it is handed over
        if job is None or job.company == 0:
            st.session_state.setdefault(RATES, {})[(page, pair_key)] = seconds / max(units, 1)
        on_done(result, seconds)

    return jobs.start(job_name(page), label, timed, done, expected_s=estimate_s(page, pair_key, units, None)) is not None


def show_live(page: str) -> bool:
    """Where the page shows its live run: progress while it runs, the error if it failed.
    True while it runs (the page then has nothing new to show yet)."""
    jobs.show(job_name(page))
    return jobs.running(job_name(page))
