"""The server's queue of live work: every visitor's jobs, a few at a time, first in first out.

Plain Python, no Streamlit: app/ui/jobs.py is the Streamlit side (one job per session, its
progress, the cancel button), and tests/test_job_queue.py checks these rules directly.

- At most `limit` jobs run at once (app/ui/operator.py: SPECLAB_MAX_JOBS).
- The others wait in the order they came. The head of the queue starts first, even when a
  later job would fit: a job that must run alone is never overtaken for ever.
- A job that times things (`alone`: a measurement of step times, a K sweep, a live run that
  records its calibration) starts only when nothing else runs, and nothing starts beside it,
  so its times are of the work alone. Every other job counts the most jobs that ran beside
  it (`company`), for pages that want to say so.
- A visitor may cancel their job. A job whose browser tab has gone (its session has not been
  connected for `gone_after_s`) is dropped. Either way a waiting job leaves the queue at once
  and a running one stops at its next progress report (`Job.report` raises `Stopped`).
"""
import statistics
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

Report = Callable[..., None]  # (fraction done, what is running now[, the work so far as plain data])
Work = Callable[[Report], Any]

GONE_AFTER_S = 15.0  # a session unconnected this long is a closed tab, not a network blip (Streamlit reconnects in seconds)
SWEEP_S = 2.0  # how often the queue looks for closed tabs while it holds jobs
KEPT_DURATIONS = 8  # finished jobs of one kind the estimates go by
CANCELLED = "cancelled"
TAB_CLOSED = "its browser tab was closed"
WAITING = "waiting its turn"  # a queued job's text


class Stopped(Exception):
    """Raised inside the work, by `Job.report`, once the job was cancelled or its tab has gone."""


@dataclass
class Job:
    name: str  # which page section owns it: only that section shows it and takes its result
    label: str  # what runs, in words ("Timing the step times", "Live run on tiny-shakespeare")
    on_done: Callable[[Any], None]  # stores the result for the page; runs on the script thread
    session: str = ""  # the Streamlit session that started it; "" outside a server (never dropped)
    alone: bool = False  # it times things: runs with no other job beside it
    kind: str = ""  # what the estimates group it with (default: its name)
    expected_s: float | None = None  # the starter's own estimate of its running time, if it has one
    started: float = field(default_factory=time.perf_counter)  # reset when it leaves the queue
    fraction: float = 0.0
    text: str = "starting"
    partial: Any = None  # plain data the work hands over as it goes, for the page to show
    result: Any = None
    error: str | None = None
    stopped: str | None = None  # why it was stopped before its end (CANCELLED, TAB_CLOSED), else None
    waiting: bool = False  # in the queue, not yet started
    company: int = 0  # the most other jobs that ran beside it
    gone_since: float | None = None  # when its session was first seen unconnected (the queue's clock)
    finished: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.kind = self.kind or self.name

    @property
    def running(self) -> bool:
        """Not finished yet: waiting in the queue or working."""
        return not self.finished.is_set()

    def report(self, fraction: float, text: str = "", partial: Any = None) -> None:
        """Called by the work on the worker thread: plain attributes only (`partial` is replaced
        whole, never changed in place, so the page never reads it half written). Raises
        Stopped once the job should end, which ends the work there."""
        if self.stopped is not None:
            raise Stopped(self.stopped)
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

    def work_on(self, work: Work) -> None:
        """The work itself, on the worker thread; a failure becomes `error`, a stop ends it quietly."""
        self.started, self.text = time.perf_counter(), "starting"
        try:
            self.result = work(self.report)
        except Stopped:
            pass
        except Exception as err:  # noqa: BLE001 - any failure is shown to the user, never lost in a thread
            traceback.print_exc()
            self.error = f"{type(err).__name__}: {err}"
        finally:
            self.fraction = 1.0

    def run(self, work: Work) -> None:
        """Work on it here and mark it finished (a job run outside the queue, as tests do)."""
        self.work_on(work)
        self.finished.set()


def queue_wait_s(remaining: list[float], ahead: list[tuple[float, bool]], limit: int, alone: bool) -> float:
    """Seconds until a job can start: `remaining` are the running jobs' seconds left (one job that
    runs alone fills every slot), `ahead` the (duration, alone) of each job before it in the queue.
    Jobs take the slot that frees first; one that runs alone waits for all of them."""
    slots = sorted(remaining + [0.0] * (limit - len(remaining)))
    for duration, ahead_alone in ahead:
        if ahead_alone:
            slots = [max(slots) + duration] * limit
        else:
            slots.sort()
            slots[0] += duration
    return max(slots) if alone else min(slots)


class JobQueue:
    """The server's jobs: who runs, who waits, and for how long about (all under one lock)."""

    def __init__(self, limit: int, session_alive: Callable[[str], bool] = lambda session: True,
                 clock: Callable[[], float] = time.monotonic, gone_after_s: float = GONE_AFTER_S,
                 sweep_s: float | None = SWEEP_S) -> None:
        if limit < 1:
            raise ValueError(f"at least one job must be able to run, got a limit of {limit}")
        self.limit, self.gone_after_s, self.sweep_s = limit, gone_after_s, sweep_s
        self._alive, self._clock = session_alive, clock
        self._lock = threading.Lock()
        self._waiting: deque[tuple[Job, Work]] = deque()
        self._running: list[Job] = []
        self._durations: dict[str, deque[float]] = {}
        self._sweeper: threading.Thread | None = None

    # ------------------------------------------------------------ what pages ask

    def submit(self, job: Job, work: Work) -> None:
        """Queue `job`; it starts at once if the rules allow."""
        with self._lock:
            job.waiting, job.text = True, WAITING
            self._waiting.append((job, work))
            self._dispatch()
            self._keep_sweeping()

    def cancel(self, job: Job, reason: str = CANCELLED) -> None:
        """Stop `job`: out of the queue at once if it waits, at its next report if it runs."""
        with self._lock:
            self._stop(job, reason)
            self._dispatch()

    def place(self, job: Job) -> int | None:
        """1 for the head of the queue; None once it runs (or has ended)."""
        with self._lock:
            return next((i + 1 for i, (queued, _) in enumerate(self._waiting) if queued is job), None)

    def counts(self) -> tuple[int, int]:
        """(jobs running, jobs waiting) on this server."""
        with self._lock:
            return len(self._running), len(self._waiting)

    def wait_estimate_s(self, job: Job) -> float | None:
        """About how long until `job` starts; None while some job on its way has no estimate."""
        with self._lock:
            ahead = []
            for queued, _ in self._waiting:
                if queued is job:
                    break
                ahead.append(queued)
            else:
                return None
            remaining = [self._seconds_left(r) for r in self._running]
            durations = [self._expected_s(a) for a in ahead]
            alone_now = any(r.alone for r in self._running)
        if None in remaining or None in durations:
            return None
        if alone_now:
            remaining = [max(remaining)] * self.limit
        return queue_wait_s(remaining, [(d, a.alone) for d, a in zip(durations, ahead)], self.limit, job.alone)

    # ------------------------------------------------------------ closed tabs

    def sweep(self) -> None:
        """Drop every job whose session has not been connected for `gone_after_s`."""
        now = self._clock()
        with self._lock:
            for job in [j for j, _ in self._waiting] + list(self._running):
                if not job.session or self._alive(job.session):
                    job.gone_since = None
                elif job.gone_since is None:
                    job.gone_since = now
                elif now - job.gone_since >= self.gone_after_s:
                    self._stop(job, TAB_CLOSED)
            self._dispatch()

    def _keep_sweeping(self) -> None:
        """A daemon thread sweeps while the queue holds jobs, then ends (lock held)."""
        if self.sweep_s is None or (self._sweeper is not None and self._sweeper.is_alive()):
            return
        self._sweeper = threading.Thread(target=self._sweep_while_busy, name="speclab-job-sweeper", daemon=True)
        self._sweeper.start()

    def _sweep_while_busy(self) -> None:
        while True:
            time.sleep(self.sweep_s)
            self.sweep()
            with self._lock:
                if not self._waiting and not self._running:
                    self._sweeper = None
                    return

    # ------------------------------------------------------------ the rules (lock held)

    def _may_start(self, job: Job) -> bool:
        if any(r.alone for r in self._running):
            return False
        return not self._running if job.alone else len(self._running) < self.limit

    def _dispatch(self) -> None:
        while self._waiting and self._may_start(self._waiting[0][0]):
            job, work = self._waiting.popleft()
            job.waiting = False
            self._running.append(job)
            for r in self._running:
                r.company = max(r.company, len(self._running) - 1)
            threading.Thread(target=self._work, args=(job, work), name=f"speclab-job-{job.name}", daemon=True).start()

    def _stop(self, job: Job, reason: str) -> None:
        if job.stopped is None and job.running:
            job.stopped = reason
        for i, (queued, _) in enumerate(self._waiting):
            if queued is job:
                del self._waiting[i]
                job.waiting, job.fraction = False, 1.0
                job.finished.set()
                return

    def _work(self, job: Job, work: Work) -> None:
        """The worker thread: the work, then its slot goes to the next job, then it is finished."""
        job.work_on(work)
        with self._lock:
            self._running.remove(job)
            if job.error is None and job.stopped is None:
                self._durations.setdefault(job.kind, deque(maxlen=KEPT_DURATIONS)).append(job.elapsed_s())
            self._dispatch()
        job.finished.set()

    def _expected_s(self, job: Job) -> float | None:
        """A job's running time: its kind's median so far, else the starter's estimate, else any job's median."""
        kept = self._durations.get(job.kind)
        if kept:
            return statistics.median(kept)
        if job.expected_s is not None:
            return job.expected_s
        every = [d for kept in self._durations.values() for d in kept]
        return statistics.median(every) if every else None

    def _seconds_left(self, job: Job) -> float | None:
        left = job.seconds_left()
        if left is not None:
            return left
        expected = self._expected_s(job)
        return None if expected is None else max(0.0, expected - job.elapsed_s())
