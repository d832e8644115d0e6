"""Small Streamlit helpers the teaching pages share: charts and links into the stepper."""
import time
from contextlib import contextmanager
from urllib.parse import urlencode

import streamlit as st

from app.ui import jobs
from app.ui import state

STEPPER = "views/stepper.py"
ROLLBACK_DEMO = "views/rollback_demo.py"
EXACTNESS_LAB = "views/exactness_lab.py"
WALKTHROUGH = "views/walkthrough.py"
INTERVIEW = "views/interview.py"
STATISTICS = "views/statistics.py"


def chart(fig, key: str | None = None, **kwargs):
    """Show a figure (every page draws through here); in the light theme, text drawn on cells gets
    full-contrast ink (Streamlit's Plotly theme greys it, too faint on coloured cells)."""
    if st.context.theme.type == "light":
        fig.update_traces(textfont_color="#1b1d26", selector=dict(mode="text"))
    return st.plotly_chart(fig, key=key, config={"displaylogo": False}, **kwargs)


def stepper_query(cycle: int, stage: int) -> dict[str, str] | None:
    """The stepper's deep-link parameters for the open trace, or None without one."""
    ref = state.current_ref()
    if ref is None:
        return None
    return {"trace": ref.token, "cycle": str(cycle), "stage": str(stage)}


def open_in_stepper(cycle: int, stage: int, key: str, label: str | None = None) -> None:
    """A button that opens the stepper at this cycle and stage in this session, and a
    plain link with the same parameters that opens it in a new tab (shareable).

    The stepper reads trace/cycle/stage from the URL only when a session starts, so
    within a session the button sets the step itself before switching page.
    """
    query = stepper_query(cycle, stage)
    if query is None:
        return
    cols = st.columns([2, 3], vertical_alignment="center")
    if cols[0].button(label or f"Open cycle {cycle} at stage {stage} in the stepper", key=key,
                      icon=":material/play_circle:"):
        state.set_step(cycle, stage)
        st.switch_page(STEPPER, query_params=query)
    cols[1].markdown(f"[or in a new tab](./?{urlencode(query)})", help="A link that reopens this exact view.")


# ---------------------------------------------------------------- live runs: progress and estimate

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
    estimate, then `on_done(result, seconds)`. False if this session is already busy."""
    def timed(report):
        start = time.perf_counter()
        with one_torch_thread():
            result = work(lambda fraction: report(fraction, "running"))
        return result, time.perf_counter() - start

    def done(out) -> None:
        result, seconds = out
        st.session_state.setdefault(RATES, {})[(page, pair_key)] = seconds / max(units, 1)
        on_done(result, seconds)

    return jobs.start(job_name(page), label, timed, done) is not None


def show_live(page: str) -> bool:
    """Where the page shows its live run: progress while it runs, the error if it failed.
    True while it runs (the page then has nothing new to show yet)."""
    jobs.show(job_name(page))
    return jobs.running(job_name(page))
