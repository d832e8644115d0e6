"""Live runs and the teaching pages' "Run live" on app/ui/jobs.py's worker thread (AppTest).

The engine call is held behind a threading.Event, so each test sees the page while the
work is still going: the click returns at once with a progress bar, other widgets and
pages answer, a second start is refused, and once the work ends the page shows exactly
what the engine returned. A failure is an error that loses nothing, and the next job runs.
"""
import json
import threading

import pytest

import app.runs.live
from app.figures.derive import PROMPT
from app.figures.style import legend_name
from app.ui.jobs import BUSY
from app.ui.safe import md
from engine.teaching.runs import CORRECT, first_divergence
from engine.trace import load_trace
from tests.app_jobs import finish_job, progress_texts, running_job
from tests.test_app import SOURCE_PAGE, live_form, model_folders, plain, shown_step, start, traces_dir  # noqa: F401 (fixtures)
from tests.test_stats_page import held_until
from tests.test_teaching_pages import PAGES, env, folder, open_page, run_live_button  # noqa: F401 (fixtures)

STEPPER = "views/stepper.py"


# ---------------------------------------------------------------- the live run (Choose a trace > Live run)

def held_after_first_cycle(monkeypatch, gate: threading.Event, error: Exception | None = None) -> threading.Event:
    """app.runs.live's run_to_trace, stopped after its first cycle until `gate` opens (then failing
    with `error`, or running on); returns an event set when that first cycle has arrived."""
    real, first = app.runs.live.run_to_trace, threading.Event()

    def held(*args, on_cycle, **kwargs):
        def watched(rec: dict) -> None:
            on_cycle(rec)
            if not first.is_set():
                first.set()
                assert gate.wait(120), "the test never opened the gate"
                if error is not None:
                    raise error
        return real(*args, on_cycle=watched, **kwargs)

    monkeypatch.setattr(app.runs.live, "run_to_trace", held)
    return first


def sidebar_names(at) -> str:
    [caption] = [plain(c.value) for c in at.sidebar.caption]
    return caption


def generated_cells(at) -> int:
    """Tokens the stepper's text figure draws as generated (every origin but the prompt)."""
    specs = [json.loads(e.proto.spec) for e in at.get("plotly_chart")]
    [text] = [s for s in specs if "Text so far" in json.dumps(s["layout"].get("title"))]
    prompt = legend_name(PROMPT)
    return sum(len(t["hovertext"]) for t in text["data"] if t.get("name") and t["name"] != prompt)  # one per cell


def test_a_live_run_goes_on_while_the_page_answers(traces_dir, model_folders, monkeypatch):
    gate = threading.Event()
    first_cycle = held_after_first_cycle(monkeypatch, gate)
    at = live_form(model_folders, monkeypatch)
    before = at.session_state["trace_ref"]
    try:
        at.button(key="live_run").click().run()  # returns although the engine is held
        assert not at.exception, [e.value for e in at.exception]
        job = running_job(at)
        assert job.running and not at.success
        assert first_cycle.wait(60)
        at.run()  # what the polling fragment draws: progress, the text so far, the latest cycles
        [bar] = progress_texts(at)
        assert bar.startswith("Live run on the custom pair: cycle 0, ") and "The page stays usable" in bar
        so_far = job.partial
        assert so_far.cycles == 1 and at.code[-1].value == so_far.text
        assert list(at.dataframe[-1].value["cycle"]) == [0]
        # another page answers meanwhile: the stepper still steps through the trace that was open
        at.switch_page(STEPPER).run()
        assert at.session_state["trace_ref"] == before and shown_step(at).startswith("Cycle 0 ")
        assert plain(at.sidebar.caption[-1].value).startswith("Still running in this session: **Live run on the custom pair**")
        at.button(key="nav_next").click().run()
        assert not at.exception and shown_step(at).startswith("Cycle 1 ")
        # back on the tab: the run is still shown, and a second one is refused in words
        at.switch_page(SOURCE_PAGE).run()
        assert progress_texts(at) and running_job(at) is job
        at.button(key="live_run").click().run()
        assert any(w.value.startswith(BUSY) for w in at.warning)
        assert running_job(at) is job and job.running
    finally:
        gate.set()
    finish_job(at)  # the page collects the result the next time it is drawn
    result, ref = job.result, at.session_state["trace_ref"]
    trace = load_trace(ref.path)
    tokens = sum(len(c["committed_token_ids"]) for c in trace.cycles)
    assert ref.kind == "run" and ref.name == result.file and trace.complete
    assert (result.cycles, result.tokens) == (len(trace.cycles), tokens)  # the worker counted what the engine wrote
    assert plain(at.success[0].value).startswith(f"Finished: {len(trace.cycles)} cycles, {tokens} tokens")
    assert "calibration" in trace.header  # live runs still record step times
    names = sidebar_names(at)  # the sidebar names the new run, not the trace open before
    assert names.startswith(f"Open trace: **{ref.label}**") and names.endswith(f"{len(trace.cycles)} cycles")
    at.switch_page(STEPPER).run()
    assert shown_step(at) == "Cycle 0 · stage 1 Draft" and at.query_params["trace"] == ref.token
    at.button(key="nav_last").click().run()
    at.button(key="stage_next").click().run()  # to stage 5 of the last cycle, one stage at a time
    while not shown_step(at).startswith(f"Cycle {len(trace.cycles) - 1} · stage 5"):
        at.button(key="stage_next").click().run()
    assert generated_cells(at) == tokens  # the stepper's text holds every token the run committed


def test_a_failed_live_run_keeps_the_open_trace_and_the_next_run_works(traces_dir, model_folders, monkeypatch):
    at = live_form(model_folders, monkeypatch)
    at.button(key="live_run").click().run()
    finish_job(at)
    first = at.session_state["trace_ref"]
    real, gate = app.runs.live.run_to_trace, threading.Event()
    gate.set()
    held_after_first_cycle(monkeypatch, gate, RuntimeError("the engine broke"))
    at.button(key="live_run").click().run()
    finish_job(at)
    said = md("Live run on the custom pair") + " failed: " + md("RuntimeError: the engine broke")
    assert any(e.value.startswith(said) for e in at.error), [e.value for e in at.error]
    assert at.session_state["trace_ref"] == first and sidebar_names(at).startswith(f"Open trace: **{first.label}**")
    assert plain(at.success[0].value).startswith("Finished:")  # the earlier run's result is still there
    monkeypatch.setattr(app.runs.live, "run_to_trace", real)
    at.button(key="live_run").click().run()  # a failed job does not block the next one
    assert not [w for w in at.warning if w.value.startswith(BUSY)]
    finish_job(at)
    assert not at.error and at.session_state["trace_ref"] not in (first, None)
    assert at.session_state["trace_ref"].kind == "run"


# ---------------------------------------------------------------- the teaching pages' Run live

def test_rollback_run_live_goes_on_while_the_page_answers(env, monkeypatch):
    import engine.teaching.runs
    gate = threading.Event()
    held_until(monkeypatch, engine.teaching.runs, "compare_runs", gate)
    at = open_page("rollback")
    try:
        run_live_button(at).click().run()  # returns although the engine is held
        assert not at.exception, [e.value for e in at.exception]
        job = running_job(at)
        assert job.running and not at.get("plotly_chart")
        [bar] = progress_texts(at)
        assert bar.startswith("Running the correct engine, both broken ones and a static cache: ")
        assert not [i for i in at.info if "No stored result" in i.value]  # the bar, not the invitation to run
        # another page answers meanwhile
        at.switch_page("views/walkthrough.py").run()
        options = at.selectbox(key="wt_cycle").options
        at.selectbox(key="wt_cycle").set_value(options[1]).run()
        assert not at.exception and at.selectbox(key="wt_cycle").index == 1
        at.switch_page("views/rollback_demo.py").run()
        assert progress_texts(at) and running_job(at) is job
        run_live_button(at).click().run()
        assert any(w.value.startswith(BUSY) for w in at.warning)
        assert running_job(at) is job and job.running
    finally:
        gate.set()
    finish_job(at)
    (cmp, static), seconds = job.result  # what the worker's engine calls returned
    assert any(c.value == f"Run live in this session ({seconds:.0f} s)." for c in at.caption)
    shown = [m.value for m in at.metric if m.label.startswith("First token")]
    correct = cmp.runs[CORRECT].generated
    assert shown == [str(first_divergence(r.generated, correct) or "none") for r in cmp.runs.values()]
    shown = [m.value for m in at.metric if m.label == "Draft acceptance rate"]
    assert shown == [f"{r.acceptance_rate:.2f}" for r in cmp.runs.values()]
    same = "yes" if static.generated == correct else "no"
    assert {m.label: m.value for m in at.metric}["Static cache output equals the correct run"] == same


def test_a_failed_lab_run_is_an_error_and_loses_nothing(env, monkeypatch):
    import engine.teaching.exactness
    at = open_page("exactness")
    run_live_button(at).click().run()
    first = finish_job(at).session_state["lab_live"].copy()
    [(res, texts, _)] = first.values()
    assert {m.label: m.value for m in at.metric}["Chi-square, speculative"] == f"{res.speculative_test.statistic:.1f}"
    real, gate = engine.teaching.exactness.run_lab, threading.Event()
    gate.set()
    held_until(monkeypatch, engine.teaching.exactness, "run_lab", gate, RuntimeError("the sampler broke"))
    at.radio(key="lab_rule").set_value("token_match").run()
    at.button(key="lab_run").click().run()
    finish_job(at)
    said = md("Sampling 200 times with the real engine (token match)") + " failed: " + md("RuntimeError: the sampler broke")
    assert any(e.value.startswith(said) for e in at.error), [e.value for e in at.error]
    assert at.session_state["lab_live"] == first  # the earlier result is kept...
    at.radio(key="lab_rule").set_value("ratio").run()
    assert at.success and "consistent with the target" in at.success[0].value  # ...and still shown
    monkeypatch.setattr(engine.teaching.exactness, "run_lab", real)
    at.radio(key="lab_rule").set_value("token_match").run()
    at.button(key="lab_run").click().run()  # a failed job does not block the next one
    assert not [w for w in at.warning if w.value.startswith(BUSY)]
    job = running_job(at)
    finish_job(at)
    (res, texts), _ = job.result
    assert len(at.session_state["lab_live"]) == 2
    assert {m.label: m.value for m in at.metric}["Chi-square, speculative"] == f"{res.speculative_test.statistic:.1f}"
    assert "**not** the target's distribution" in at.error[0].value


@pytest.mark.parametrize("page", ["rollback", "exactness"])
def test_a_teaching_run_is_refused_while_a_live_run_goes(env, monkeypatch, page):
    """One job per session across pages: a teaching run waits for the live run (and says so)."""
    gate = threading.Event()
    held_after_first_cycle(monkeypatch, gate)
    monkeypatch.setenv("SPECLAB_CUSTOM_MODELS", "1")
    at = open_page(page)
    at.switch_page(SOURCE_PAGE).run()
    at.selectbox(key="live_preset").set_value("custom").run()
    at.text_input(key="live_target").set_value(str(env / "pair" / "target"))
    at.text_input(key="live_draft").set_value(str(env / "pair" / "draft"))
    at.number_input(key="live_max_new").set_value(8)
    at.checkbox(key="live_insist_k").check()  # the run the test holds is run_to_trace at the form's K
    try:
        at.button(key="live_run").click().run()
        job = running_job(at)
        at.switch_page(PAGES[page]).run()
        assert any("is running elsewhere in this session" in c.value for c in at.caption)
        run_live_button(at).click().run()
        assert any(w.value.startswith(BUSY) and "Live run on the custom pair" in w.value for w in at.warning)
        assert running_job(at) is job
    finally:
        gate.set()
    assert job.finished.wait(120)
