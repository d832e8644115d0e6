"""The statistics page's "Your server" tab in the real app (streamlit.testing AppTest), on a
bundled trace: pasted metrics explained with engine/servers' numbers, hostile text refused in
one escaped line."""
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.servers.explain import calibrated_costs, explain
from engine.servers.read import read_texts
from engine.stats.analysis import trace_stats
from engine.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent
MAIN = ROOT / "app" / "main.py"
SAMPLES = ROOT / "tests" / "server_samples"
TRACE = ROOT / "assets" / "traces" / "default.jsonl"


@pytest.fixture
def page(monkeypatch, tmp_path) -> AppTest:
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(TRACE.parent))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    at = AppTest.from_file(str(MAIN), default_timeout=120)
    at.query_params["trace"] = f"bundled:{TRACE.name}"
    at.run()
    at.switch_page("views/statistics.py").run()
    at.session_state["stats_tab"] = "Your server"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def paste(at: AppTest, text: str) -> AppTest:
    at.text_area(key="server_paste").input(text).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_pasted_vllm_scrape_is_explained_with_the_engines_numbers(page):
    text = (SAMPLES / "vllm_scrape_1.prom").read_text()
    at = paste(page, text)
    shown = {m.label: m.value for m in at.metric}
    st = trace_stats(load_trace(TRACE))
    expected = explain(read_texts([text]), None, calibrated_costs(st.calibration, 3))  # the default: the calibration
    assert shown["Draft acceptance rate"] == f"{expected.acceptance_rate:.3f}" == "0.500"
    assert shown["alpha (server)"] == f"{expected.alpha:.3f}"
    body = " ".join(m.value for m in at.markdown)
    assert f"refined **{expected.refined:.2f}×**" in body and "What limits this server" in body
    assert not at.error


def test_hostile_paste_is_one_escaped_line(page):
    at = paste(page, 'vllm:spec_decode_num_drafts_total -4\n# <script>alert(1)</script>\n')
    assert len(at.error) == 1 and "negative" in at.error[0].value and "\n" not in at.error[0].value
    at = paste(at, "<b>hello</b> [x](javascript:alert(1))")
    assert len(at.error) == 1 and "<b>" not in at.error[0].value and not at.metric


def test_no_input_says_what_to_do(page):
    assert any("Upload or paste" in i.value for i in page.info)


def test_a_fresh_servers_scrape_shows_nothing_drafted_and_no_advice(page):
    fresh = re.sub(r"\} [0-9.]+", "} 0.0", (SAMPLES / "vllm_scrape_1.prom").read_text())
    at = paste(page, fresh)
    shown = {m.label: m.value for m in at.metric}
    assert shown["Draft acceptance rate"] == shown["Mean acceptance length"] == shown["alpha (server)"] == "nothing drafted"
    body = " ".join(m.value for m in at.markdown)
    assert "drafted nothing in this window" in body and "Predicted speedup" not in body and "0.000" not in body
    assert not at.error


def test_two_scrapes_of_two_servers_are_refused_in_one_line(page):
    files = [("a.prom", (SAMPLES / "vllm_scrape_1.prom").read_bytes(), "text/plain"),
             ("b.prom", (SAMPLES / "sglang_gauges.prom").read_bytes(), "text/plain")]
    at = page.file_uploader(key="server_files").set_value(files).run()
    assert not at.exception, [e.value for e in at.exception]
    line = at.error[0].value  # md() escapes it: quotes as entities, punctuation with backslashes
    assert len(at.error) == 1 and "the first scrape is vLLM" in line and "and the second SGLang" in line
    assert "\n" not in line and not at.metric


def test_one_sglang_rank_out_of_range_is_refused_on_the_page(page):
    text = (SAMPLES / "sglang_gauges.prom").read_text().replace('dp_rank="1"} 0.6', 'dp_rank="1"} 1.4')
    at = paste(page, text)
    assert len(at.error) == 1 and "between 0 and 1" in at.error[0].value and not at.metric
