"""The server's job queue (app/ui/job_queue.py) as plain Python: the limit, first in first out,
jobs that must run alone, cancelling, dropping the jobs of closed tabs, the wait estimate; and
the operator's settings (app/ui/operator.py), read-only refusing work.

Every work here is held behind an Event the test opens, so each check sees the queue while
jobs run or wait; nothing is timed, and every wait has a generous bound."""
import threading

import pytest
from streamlit.testing.v1 import AppTest

from app.ui import operator
from app.ui.job_queue import CANCELLED, TAB_CLOSED, Job, JobQueue, queue_wait_s

BOUND_S = 30  # a generous bound on any wait for a worker thread


class Held:
    """A job's work: says it has started, then waits until the test lets it end (reporting
    progress meanwhile, where a stop takes effect)."""

    def __init__(self, value: object = None, reporting: bool = True) -> None:
        self.value, self.reporting = value, reporting
        self.going, self.release = threading.Event(), threading.Event()

    def __call__(self, report):
        self.going.set()
        while not self.release.wait(0.01 if self.reporting else BOUND_S):
            report(0.5, "held")
        return self.value


def job(name: str, session: str = "", alone: bool = False, kind: str = "") -> Job:
    return Job(name, name, on_done=lambda result: None, session=session, alone=alone, kind=kind)


def submit(q: JobQueue, name: str, reporting: bool = True, **kw) -> tuple[Job, Held]:
    j, work = job(name, **kw), Held(name, reporting)
    q.submit(j, work)
    return j, work


def ended(j: Job) -> Job:
    assert j.finished.wait(BOUND_S), f"{j.name} did not finish"
    return j


def test_at_most_the_limit_runs_and_the_rest_start_in_order():
    q = JobQueue(2, sweep_s=None)
    (a, wa), (b, wb), (c, wc), (d, wd) = (submit(q, n) for n in "abcd")
    try:
        assert wa.going.wait(BOUND_S) and wb.going.wait(BOUND_S)
        assert q.counts() == (2, 2) and (q.place(c), q.place(d)) == (1, 2)
        assert c.waiting and not wc.going.is_set() and not wd.going.is_set()
        wb.release.set()  # the second one ends first: the head of the queue takes its slot
        assert ended(b).result == "b" and wc.going.wait(BOUND_S)
        assert not wd.going.is_set() and q.place(d) == 1 and q.place(c) is None and not c.waiting
    finally:
        for w in (wa, wb, wc, wd):
            w.release.set()
    assert [ended(j).result for j in (a, c, d)] == ["a", "c", "d"]
    assert q.counts() == (0, 0)


def test_a_job_that_times_things_runs_alone_and_is_not_overtaken():
    q = JobQueue(2, sweep_s=None)
    (a, wa), (m, wm), (b, wb) = submit(q, "a"), submit(q, "measure", alone=True), submit(q, "b")
    try:
        assert wa.going.wait(BOUND_S)
        # a slot is free, yet the measurement waits for the running job and b waits behind it
        assert (q.place(m), q.place(b)) == (1, 2) and not wm.going.is_set() and not wb.going.is_set()
        wa.release.set()
        assert wm.going.wait(BOUND_S)
        assert q.place(b) == 1 and not wb.going.is_set()  # nothing starts beside it
        wm.release.set()
        assert wb.going.wait(BOUND_S)
    finally:
        for w in (wa, wm, wb):
            w.release.set()
    assert ended(m).company == 0 and ended(a).company == 0 and ended(b).result == "b"


def test_jobs_side_by_side_count_their_company():
    q = JobQueue(2, sweep_s=None)
    (a, wa), (b, wb) = submit(q, "a"), submit(q, "b")
    assert wa.going.wait(BOUND_S) and wb.going.wait(BOUND_S)
    wa.release.set()
    wb.release.set()
    assert ended(a).company == 1 and ended(b).company == 1


def test_cancel_takes_a_waiting_job_out_and_stops_a_running_one_at_its_next_report():
    q = JobQueue(1, sweep_s=None)
    (a, wa), (b, wb), (c, wc) = (submit(q, n) for n in "abc")
    try:
        assert wa.going.wait(BOUND_S)
        q.cancel(b)  # waiting: out at once, never started
        assert ended(b).stopped == CANCELLED and b.result is None and not wb.going.is_set()
        assert q.place(c) == 1
        q.cancel(a)  # running: the work's next report ends it, and its slot goes to c
        assert ended(a).stopped == CANCELLED and a.result is None and a.error is None
        assert wc.going.wait(BOUND_S)
        assert not wa.release.is_set()  # a ended although the test never let its work finish
    finally:
        for w in (wa, wb, wc):
            w.release.set()
    assert ended(c).result == "c" and c.stopped is None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_jobs_of_a_closed_tab_are_dropped_and_a_short_blip_is_forgiven():
    connected, clock = {"s1": True, "s2": True, "s3": True}, Clock()
    q = JobQueue(1, session_alive=lambda s: connected[s], clock=clock, gone_after_s=15, sweep_s=None)
    (a, wa), (b, wb), (c, wc) = (submit(q, n, session=s) for n, s in zip("abc", ("s1", "s2", "s3")))
    try:
        assert wa.going.wait(BOUND_S)
        connected.update(s1=False, s2=False, s3=False)  # a's and b's tabs close; c's loses its network
        q.sweep()
        clock.now = 10
        connected["s3"] = True  # c's tab is back within the grace period
        q.sweep()
        assert a.running and b.waiting and q.place(c) == 2  # nothing dropped yet
        connected["s3"] = False
        clock.now = 15  # 15 s since a's and b's tabs went; c's only just went again
        q.sweep()
        assert ended(b).stopped == TAB_CLOSED and not wb.going.is_set()
        assert ended(a).stopped == TAB_CLOSED and a.result is None
        assert wc.going.wait(BOUND_S) and c.stopped is None  # c now runs
        clock.now = 29
        q.sweep()
        assert c.running and c.stopped is None
    finally:
        for w in (wa, wb, wc):
            w.release.set()
    assert ended(c).result == "c"


def test_a_job_outside_any_session_is_never_dropped():
    q = JobQueue(1, session_alive=lambda s: False, clock=Clock(), gone_after_s=0, sweep_s=None)
    a, wa = submit(q, "a")  # session "": started outside a server (tests, plain Python)
    assert wa.going.wait(BOUND_S)
    q.sweep()
    q.sweep()
    assert a.running and a.stopped is None
    wa.release.set()
    assert ended(a).result == "a"


def test_the_wait_is_the_time_until_a_slot_frees():
    # two slots, one frees in 10 s, the other now: the first job ahead (30 s) takes the free one,
    # the second (5 s) the one freed at 10 s; we start when the first of them ends (15 s)
    assert queue_wait_s([10.0], [(30.0, False), (5.0, False)], 2, alone=False) == 15.0
    assert queue_wait_s([10.0], [(30.0, False), (5.0, False)], 2, alone=True) == 30.0  # alone: all must end
    assert queue_wait_s([10.0, 20.0], [(5.0, True), (1.0, False)], 2, alone=False) == 25.0  # behind a lone job
    assert queue_wait_s([], [], 3, alone=False) == 0.0


def test_the_estimate_goes_by_the_durations_of_finished_jobs_of_the_same_kind():
    q = JobQueue(1, sweep_s=None)
    first, w1 = submit(q, "first", reporting=False, kind="live")  # no progress: the estimate has only the durations
    second, w2 = submit(q, "second", reporting=False, kind="live")
    assert w1.going.wait(BOUND_S)
    assert q.wait_estimate_s(second) is None  # nothing of that kind has finished yet
    w1.release.set()
    ended(first)
    assert w2.going.wait(BOUND_S)
    third, w3 = submit(q, "third", reporting=False, kind="live")
    try:
        estimate = q.wait_estimate_s(third)
        # what is left of the running one: the first one's duration less the time it has run so far
        assert estimate is not None and 0 <= estimate <= first.elapsed_s()
        assert q.wait_estimate_s(second) is None  # it runs: no wait
    finally:
        w2.release.set()
        w3.release.set()
    ended(third)


# ---------------------------------------------------------------- the operator's settings

def test_max_jobs_defaults_to_the_cores_less_one_and_refuses_nonsense(monkeypatch):
    monkeypatch.delenv(operator.MAX_JOBS, raising=False)
    assert [operator.default_max_jobs(n) for n in (1, 2, 8)] == [1, 1, 7]
    # the job slots share the cores but one: one thread each by default, more when fewer jobs run
    assert [operator.threads_per_job(limit, n) for limit, n in ((1, 2), (7, 8), (1, 8), (3, 8), (1, 1))] == [1, 1, 7, 2, 1]
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # chosen by whoever started the server: left alone
    assert operator.job_threads(1) is None
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert operator.job_threads(1) == operator.threads_per_job(1, operator.cores())
    assert operator.max_jobs() == operator.default_max_jobs(operator.cores())
    monkeypatch.setenv(operator.MAX_JOBS, "3")
    assert operator.max_jobs() == 3 and operator.problem() is None
    for bad in ("0", "two", "-1", "65", "1.5"):
        monkeypatch.setenv(operator.MAX_JOBS, bad)
        with pytest.raises(operator.OperatorSettingError, match=f"SPECLAB_MAX_JOBS must be .* not '{bad}'"):
            operator.max_jobs()
        assert operator.problem().startswith("SPECLAB_MAX_JOBS must be")


def test_read_only_is_on_or_off_and_a_typo_is_refused(monkeypatch):
    for value, on in (("1", True), ("true", True), ("0", False), ("", False)):
        monkeypatch.setenv(operator.READ_ONLY, value)
        assert operator.read_only() is on
    monkeypatch.setenv(operator.READ_ONLY, "yse")
    with pytest.raises(operator.OperatorSettingError, match="SPECLAB_READ_ONLY must be 1"):
        operator.read_only()


def read_only_script() -> None:
    import streamlit as st

    from app.runs import live
    from app.ui import jobs

    ran = st.session_state["ran"]
    st.session_state["started"] = jobs.start("t", "Test", lambda report: ran.set(), print)
    st.session_state["pair"] = live.load_or_error("tiny-shakespeare")  # every page loads its models here


def test_a_read_only_server_starts_no_job_and_loads_no_model(monkeypatch):
    monkeypatch.setenv(operator.READ_ONLY, "1")
    at = AppTest.from_function(read_only_script, default_timeout=30)
    at.session_state["ran"] = ran = threading.Event()
    at.run()
    assert not at.exception and at.session_state["started"] is None and at.session_state["pair"] is None
    assert [i.value for i in at.info] == [operator.READ_ONLY_WORDS] * 2
    assert "background_job" not in at.session_state and not ran.is_set()
