"""The statistics page in the real app (streamlit.testing AppTest) on tiny-model traces.

Every number the page shows is compared with engine/stats/analysis.py's computation on the
same trace file, read independently of the app.
"""
import json
import threading
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.ui.jobs import BUSY, JOB
from app.ui.names import model_label
from app.ui.safe import md
from app.ui.state import TraceRef
from app.views.sections.statistics_compare import COMPARE_NAMES_PX, COMPARE_TRACE_PX
from engine.config import SpecSettings
from engine.mode import RunMode
from engine.run import load_pair, run_to_trace
from engine.stats.analysis import NO_CALIBRATION, advice_sentence, best_k, explain_speed, trace_stats
from engine.stats.repeats import MAX_SPREAD, disagreement_words
from engine.trace import load_trace
from engine.trace.metrics import decoding_tokens_per_s
from tests.app_jobs import finish_job, progress_texts, running_job
from tests.tiny import noisy_pair, save_tiny

MAIN = Path(__file__).resolve().parent.parent / "app" / "main.py"
PAGE = "views/statistics.py"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Tiny model folders and three traces: calibrated sampled, calibrated greedy, uncalibrated."""
    root = tmp_path_factory.mktemp("stats_page")
    pair = load_pair(*save_tiny(noisy_pair(0, noise=0.05), root / "models"), device="cpu")
    traces = root / "traces"
    run_to_trace(pair, "the dog ran", SpecSettings(k=3, temperature=1.0, max_new_tokens=40, seed=6),
                 traces / "default.jsonl", RunMode(calibrate=True))
    run_to_trace(pair, "the dog ran", SpecSettings(k=2, temperature=0.0, max_new_tokens=30),
                 traces / "greedy.jsonl", RunMode(calibrate=True))
    run_to_trace(pair, "the dog ran", SpecSettings(k=2, temperature=1.0, max_new_tokens=20, seed=2),
                 traces / "uncalibrated.jsonl")
    return root


def open_page(folder: Path, monkeypatch, trace: str = "default.jsonl") -> AppTest:
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(folder / "traces"))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(folder / "runs"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    at = AppTest.from_file(str(MAIN), default_timeout=120)
    at.query_params["trace"] = f"bundled:{trace}"
    at.run()
    at.switch_page(PAGE).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def open_tab(at: AppTest, name: str) -> AppTest:
    """Open one of the page's tabs (only the open tab's content runs), as a click on it would."""
    at.session_state["stats_tab"] = name
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metrics(at: AppTest) -> dict[str, str]:
    """The metrics of the open tab."""
    return {m.label: m.value for m in at.metric}


def all_metrics(at: AppTest) -> dict[str, str]:
    """The metrics of the Acceptance and the Cost and speed tabs together."""
    return {**metrics(open_tab(at, "Acceptance")), **metrics(open_tab(at, "Cost and speed"))}


def figure(at: AppTest, key: str) -> dict:
    found = [e for e in at.get("plotly_chart") if e.proto.id.endswith(f"-{key}")]
    assert len(found) == 1, f"figure {key} not shown"
    return json.loads(found[0].proto.spec)


def table(at: AppTest, column: str):
    """The one table with this column (AppTest does not expose a dataframe's key)."""
    found = [d.value for d in at.dataframe if column in d.value.columns]
    assert len(found) == 1, f"no single table with a column {column!r}"
    return found[0]


def expected_metrics(st) -> dict[str, str]:
    a, r = st.acceptance, st.speed
    return {
        "Draft acceptance rate": f"{a['acceptance_rate']:.3f}",
        "Mean acceptance length": f"{a['mean_acceptance_length']:.3f}",
        "alpha (mean beta)": f"{st.alpha:.3f}", "Cycles": f"{st.num_cycles}",
        "t_step (target, 1 token)": f"{r.target_step_s * 1000:.2f} ms",
        "t_draft (one draft step)": f"{r.draft_step_s * 1000:.2f} ms",
        "c = t_draft / t_step": f"{r.c:.3f}", f"t_verify({st.k + 1}) in target steps": f"{r.verify_in_steps:.2f}",
        "Measured speedup": f"{r.measured:.2f}x", "Leviathan prediction": f"{r.leviathan:.2f}x",
        "Refined prediction": f"{r.refined:.2f}x",
    }


def test_every_number_matches_the_engine(folder, monkeypatch):
    at = open_page(folder, monkeypatch)
    st = trace_stats(load_trace(folder / "traces" / "default.jsonl"))
    assert metrics(at)["Cycles"] == f"{st.num_cycles}"  # the Acceptance tab is open first
    assert all_metrics(at) == expected_metrics(st)
    open_tab(at, "Acceptance")
    per_position = " · ".join(f"{i}: {p:.3f}" for i, p in enumerate(st.acceptance["per_position_acceptance"], 1))
    assert any(m.value == f"**Per-position acceptance**: {per_position}" for m in at.markdown)
    open_tab(at, "Cost and speed")
    assert any(md(explain_speed(st.speed)) == i.value for i in at.info)
    r = st.speed  # the spreads beside c and the measured speedup: the engine's quartiles
    captions = [c.value for c in at.caption]
    assert f"middle half {r.c_spread.low:.3f}–{r.c_spread.high:.3f}" in captions
    assert any(c.startswith(f"Middle half of cycles: {r.measured_spread.low:.2f}x–{r.measured_spread.high:.2f}x. ")
               for c in captions)
    gap = disagreement_words("Refined prediction vs measured speedup", st.speed.refined, st.speed.measured, MAX_SPREAD)
    said = [w.value for w in at.warning if w.value.startswith("Refined prediction vs measured")]
    assert said == ([gap] if gap else [])  # said in words exactly when they differ beyond the noise
    open_tab(at, "K advisor")
    advice_box = at.success if best_k(st.advice).refined >= 1 else at.warning
    assert [b.value for b in advice_box if b.value not in said] == [md(advice_sentence(st.advice))]
    rows = table(at, "E[tokens per cycle]")
    assert list(rows["K"]) == [a.k for a in st.advice]
    assert list(rows["refined"]) == pytest.approx([round(a.refined, 3) for a in st.advice])
    assert list(rows["Leviathan"]) == pytest.approx([round(a.leviathan, 3) for a in st.advice])
    assert list(rows["cycle (target steps)"]) == pytest.approx([round(a.cost_steps, 3) for a in st.advice])


def test_figures_draw_the_engine_numbers(folder, monkeypatch):
    at = open_page(folder, monkeypatch)
    st = trace_stats(load_trace(folder / "traces" / "default.jsonl"))
    per_position = figure(at, "fig_per_position")["data"]
    assert per_position[0]["y"] == pytest.approx(st.acceptance["per_position_acceptance"])
    assert per_position[1]["y"] == pytest.approx([st.alpha ** i for i in range(1, st.k + 1)])
    histogram = figure(at, "fig_tokens_per_cycle")["data"]
    assert histogram[0]["y"] == pytest.approx([c / st.num_cycles for c in st.tokens_per_cycle])
    assert histogram[1]["y"] == pytest.approx(st.pmf)
    open_tab(at, "Cost and speed")
    speed = figure(at, "fig_speed")["data"][0]["y"]
    assert speed == pytest.approx([st.speed.measured, st.speed.leviathan, st.speed.refined])
    verify = figure(at, "fig_verify_cost")["data"]
    assert verify[0]["y"] == pytest.approx([t * 1000 for t in st.calibration.verify_s])
    open_tab(at, "K advisor")
    advisor = figure(at, "fig_advisor")["data"]
    assert advisor[1]["y"] == pytest.approx([a.refined for a in st.advice])
    assert advisor[2]["x"] == [best_k(st.advice).k]
    steps = figure(at, "fig_verify_steps")["data"][0]
    assert steps["x"] == st.calibration.verify_positions
    assert steps["y"] == pytest.approx([t / st.calibration.target_step_s for t in st.calibration.verify_s])
    crossed = [n for n, shape in zip(steps["x"], steps["marker"]["pattern"]["shape"]) if shape == "x"]
    assert crossed == [best_k(st.advice).k + 1]


def test_a_trace_never_makes_the_server_load_the_models_it_names(folder, monkeypatch):
    """The uncalibrated trace's header names real model folders; without a preset or a pair the
    server's operator configured, measuring refuses instead of loading them."""
    monkeypatch.delenv("SPECLAB_MEASURE_PAIR", raising=False)
    import engine.run
    monkeypatch.setattr(engine.run, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    at = open_tab(open_page(folder, monkeypatch, "uncalibrated.jsonl"), "Cost and speed")
    assert str(folder / "models") in load_trace(folder / "traces" / "uncalibrated.jsonl").header["target"]["name"]
    at.button(key="calibrate_now").click().run()
    assert not at.exception and "Measured speedup" not in metrics(at)
    assert any("never loads models a trace names" in e.value for e in at.error)


def repeat_calibration(monkeypatch, scales: list[float]) -> None:
    """The page calibrates several times and compares; tests must not time things, so each round
    returns one real calibration (taken once) scaled by the next factor."""
    import engine.stats.calibrate
    real = engine.stats.calibrate.calibrate
    taken: list[dict] = []
    calls = iter(scales)

    def fake(*args, **kwargs):
        if not taken:
            taken.append(real(*args, **kwargs))
        f = next(calls)
        base = taken[0]
        return {**base, "target_step_s": base["target_step_s"] * f, "draft_step_s": base["draft_step_s"] * f,
                "verify_s": [v * f for v in base["verify_s"]]}

    monkeypatch.setattr(engine.stats.calibrate, "calibrate", fake)


def test_noisy_calibration_is_refused(folder, monkeypatch):
    monkeypatch.setenv("SPECLAB_MEASURE_PAIR", str(folder / "models"))  # the operator's pair
    repeat_calibration(monkeypatch, [1.0, 1.6, 2.5])  # repeats 60% and more apart
    at = open_tab(open_page(folder, monkeypatch, "uncalibrated.jsonl"), "Cost and speed")
    at.button(key="calibrate_now").click().run()
    finish_job(at)
    assert not at.exception, [e.value for e in at.exception]
    assert "Measured speedup" not in metrics(at) and "now_calibration" not in at.session_state
    assert any(w.value.startswith("Not shown: the 3 calibrations disagreed") for w in at.warning)


def test_uncalibrated_trace_can_be_calibrated_on_this_machine(folder, monkeypatch):
    monkeypatch.setenv("SPECLAB_MEASURE_PAIR", str(folder / "models"))  # the operator's pair
    repeat_calibration(monkeypatch, [1.0, 1.05, 0.97])
    at = open_tab(open_page(folder, monkeypatch, "uncalibrated.jsonl"), "Cost and speed")
    assert "Measured speedup" not in metrics(at)
    assert [i.value for i in at.info if "calibration" in i.value] == [NO_CALIBRATION]
    at.button(key="calibrate_now").click().run()
    finish_job(at)
    assert not at.exception, [e.value for e in at.exception]
    shown = metrics(at)
    assert {"Measured speedup", "c = t_draft / t_step", "Refined prediction"} <= set(shown)
    assert any("measured now on this machine" in w.value and "agreed within 8%" in w.value for w in at.warning)
    # The page's numbers use the calibration it just took: recompute them from the file plus that.
    trace = load_trace(folder / "traces" / "uncalibrated.jsonl")
    (taken,) = at.session_state["now_calibration"].values()
    trace.header["calibration"] = taken
    assert all_metrics(at) == expected_metrics(trace_stats(trace))


def test_k_sweep_runs_live_and_shows_its_measurements(folder, monkeypatch):
    monkeypatch.setenv("SPECLAB_MEASURE_PAIR", str(folder / "models"))
    at = open_tab(open_page(folder, monkeypatch), "K sweep")
    at.multiselect(key="sweep_ks").set_value([1, 2])
    at.number_input(key="sweep_max_new").set_value(8)
    at.button(key="sweep_run").click().run()
    finish_job(at)
    (result,) = at.session_state["k_sweeps"].values()
    rows = table(at, "refined tokens/s")
    assert list(rows["K"]) == [1, 2]
    assert list(rows["tokens/s"]) == pytest.approx([round(p.tokens_per_s, 2) for p in result.points])
    assert list(rows["mean acceptance length"]) == pytest.approx(
        [round(p.mean_acceptance_length, 3) for p in result.points])
    predicted = result.predicted_tokens_per_s()
    assert list(rows["refined tokens/s"]) == pytest.approx([round(v, 2) for v in predicted["refined"]])
    sweep = figure(at, "fig_sweep")["data"]
    assert sweep[0]["y"] == pytest.approx([p.tokens_per_s for p in result.points])
    assert all(1 <= p.tokens <= 8 for p in result.points)  # the max-new-tokens input reached the runs


def test_compare_two_traces_side_by_side(folder, monkeypatch):
    at = open_tab(open_page(folder, monkeypatch), "Compare two traces")
    offered = at.selectbox(key="compare_with").options
    assert "example: default.jsonl" not in offered and "example: greedy.jsonl" in offered  # not itself
    at.selectbox(key="compare_with").set_value(TraceRef("bundled", "greedy.jsonl")).run()
    assert not at.exception
    rows = table(at, "this trace")
    by_name = dict(zip(rows[""], zip(rows["this trace"], rows["example: greedy.jsonl"])))
    mine = trace_stats(load_trace(folder / "traces" / "default.jsonl"))
    other = trace_stats(load_trace(folder / "traces" / "greedy.jsonl"))
    assert by_name["alpha"] == (f"{mine.alpha:.3f}", f"{other.alpha:.3f}")
    assert by_name["K · temperature"] == ("3 · 1.0", "2 · 0.0")
    headers = [load_trace(folder / "traces" / n).header for n in ("default.jsonl", "greedy.jsonl")]
    for role in ("target", "draft"):  # a row each: both names in one cell ran off the table on a projector
        assert by_name[role] == tuple(model_label(h, role).label for h in headers)
    assert by_name["measured speedup"] == (f"{mine.speed.measured:.2f}x", f"{other.speed.measured:.2f}x")
    assert by_name["best K (refined)"] == (f"{best_k(mine.advice).k}", f"{best_k(other.advice).k}")
    mine_trace, other_trace = (load_trace(folder / "traces" / n) for n in ("default.jsonl", "greedy.jsonl"))
    assert by_name["tokens/s (decoding)"] == (f"{decoding_tokens_per_s(mine_trace.cycles):.1f}",
                                             f"{decoding_tokens_per_s(other_trace.cycles):.1f}")
    # the columns' widths are the page's, not the grid's own: sized by itself, "this trace" took 221 px of a
    # 904 px table and cut the model name off (tests/test_browser_projector.py fits the real texts in them)
    config = next(json.loads(d.proto.columns) for d in at.dataframe if "this trace" in d.value.columns)
    assert {name: c.get("width") for name, c in config.items() if name != "_index"} == \
        {"": COMPARE_NAMES_PX, "this trace": COMPARE_TRACE_PX, "example: greedy.jsonl": COMPARE_TRACE_PX}
    compare = figure(at, "fig_compare")["data"]
    assert compare[0]["y"] == pytest.approx(mine.acceptance["per_position_acceptance"])
    assert compare[2]["y"] == pytest.approx(other.acceptance["per_position_acceptance"])


def test_incomplete_trace_renders(folder, monkeypatch):
    lines = (folder / "traces" / "default.jsonl").read_text().splitlines()
    (folder / "traces" / "cut.jsonl").write_text("\n".join(lines[:4]) + "\n")  # header and three cycles
    at = open_page(folder, monkeypatch, "cut.jsonl")
    assert metrics(at)["Cycles"] == "3" and len(lines) > 5
    assert any("incomplete run" in c.value for c in at.caption)
    (folder / "traces" / "cut.jsonl").unlink()


def test_race_and_explorer_use_the_trace_and_its_calibration(folder, monkeypatch):
    at = open_tab(open_page(folder, monkeypatch), "Race and explorer")
    trace = load_trace(folder / "traces" / "default.jsonl")
    st = trace_stats(trace)
    race = figure(at, "fig_race")["data"]
    plain, spec = race[0], race[1]
    total = sum(len(c["committed_token_ids"]) for c in trace.cycles)
    assert spec["y"][-1] == plain["y"][-1] == total  # the same number of tokens
    assert spec["x"][-1] == pytest.approx(sum(c["cycle_time_s"] for c in trace.cycles))
    assert plain["x"][-1] == pytest.approx(total * st.speed.target_step_s)
    explorer = figure(at, "fig_explorer")["data"]
    star = next(t for t in explorer if t["name"] == "this trace, measured")
    assert star["x"] == [trace.k] and star["y"] == [pytest.approx(st.speed.measured)]
    at.slider(key="ex_alpha").set_value(0.8).run()
    at.slider(key="ex_c").set_value(0.1).run()
    at.slider(key="ex_k").set_value(5).run()
    chosen = next(t for t in figure(at, "fig_explorer")["data"] if t["name"] == "chosen K=5")
    from engine.trace.metrics import predicted_speedup
    assert chosen["y"] == [pytest.approx(predicted_speedup(0.8, 5, 0.1))]
    assert any(f"**{predicted_speedup(0.8, 5, 0.1):.2f}×**" in m.value for m in at.markdown)


def test_the_race_says_its_speedup_beside_the_median_cycles(folder, monkeypatch):
    """The race's ratio (every cycle's time) and the measured speedup (the median cycle's) differ on a
    run with slow cycles: the race says both, and which is which, where it is drawn."""
    at = open_tab(open_page(folder, monkeypatch), "Race and explorer")
    trace = load_trace(folder / "traces" / "default.jsonl")
    r = trace_stats(trace).speed
    spec_s = sum(c["cycle_time_s"] for c in trace.cycles)
    plain_s = sum(len(c["committed_token_ids"]) for c in trace.cycles) * r.target_step_s
    (words,) = [m.value for m in at.markdown if m.value.startswith("Speculative finishes after")]
    assert words.startswith(f"Speculative finishes after {spec_s:.2f} s, plain after {plain_s:.2f} s: "
                            f"**{plain_s / spec_s:.2f}×** over the whole run")
    assert f"The headline's measured speedup, **{r.measured:.2f}×**, divides by the median cycle's time" in words
    plain, spec = figure(at, "fig_race")["data"][:2]  # each finishing time in its legend entry, none in the plot
    assert plain["name"].endswith(f"done at {plain_s:.2f} s") and spec["name"].endswith(f"done at {spec_s:.2f} s")
    assert not figure(at, "fig_race")["layout"].get("annotations")


def test_the_explorer_gives_one_number_for_the_traces_own_alpha_and_c(folder, monkeypatch):
    """The sliders start at the trace's alpha and c rounded to 0.01; computing with the rounded values gave
    a second prediction beside the trace's own (1.38x against 1.39x at the same alpha and c as printed)."""
    at = open_tab(open_page(folder, monkeypatch), "Race and explorer")
    trace = load_trace(folder / "traces" / "default.jsonl")
    st = trace_stats(trace)
    r = st.speed
    from engine.trace.metrics import predicted_speedup
    (text,) = [m.value for m in at.markdown if m.value.startswith("At α = ")]
    assert text.startswith(f"At α = {st.alpha:.2f}, c = {r.c:.2f} and K = {trace.k} the formula predicts "
                           f"**{r.leviathan:.2f}×**. These are this trace's own α = {st.alpha:.3f} and c = {r.c:.3f}")
    assert f"its own α and c predict {r.leviathan:.2f}×" in text
    chosen = next(t for t in figure(at, "fig_explorer")["data"] if t["name"] == f"chosen K={trace.k}")
    assert chosen["y"] == [pytest.approx(r.leviathan)] == [pytest.approx(predicted_speedup(st.alpha, trace.k, r.c))]
    moved = round(min(st.alpha, 0.99), 2) - 0.05  # a slider moved: its own value, rounded as it shows
    at.slider(key="ex_alpha").set_value(moved).run()
    (text,) = [m.value for m in at.markdown if m.value.startswith("At α = ")]
    assert f"predicts **{predicted_speedup(moved, trace.k, r.c):.2f}×**" in text and "unrounded" not in text


def test_tab_widgets_keep_their_values_when_another_tab_is_opened(folder, monkeypatch):
    """Only the open tab runs; switching away and back must not reset what the user chose."""
    at = open_tab(open_page(folder, monkeypatch), "Race and explorer")
    at.slider(key="ex_alpha").set_value(0.8).run()
    at.slider(key="ex_k").set_value(5).run()
    at = open_tab(open_tab(at, "Compare two traces"), "K sweep")
    at.multiselect(key="sweep_ks").set_value([1, 3]).run()
    at = open_tab(at, "Compare two traces")
    at.selectbox(key="compare_with").set_value(TraceRef("bundled", "greedy.jsonl")).run()
    at = open_tab(open_tab(at, "Acceptance"), "Race and explorer")
    assert at.slider(key="ex_alpha").value == 0.8 and at.slider(key="ex_k").value == 5
    from engine.trace.metrics import predicted_speedup
    r = trace_stats(load_trace(folder / "traces" / "default.jsonl")).speed
    assert at.slider(key="ex_c").value == round(min(r.c, 1.0), 2)  # never moved: the trace's own c, unrounded
    chosen = next(t for t in figure(at, "fig_explorer")["data"] if t["name"] == "chosen K=5")
    assert chosen["y"] == [pytest.approx(predicted_speedup(0.8, 5, r.c))]  # the chart uses the kept values
    assert open_tab(at, "K sweep").multiselect(key="sweep_ks").value == [1, 3]
    assert open_tab(at, "Compare two traces").selectbox(key="compare_with").value == TraceRef("bundled", "greedy.jsonl")
    assert not at.warning, [w.value for w in at.warning]  # no "default value also set via Session State" box


def test_explorer_starts_over_at_the_new_traces_values_when_another_trace_is_opened(folder, monkeypatch):
    at = open_tab(open_page(folder, monkeypatch), "Race and explorer")
    at.slider(key="ex_alpha").set_value(0.9).run()
    at.switch_page("views/trace_source.py").run()
    at.selectbox(key="bundled_name").set_value("greedy.jsonl").run()
    at.button(key="open_bundled").click().run()
    at = open_tab(at.switch_page(PAGE).run(), "Race and explorer")
    greedy = trace_stats(load_trace(folder / "traces" / "greedy.jsonl"))
    assert at.slider(key="ex_alpha").value == round(min(greedy.alpha, 0.99), 2) != 0.9


# ---------------------------------------------------------------- measurements on a worker thread (app/ui/jobs.py)

def held_until(monkeypatch, module, name: str, gate: threading.Event, error: Exception | None = None) -> None:
    """Make the engine function `module.name` wait for `gate` (then fail with `error`, or run)."""
    real = getattr(module, name)

    def held(*args, **kwargs):
        assert gate.wait(120), "the test never opened the gate"
        if error is not None:
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, held)


def test_measuring_runs_in_the_background_and_the_page_stays_usable(folder, monkeypatch):
    import engine.stats.calibrate
    monkeypatch.setenv("SPECLAB_MEASURE_PAIR", str(folder / "models"))
    repeat_calibration(monkeypatch, [1.0, 1.05, 0.97])
    gate = threading.Event()
    held_until(monkeypatch, engine.stats.calibrate, "calibrate", gate)
    at = open_tab(open_page(folder, monkeypatch, "uncalibrated.jsonl"), "Cost and speed")
    try:
        at.button(key="calibrate_now").click().run()  # returns although the calibration is held
        assert not at.exception, [e.value for e in at.exception]
        job = running_job(at)
        assert job.running and "Measured speedup" not in metrics(at)
        assert any(t.startswith("Timing single steps") and "The page stays usable" in t for t in progress_texts(at))
        # the page answers meanwhile: another tab opens and its widget works
        open_tab(at, "Compare two traces")
        at.selectbox(key="compare_with").set_value(TraceRef("bundled", "greedy.jsonl")).run()
        assert not at.exception and "example: greedy.jsonl" in table(at, "this trace").columns
        # one measurement at a time: a second one is refused in words, the first keeps running
        open_tab(at, "K sweep")
        assert any("is running elsewhere in this session" in c.value for c in at.caption)
        at.button(key="sweep_run").click().run()
        assert any(w.value.startswith(BUSY) for w in at.warning)
        assert running_job(at) is job and job.running and "k_sweeps" not in at.session_state
    finally:
        gate.set()
    assert job.finished.wait(120)
    open_tab(at, "Cost and speed")  # back on the tab that asked: the result is collected there
    taken, spread = job.result  # what the worker's engine calls returned
    assert list(at.session_state["now_calibration"].values()) == [taken]
    assert JOB not in at.session_state  # collected once
    trace = load_trace(folder / "traces" / "uncalibrated.jsonl")
    trace.header["calibration"] = taken
    assert all_metrics(at) == expected_metrics(trace_stats(trace))  # shown = the engine's numbers from that result


def test_a_failed_measurement_is_an_error_and_loses_nothing(folder, monkeypatch):
    import engine.stats.sweep
    monkeypatch.setenv("SPECLAB_MEASURE_PAIR", str(folder / "models"))
    at = open_tab(open_page(folder, monkeypatch), "K sweep")
    at.multiselect(key="sweep_ks").set_value([1])
    at.number_input(key="sweep_max_new").set_value(4)
    at.button(key="sweep_run").click().run()
    finish_job(at)
    (first,) = at.session_state["k_sweeps"].values()
    real_sweep, gate = engine.stats.sweep.k_sweep, threading.Event()
    held_until(monkeypatch, engine.stats.sweep, "k_sweep", gate, RuntimeError("the sweep broke"))
    at.multiselect(key="sweep_ks").set_value([1, 2])
    at.button(key="sweep_run").click().run()
    gate.set()
    finish_job(at)
    said = md("K sweep over K = 1, 2") + " failed: " + md("RuntimeError: the sweep broke")
    assert any(e.value.startswith(said) for e in at.error), [e.value for e in at.error]
    (kept,) = at.session_state["k_sweeps"].values()
    assert kept is first  # the earlier sweep is still there, and still drawn
    assert list(table(at, "refined tokens/s")["K"]) == [1]
    monkeypatch.setattr(engine.stats.sweep, "k_sweep", real_sweep)
    at.button(key="sweep_run").click().run()  # a failed job does not block the next one
    assert not [w for w in at.warning if w.value.startswith(BUSY)]
    finish_job(at)
    assert list(table(at, "refined tokens/s")["K"]) == [1, 2]


def test_the_cost_tab_shows_which_linear_path_ran_each_width(folder, monkeypatch):
    """The table under Cost and speed is the header's measured curve, path for path and width for width."""
    from engine.stats.paths import machine_words, path_rows
    header = load_trace(folder / "traces" / "default.jsonl").header
    expected = path_rows(header)
    assert {r.model for r in expected} == {"target", "draft"}  # a calibrated CPU run records both
    at = open_tab(open_page(folder, monkeypatch), "Cost and speed")
    [table] = [d.value for d in at.dataframe if "runs" in d.value.columns]
    assert list(table["runs"]) == [r.runs for r in expected]
    assert list(table["width"]) == [r.width for r in expected]
    assert list(table["packed oneDNN (ms)"]) == [round(r.packed_s * 1000, 3) for r in expected]
    assert [None if v != v else v for v in table["rows kernel (ms)"]] == \
           [None if r.rows_s is None else round(r.rows_s * 1000, 3) for r in expected]  # NaN: not timed
    # the rows kernel's variant the measurement chose at each width, wherever the rows path was timed
    assert all(r.rows_variant for r in expected if r.rows_s is not None)
    assert [v if isinstance(v, str) else None for v in table["rows kernel variant"]] == [r.rows_variant for r in expected]
    assert any(md(machine_words(header)) in c.value for c in at.caption)
    assert "linear_paths" not in load_trace(folder / "traces" / "uncalibrated.jsonl").header


def test_a_compiled_trace_says_how_its_forwards_ran_and_is_not_calibrated_eagerly(folder, monkeypatch):
    """A trace whose cycles ran compiled (--fast --capture compile): the Cost and speed tab says so, in the
    header's words, and offers no eager calibration whose speedups would mix two ways of running."""
    from engine.stats.paths import forward_words
    pair = load_pair(str(folder / "models" / "target"), str(folder / "models" / "draft"), device="cpu")
    run_to_trace(pair, "the dog ran", SpecSettings(k=2, temperature=1.0, max_new_tokens=12, seed=3),
                 folder / "traces" / "compiled.jsonl", RunMode(fast="compile"))
    header = load_trace(folder / "traces" / "compiled.jsonl").header
    assert header["fast_path"] == {"capture": "compile"}
    at = open_tab(open_page(folder, monkeypatch, "compiled.jsonl"), "Cost and speed")
    [note] = [i.value for i in at.info if "Step times measured here would time eager forwards" in i.value]
    assert md(forward_words(header)) in note and "compiled with torch" in forward_words(header)
    assert not [b for b in at.button if b.key == "calibrate_now"]
    at = open_tab(open_page(folder, monkeypatch, "uncalibrated.jsonl"), "Cost and speed")
    assert [b for b in at.button if b.key == "calibrate_now"]  # a reference-path trace still offers it


def test_a_trace_calibrated_on_the_fast_paths_own_forwards_shows_those_times_and_says_so(folder, monkeypatch):
    """`run --fast --k auto` records step times of the fast path's own forwards (engine/stats/fast_calibrate.py):
    the Cost and speed tab shows them as recorded and names the forwards they timed and the ones the cycles ran."""
    from engine.stats.fast_calibrate import calibrate_fast
    from engine.stats.paths import calibration_words, forward_words
    pair = load_pair(str(folder / "models" / "target"), str(folder / "models" / "draft"), device="cpu")
    s = SpecSettings(k=2, temperature=1.0, max_new_tokens=12, seed=3, cache_layout="static")
    prompt_ids = pair.target.tokenizer("the dog ran")["input_ids"]
    cal, forwards = calibrate_fast(pair, prompt_ids, s, "none", repeats=2)
    run_to_trace(pair, "the dog ran", s, folder / "traces" / "fast-calibrated.jsonl",
                 RunMode(fast="none", calibration=cal, fast_models=forwards.models_for(2)), chat_template=False)
    header = load_trace(folder / "traces" / "fast-calibrated.jsonl").header
    assert header["calibration"] == cal and header["fast_path"] == {"capture": "none"}
    at = open_tab(open_page(folder, monkeypatch, "fast-calibrated.jsonl"), "Cost and speed")
    assert not at.exception and not at.error
    assert metrics(at)["t_step (target, 1 token)"] == f"{cal['target_step_s'] * 1000:.2f} ms"
    words = calibration_words(header)
    assert "fast path's own forwards" in words and "eager" in forward_words(header)
    assert any(md(words) in c.value and md(forward_words(header)) in c.value for c in at.caption)
    reference = load_trace(folder / "traces" / "default.jsonl").header
    assert calibration_words(reference).startswith("the reference path's forwards")
