"""Live work (runs, teaching demos, measurements) on a background thread, so the page stays usable.

One job per session at a time; across sessions the server's queue (app/ui/job_queue.py) runs
a few at once (SPECLAB_MAX_JOBS, app/ui/operator.py) and lets the others wait their turn, first
in first out, each visitor seeing their place, an estimate and a cancel button. A job that
times things (`alone=True`) runs with nothing beside it. A page starts one with
`start(name, label, work, on_done)`: `work(report)` is a plain engine call run on a worker
thread; it may call `report(fraction, text)`, and `report(fraction, text, partial)` to hand over
plain data that shows the work so far (the text generated yet, say). The worker only sets plain
attributes on the Job, never calls st.*: Streamlit's elements and session state belong to the
script thread. `show(name, draw_partial)` draws the job's place in the queue or its progress
(and `draw_partial(partial)`) from a fragment that polls it and, once the work has ended, hands
the result to `on_done` on the script thread, which stores it where the page reads it
(assignments only: it may run twice, see `show`), and reruns the page.

If the user leaves the page, the thread keeps working; the page collects the result the
next time it is drawn. If the user closes the tab, the queue drops the job. A failure becomes
an error message; nothing stored earlier is lost. On a read-only server nothing starts.
"""
import threading
from typing import Any, Callable

import streamlit as st

from app.ui import operator, state
from app.ui.job_queue import CANCELLED, WAITING, Job, JobQueue, Report, Stopped  # noqa: F401 (for pages and tests)
from app.ui.safe import md

JOB = "background_job"  # session_state: the session's one Job (waiting, running, not yet collected, or failed)
# How often the progress fragment looks at a running job. Each look reruns the fragment and
# redraws it in the browser, which costs CPU that a timed run needs: polling every 0.5 s made a
# live run's cycles 1.55x as long as the same run from the command line, polling every 2 s
# 0.83x (bench/results/live-speed-experiments.md; with this schedule 1.09x, 0.80-1.38 over five
# repeats, bench/results/live-speed.md: AMD EPYC, 2 cores, the browser on the same machine).
# So a job is looked at often while it is young (a measurement under a second shows at once)
# and seldom once it has run FAST_FOR_S. A job waiting in the queue is looked at seldom too:
# a class's waiting visitors must not take the CPU from the job that runs.
POLL_S = 0.5
SLOW_POLL_S = 2.0
FAST_FOR_S = 2.0
BUSY = "One live run or measurement at a time"  # the start of the words that refuse a second job

_QUEUE: list[JobQueue] = []  # the server's one queue, made on first use (SPECLAB_MAX_JOBS read then)
_QUEUE_LOCK = threading.Lock()


def session_alive(session: str) -> bool:
    """Whether a browser is connected to this Streamlit session now (Runtime.is_active_session is
    safe from any thread). Outside a server (AppTest, plain Python) there is nobody to ask: alive."""
    from streamlit.runtime import Runtime

    return not Runtime.exists() or Runtime.instance().is_active_session(session)


def queue() -> JobQueue:
    with _QUEUE_LOCK:
        if not _QUEUE:
            _QUEUE.append(JobQueue(operator.max_jobs(), session_alive))
        return _QUEUE[0]


def session_id() -> str:
    from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

    ctx = get_script_run_ctx()
    return ctx.session_id if ctx is not None else ""


def current() -> Job | None:
    return st.session_state.get(JOB)


def running(name: str) -> bool:
    """Whether this session's job called `name` is still waiting or working."""
    job = current()
    return job is not None and job.name == name and job.running


def start(name: str, label: str, work: Callable[[Report], Any], on_done: Callable[[Any], None],
          alone: bool = False, kind: str = "", expected_s: float | None = None) -> Job | None:
    """Queue `work` for a worker thread; None (and a message) if this session already has a job,
    or the server is read-only. `alone`: the work times things, so nothing runs beside it.
    `kind` groups jobs for the queue's estimates (default: the name); `expected_s` is the
    starter's own estimate of the work's seconds, if it has one."""
    if operator.read_only():
        st.info(operator.READ_ONLY_WORDS, icon=":material/lock:")
        return None
    job = current()
    if job is not None and job.running:
        st.warning(f"{BUSY}: **{md(job.label)}** is still running "
                   f"({job.fraction:.0%} done). Start this one when it has finished.", icon=":material/hourglass:")
        return None
    job = Job(name, label, on_done, session=session_id(), alone=alone, kind=kind, expected_s=expected_s)
    st.session_state[JOB] = job
    q = queue()
    q.submit(job, on_threads(work, operator.job_threads(q.limit)))
    return job


def on_threads(work: Callable[[Report], Any], threads: int | None) -> Callable[[Report], Any]:
    """`work` with torch on `threads` threads (set for the whole process: every job sets the same
    number, so no job undoes another's; pages never use torch); None leaves torch as it is."""
    def run(report: Report) -> Any:
        import torch  # here, on the worker thread: the stepper opens without torch

        if threads is not None and torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        return work(report)
    return run


def cancel() -> None:
    """The cancel button's callback: this session's job leaves the queue, or stops at its next step."""
    job = current()
    if job is not None and job.running:
        queue().cancel(job)


def queue_words(job: Job) -> str:
    q = queue()
    place, wait = q.place(job), q.wait_estimate_s(job)
    if place is None:  # it has just started
        return f"{job.label}: starting."
    n_running, n_waiting = q.counts()
    return (f"{job.label}: waiting, number {place} in this server's queue ({n_running} running, {n_waiting} "
            f"waiting; {q.limit} at a time)"
            + (f"; it should start in about {wait:.0f} s" if wait is not None else "; no estimate yet")
            + ". The page stays usable meanwhile.")


def progress_words(job: Job) -> str:
    elapsed = job.elapsed_s()
    left = job.seconds_left()
    return (f"{job.label}: {job.text}, {job.fraction:.0%} done after {elapsed:.0f} s"
            + (f"; about {left:.0f} s left" if left is not None else "")
            + ("; stopping at its next step" if job.stopped else "")
            + ". The page stays usable meanwhile.")


def poll_interval(job: Job) -> float:
    """Seconds between looks at `job`: POLL_S while it is young, SLOW_POLL_S after FAST_FOR_S
    and while it waits in the queue."""
    return POLL_S if not job.waiting and job.elapsed_s() < FAST_FOR_S else SLOW_POLL_S


def _draw_progress(name: str, draw_partial: Callable[[Any], None] | None, interval: float) -> None:
    """The fragments' body: the whole page reruns once the work has ended (to take its result),
    and once the job has outgrown its polling interval (to be polled at the slower one)."""
    job = current()
    if job is None or job.name != name or not job.running or poll_interval(job) != interval:
        st.rerun(scope="app")
    if job.waiting:
        st.progress(0.0, text=queue_words(job))
    else:
        st.progress(job.fraction, text=progress_words(job))
    if not job.stopped:
        st.button("Cancel", key="job_cancel", on_click=cancel, icon=":material/cancel:",
                  help="Leave the queue, or stop the work at its next step. Nothing stored earlier is lost.")
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
    """Where a page section shows its job: its place in the queue while it waits, progress while
    it runs (and `draw_partial` of the work so far, if the work hands some over), the error if
    it failed.

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
    if job.stopped is not None:  # cancelled, or dropped while the tab was away: say so once
        del st.session_state[JOB]
        st.info(f"{md(job.label)}: {'cancelled' if job.stopped == CANCELLED else 'stopped, ' + job.stopped}. "
                "Nothing stored earlier was lost.", icon=":material/cancel:")
        return None
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
