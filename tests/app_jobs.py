"""Test helpers for measurements that run on a worker thread (app/ui/jobs.py)."""
from streamlit.testing.v1 import AppTest

from app.ui.jobs import JOB


def running_job(at: AppTest):
    """The session's measurement job; fails if none was started."""
    assert JOB in at.session_state, "no measurement was started"
    return at.session_state[JOB]


def finish_job(at: AppTest, timeout_s: float = 120) -> AppTest:
    """Wait for the worker thread, then rerun as the page's polling fragment would."""
    assert running_job(at).finished.wait(timeout_s), "the measurement did not finish"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def progress_texts(at: AppTest) -> list[str]:
    return [p.proto.text for p in at.get("progress")]
