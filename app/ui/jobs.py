"""Live work (runs, teaching demos, measurements) on a background thread, so the page stays usable.

One job per session at a time, and one running on the whole server (TURN): work side by
side would slow each other, and timings taken meanwhile would be wrong. A page starts one
with `start(name, label, work, on_done)`: `work(report)` is a plain engine call run on a worker thread; it may call
`report(fraction, text)`, and `report(fraction, text, partial)` to hand over plain data that
shows the work so far (the text generated yet, say). The worker only sets plain attributes
on the Job, never calls st.*: Streamlit's elements and session state belong to the script
thread. `show(name, draw_partial)` draws the job's progress (and `draw_partial(partial)`)
from a fragment that polls it and, once the work has ended, hands the result to `on_done`
on the script thread, which stores it where the page reads it (assignments only: it may
run twice, see `show`), and reruns the page.

If the user leaves the page, the thread keeps working; the page collects the result the
next time it is drawn. A failure becomes an error message; nothing stored earlier is lost.
"""
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import streamlit as st

from app.ui import state
from app.ui.safe import md

JOB = "background_job"  # session_state: the session's one Job (running, not yet collected, or failed)
# How often the progress fragment looks at a running job. Each look reruns the fragment and
# redraws it in the browser, which costs CPU that a timed run needs: polling every 0.5 s made a
# live run's cycles 1.55x as long as the same run from the command line, polling every 2 s
# 0.83x (bench/results/live-speed-experiments.md; with this schedule 1.09x, 0.80-1.38 over five
# repeats, bench/results/live-speed.md: AMD EPYC, 2 cores, the browser on the same machine).
# So a job is looked at often while it is young (a measurement under a second shows at once)
# and seldom once it has run FAST_FOR_S.
POLL_S = 0.5
SLOW_POLL_S = 2.0
FAST_FOR_S = 2.0
BUSY = "One live run or measurement at a time"  # the start of the words that refuse a second job

# One job at a time on the whole server, whichever session started it: jobs time things
# (live runs record their step times), and two at once on a small machine slow each other
# and make both timings wrong. The others wait their turn; their progress says so.
TURN = threading.Lock()
WAITING = "waiting for another visitor's live run or measurement to finish"

Report = Callable[..., None]  # (fraction done, what is running now[, the work so far as plain data])


@dataclass
class Job:
    name: str  # which page section owns it: only that section shows it and takes its result
    label: str  # what runs, in words ("Timing the step times", "Live run on tiny-shakespeare")
    on_done: Callable[[Any], None]  # stores the result for the page; runs on the script thread
    started: float = field(default_factory=time.perf_counter)
    fraction: float = 0.0
    text: str = "starting"
    partial: Any = None  # plain data the work hands over as it goes, for the page to show
    result: Any = None
    error: str | None = None
    finished: threading.Event = field(default_factory=threading.Event)

    @property
    def running(self) -> bool:
        return not self.finished.is_set()

    def report(self, fraction: float, text: str = "", partial: Any = None) -> None:
        """Called by the work on the worker thread: plain attributes only (`partial` is replaced
        whole, never changed in place, so the page never reads it half written)."""
        self.fraction = min(max(float(fraction), 0.0), 1.0)
        self.text = text or self.text
        if partial is not None:
            self.partial = partial

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started

    def seconds_left(self) -> float | None:
        """From the time so far and the fraction done; None until the fraction says something."""
        if self.fraction <= 0.02:
            return None
        return (time.perf_counter() - self.started) * (1 - self.fraction) / self.fraction

    def run(self, work: Callable[[Report], Any]) -> None:
        """The worker thread's body: waits its turn on this server, then works."""
        try:
            self.text = WAITING
            with TURN:
                self.started, self.text = time.perf_counter(), "starting"
                self.result = work(self.report)
        except Exception as err:  # noqa: BLE001 - any failure is shown to the user, never lost in a thread
            traceback.print_exc()
            self.error = f"{type(err).__name__}: {err}"
        finally:
            self.fraction = 1.0
            self.finished.set()


def current() -> Job | None:
    return st.session_state.get(JOB)


def running(name: str) -> bool:
    """Whether this session's job called `name` is still working."""
    job = current()
    return job is not None and job.name == name and job.running


def start(name: str, label: str, work: Callable[[Report], Any], on_done: Callable[[Any], None]) -> Job | None:
    """Start `work` on a worker thread; None (and a message) if this session already runs something."""
    job = current()
    if job is not None and job.running:
        st.warning(f"{BUSY}: **{md(job.label)}** is still running "
                   f"({job.fraction:.0%} done). Start this one when it has finished.", icon=":material/hourglass:")
        return None
    job = Job(name, label, on_done)
    st.session_state[JOB] = job
    threading.Thread(target=job.run, args=(work,), name=f"speclab-job-{name}", daemon=True).start()
    return job


def progress_words(job: Job) -> str:
    elapsed = job.elapsed_s()
    left = job.seconds_left()
    return (f"{job.label}: {job.text}, {job.fraction:.0%} done after {elapsed:.0f} s"
            + (f"; about {left:.0f} s left" if left is not None else "")
            + ". The page stays usable meanwhile.")


def poll_interval(job: Job) -> float:
    """Seconds between looks at `job`: POLL_S while it is young, SLOW_POLL_S after FAST_FOR_S."""
    return POLL_S if job.elapsed_s() < FAST_FOR_S else SLOW_POLL_S


def _draw_progress(name: str, draw_partial: Callable[[Any], None] | None, interval: float) -> None:
    """The fragments' body: the whole page reruns once the work has ended (to take its result),
    and once the job has outgrown its polling interval (to be polled at the slower one)."""
    job = current()
    if job is None or job.name != name or not job.running or poll_interval(job) != interval:
        st.rerun(scope="app")
    st.progress(job.fraction, text=progress_words(job))
    partial = job.partial  # read once: the worker may replace it meanwhile
    if draw_partial is not None and partial is not None:
        draw_partial(partial)


@st.fragment(run_every=POLL_S)
def _poll_often(name: str, draw_partial: Callable[[Any], None] | None) -> None:
    _draw_progress(name, draw_partial, POLL_S)


@st.fragment(run_every=SLOW_POLL_S)
def _poll_seldom(name: str, draw_partial: Callable[[Any], None] | None) -> None:
    _draw_progress(name, draw_partial, SLOW_POLL_S)


def show(name: str, draw_partial: Callable[[Any], None] | None = None) -> Job | None:
    """Where a page section shows its job: progress while it runs (and `draw_partial` of the
    work so far, if the work hands some over), the error if it failed.

    On the first script run after the work succeeded, `on_done` gets the result and the page
    reruns, so everything drawn above this point sees it. Returns the job shown, if any."""
    job = current()
    if job is None or job.name != name:
        if job is not None and job.running:
            st.caption(f"{md(job.label)} is running elsewhere in this session ({job.fraction:.0%} done).")
        return None
    if job.running:
        (_poll_often if poll_interval(job) == POLL_S else _poll_seldom)(name, draw_partial)
        return job
    if job.error is None:  # done: hand the result over, then forget the job
        # Every session-state access is a point where Streamlit may cut this run short for a
        # pending rerun (the polling fragment sends them). So the job is forgotten only after
        # on_done has stored its result: cut anywhere, the next run hands it over again.
        # Each on_done only assigns session-state entries, so a second call changes nothing.
        job.on_done(job.result)
        del st.session_state[JOB]
        st.rerun()
    st.error(f"{md(job.label)} failed: {md(state.shown_paths(job.error)[:400])}. Nothing stored earlier "
             "was lost; try again.", icon=":material/error:")
    return job
