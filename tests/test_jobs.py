"""app/ui/jobs.py's Job on its own (the worker's result, its progress, a failure as words), and its
hand-over to the page when Streamlit cuts the run short."""
import threading

from streamlit.testing.v1 import AppTest

from app.ui.jobs import FAST_FOR_S, JOB, POLL_S, SLOW_POLL_S, Job, poll_interval
from tests.app_jobs import progress_texts


def run_in_thread(job: Job, work) -> None:
    thread = threading.Thread(target=job.run, args=(work,))
    thread.start()
    thread.join(30)
    assert not thread.is_alive()


def test_the_result_is_what_the_work_returned_and_progress_is_kept():
    job, seen = Job("x", "Timing", on_done=lambda r: None), []
    release = threading.Event()

    def work(report):
        report(0.5, "half way")
        seen.append((job.fraction, job.text, job.running))  # read as the page would, while it runs
        release.wait(10)
        return {"target_step_s": 0.01}

    thread = threading.Thread(target=job.run, args=(work,))
    thread.start()
    while not seen:
        release.wait(0.01)
    assert seen == [(0.5, "half way", True)] and job.running and job.result is None
    release.set()
    thread.join(30)
    assert not job.running and job.result == {"target_step_s": 0.01} and job.error is None
    assert job.fraction == 1.0


def test_an_exception_in_the_worker_becomes_an_error_message():
    job = Job("x", "Timing", on_done=lambda r: None)

    def work(report):
        report(0.3, "first round")
        raise ValueError("the prompt is empty")

    run_in_thread(job, work)
    assert not job.running and job.result is None
    assert job.error == "ValueError: the prompt is empty"


def test_progress_is_clamped_and_time_left_needs_some_progress():
    job = Job("x", "Timing", on_done=lambda r: None)
    assert job.seconds_left() is None  # nothing done yet: no estimate
    job.report(1.7, "")
    assert job.fraction == 1.0 and job.text == "starting"  # an empty text keeps the last one
    job.report(-1, "going")
    assert job.fraction == 0.0 and job.text == "going"
    job.started -= 10  # ten seconds in, a quarter done: about thirty left
    job.report(0.25)
    assert 29 <= job.seconds_left() <= 31


def handover_script() -> None:
    """A page whose on_done is cut short once, the way Streamlit stops a run at a session-state
    access when a rerun is pending (the polling fragment sends them every half second)."""
    import streamlit as st

    from app.ui import jobs

    def on_done(result) -> None:
        st.session_state["calls"] = st.session_state.get("calls", 0) + 1
        if st.session_state["calls"] == 1:
            raise RuntimeError("cut short")
        st.session_state["result"] = result

    if "started" not in st.session_state:
        st.session_state["started"] = True
        gate = st.session_state["gate"]  # the test opens it once the page shows the job running
        jobs.start("t", "Test", lambda report: gate.wait(30) and 42, on_done)
    jobs.show("t")
    st.write(f"result: {st.session_state.get('result')}")


def test_a_job_is_looked_at_often_while_young_and_seldom_after():
    # Each look costs CPU a timed run needs (bench/results/live-speed.md), so a long job is
    # polled seldom; a short measurement is still shown within half a second.
    job = Job("x", "Timing", on_done=lambda r: None)
    assert poll_interval(job) == POLL_S < SLOW_POLL_S
    job.started -= FAST_FOR_S  # as if it had run that long
    assert poll_interval(job) == SLOW_POLL_S


def test_a_hand_over_cut_short_is_made_again_on_the_next_run():
    """The job is forgotten only after on_done stored its result; before, a run stopped between
    forgetting the job and storing the result lost the result for good."""
    at = AppTest.from_function(handover_script, default_timeout=30)
    at.session_state["gate"] = gate = threading.Event()
    at.run()
    job = at.session_state[JOB]
    assert job.running and not at.exception
    gate.set()
    assert job.finished.wait(30)
    at.run()  # the first hand-over: on_done is cut short
    assert at.exception and JOB in at.session_state and "result" not in at.session_state
    at.run()  # the next run hands the result over again
    assert not at.exception and at.session_state["result"] == 42 and JOB not in at.session_state
    assert "result: 42" in [m.value for m in at.markdown]


def queued_script() -> None:
    """A page whose job is held by the test: `alone` (a measurement) when the test asks, so a
    second session's job must wait for it whatever the server's limit."""
    import streamlit as st

    from app.ui import jobs

    if "started" not in st.session_state:
        st.session_state["started"] = True
        gate, label = st.session_state["gate"], st.session_state["label"]  # the worker never reads session state
        jobs.start("t", label, lambda report: gate.wait(30) and label,
                   lambda result: st.session_state.update(result=result), alone=st.session_state["alone"])
    jobs.show("t")
    st.write(f"result: {st.session_state.get('result')}")


def session(label: str, alone: bool, gate: threading.Event) -> AppTest:
    at = AppTest.from_function(queued_script, default_timeout=30)
    for name, value in dict(gate=gate, label=label, alone=alone).items():
        at.session_state[name] = value
    return at.run()


def test_a_second_visitors_job_waits_in_the_queue_says_where_and_can_be_cancelled():
    held, free = threading.Event(), threading.Event()
    first = session("Timing", True, held)  # a measurement: nothing runs beside it
    try:
        second = session("Live run", False, free)
        [bar] = progress_texts(second)
        assert bar.startswith("Live run: waiting, number 1 in this server's queue (1 running, 1 waiting;"), bar
        assert second.session_state[JOB].waiting and not first.session_state[JOB].waiting
        second.button(key="job_cancel").click().run()
        assert not second.exception and JOB not in second.session_state
        assert [i.value for i in second.info] == ["Live run: cancelled. Nothing stored earlier was lost."]
        third = session("Live run again", False, free)  # a new job queues behind the measurement again
        assert third.session_state[JOB].waiting
    finally:
        held.set()
        free.set()
    for at in (first, third):
        assert at.session_state[JOB].finished.wait(30)
        at.run()
    assert "result: Timing" in [m.value for m in first.markdown]
    assert "result: Live run again" in [m.value for m in third.markdown]
