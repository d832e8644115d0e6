"""The four teaching pages in the real app (AppTest), on tiny saved models and a tiny trace."""
import json
from dataclasses import replace
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.figures import teaching as ft
from engine.config import SpecSettings
from engine.cycle.pair import Pair
from engine.run import load_pair, run_to_trace
from engine.teaching.exactness import run_lab
from engine.teaching.faults import Faults
from engine.teaching.runs import KEEP_REJECTED, compare_runs
from tests.app_jobs import finish_job
from tests.tiny import noisy_pair, save_tiny

MAIN = str(Path(__file__).resolve().parent.parent / "app" / "main.py")
PAGES = {"walkthrough": "views/walkthrough.py", "rollback": "views/rollback_demo.py",
         "exactness": "views/exactness_lab.py", "interview": "views/interview.py"}
PROMPT = "the cat sat on"


def make_teaching_folder(root: Path) -> Path:
    """Tiny model folders (the injected teaching pair), a prompt and one bundled trace."""
    pair_dir = root / "pair"
    save_tiny(noisy_pair(1, noise=0.03), pair_dir)
    (pair_dir / "prompt.txt").write_text(PROMPT, encoding="utf-8")
    pair = load_pair(str(pair_dir / "target"), str(pair_dir / "draft"), device="cpu")
    # EOS off for the trace, so it has enough cycles to walk through
    run_to_trace(Pair(pair.target, pair.draft, set()), PROMPT,
                 SpecSettings(k=4, temperature=1.0, max_new_tokens=40, seed=3), root / "traces" / "default.jsonl")
    (root / "empty").mkdir()
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_teaching_folder(tmp_path_factory.mktemp("teaching"))


@pytest.fixture
def env(folder, monkeypatch, tmp_path) -> Path:
    monkeypatch.setenv("SPECLAB_TEACHING_PAIR", str(folder / "pair"))
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(folder / "traces"))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    return folder


def open_page(name: str) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=180)
    at.run()
    at.switch_page(PAGES[name]).run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def chart_keys(at: AppTest) -> list[str]:
    return [e.proto.id for e in at.get("plotly_chart")]


def figure(at: AppTest, key: str) -> dict:
    found = [e for e in at.get("plotly_chart") if e.proto.id.endswith(f"-{key}")]
    assert len(found) == 1, f"figure {key} not shown: {chart_keys(at)}"
    return json.loads(found[0].proto.spec)


@pytest.mark.parametrize("name", list(PAGES))
def test_every_teaching_page_renders(env, name):
    at = open_page(name)
    assert at.title
    if name in ("rollback", "exactness"):  # the injected pair has no stored result: a button, no wait
        assert "Run live" in at.info[-1].value and "about" in at.info[-1].value or "time unknown" in at.info[-1].value
    else:
        assert at.get("plotly_chart")


def test_walkthrough_covers_five_stages_with_formulas_and_citations(env):
    at = open_page("walkthrough")
    headers = [h.value for h in at.header]
    assert [h[0] for h in headers[:5]] == ["1", "2", "3", "4", "5"]
    assert len(at.latex) >= 6
    text = " ".join(m.value for m in at.markdown)
    assert "Leviathan" in text and "Chen" in text
    assert "assistant" in at.info[0].value  # the everyday analogy for the rollback
    for key in ("wt_cycle_1", "wt_accept", "wt_resample", "wt_cache"):
        figure(at, key)


def test_walkthrough_links_into_the_stepper_at_a_stage(env):
    at = open_page("walkthrough")
    cycle = at.selectbox(key="wt_cycle").value
    at.button(key="wt_link_3").click().run()
    assert not at.exception
    assert at.session_state["cycle"] == cycle and at.session_state["stage"] == 3
    assert at.query_params["stage"] == "3" and at.query_params["cycle"] == str(cycle)
    assert at.subheader[0].value.startswith(f"Cycle {cycle} · stage 3")


def test_walkthrough_without_a_trace_makes_one(env, monkeypatch):
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(env / "empty"))
    at = open_page("walkthrough")
    assert not at.header  # nothing to walk through yet
    at.button(key="wt_make").click().run()
    assert not at.exception, [e.value for e in at.exception]
    finish_job(at)
    assert at.session_state["trace_ref"].kind == "run"
    assert [h.value[0] for h in at.header[:5]] == ["1", "2", "3", "4", "5"]


def run_live_button(at: AppTest):
    """The form's "Run live" button (a form submit button has no key of its own)."""
    [button] = [b for b in at.button if b.label == "Run live" and b.key.startswith("FormSubmitter:")]
    return button


def click_run_live(at: AppTest) -> AppTest:
    """Click "Run live" and wait for the worker thread, as the page's polling would."""
    run_live_button(at).click().run()
    assert not at.exception, [e.value for e in at.exception]
    return finish_job(at)


def test_rollback_page_shows_the_broken_runs_diverging(env):
    at = open_page("rollback")
    assert not at.get("plotly_chart") and "Run live" in at.info[0].value  # nothing stored for this pair
    click_run_live(at)
    assert any("Run live in this session" in c.value for c in at.caption)
    metrics = [(m.label, m.value) for m in at.metric]
    firsts = [v for label, v in metrics if label.startswith("First token")]
    assert firsts[0] == "none" and firsts[1] != "none"  # correct vs keeps-rejected-K/V
    drift = figure(at, "rb_drift")
    names = {t["name"] for t in drift["data"] if t.get("showlegend", True)}
    assert {"correct engine", "broken: keeps rejected K/V", "broken: forgets the draft catch-up"} <= names
    cache = figure(at, "rb_cache")
    assert any("stale" in (t.get("name") or "") for t in cache["data"])


def test_exactness_lab_flags_a_broken_rule(env):
    at = open_page("exactness")
    at.select_slider(key="lab_n").set_value(400)
    click_run_live(at)
    assert at.success and "consistent with the target" in at.success[0].value
    at.radio(key="lab_rule").set_value("token_match").run()  # outside the form: applies at once
    assert not at.exception and not at.error  # not run yet: a button, no long wait
    at.button(key="lab_run").click().run()
    finish_job(at)
    assert at.error and "**not** the target's distribution" in at.error[0].value


def test_interview_questions_have_hidden_answers_and_red_flags(env):
    at = open_page("interview")
    assert len(at.expander) >= 7
    labels = " ".join(e.label for e in at.expander)
    for topic in ("rejected", "K+1", "tokenizers", "greedy", "paged", "stop paying", "acceptance length",
                  "exactly the target's distribution", "pick K"):
        assert topic in labels
    links = [p.proto.page for p in at.get("page_link")]
    assert {"exactness", "statistics", "walkthrough"} <= set(links)  # each answer points at the page that shows it
    assert any(s.value == "Red flags" for s in at.subheader)
    for key in ("iv_cache", "iv_layouts", "iv_speedup", "iv_length"):
        figure(at, key)
    assert "iv_cost" not in " ".join(chart_keys(at))  # nothing is timed on open
    at.button(key="iv_measure_cost").click().run()
    finish_job(at)
    cost = figure(at, "iv_cost")
    bars = cost["data"][0]
    assert len(bars["x"]) == 5 and all(y > 0 for y in bars["y"])  # K=4 in the tiny trace: widths 1..5
    assert "error_y" in bars  # the spread of the repeats is drawn
    words = " ".join(m.value for m in at.markdown)
    assert "positions costs" in words or "not a measurement" in words


# ---------------------------------------------------------------- figures escape token text

HOSTILE = "<img src=x onerror=alert(1)>"


def strings_in(obj) -> list[str]:
    """Every string anywhere in a figure's JSON structure."""
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in strings_in(v)]
    if isinstance(obj, (list, tuple)):
        return [s for v in obj for s in strings_in(v)]
    return []


def test_figures_escape_token_text():
    pair = noisy_pair(1, noise=0.03)
    cmp = compare_runs(pair, [1, 2, 4], SpecSettings(k=3, temperature=0.0, max_new_tokens=8))
    cmp = replace(cmp, texts={i: HOSTILE for i in cmp.texts})
    probe = cmp.runs[KEEP_REJECTED].cycles[-1]
    res = run_lab(pair, [1, 2, 4], SpecSettings(k=1), Faults(), 20)
    figures = [ft.divergence_figure(cmp),
               ft.cache_strip_figure(probe.target_cache, probe.draft_cache, probe.attention, cmp.texts, "t"),
               ft.lab_histogram_figure(res, {i: HOSTILE for i in range(len(res.exact))}, "ratio")]
    for fig in figures:
        texts = strings_in(json.loads(fig.to_json()))
        assert not [t for t in texts if "<img" in t]
        assert [t for t in texts if "&lt;img" in t]
