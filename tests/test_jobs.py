"""app/ui/jobs.py's Job on its own: the worker's result, its progress, and a failure as words."""
import threading

from app.ui.jobs import Job


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
