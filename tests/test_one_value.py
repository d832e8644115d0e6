"""One value per quantity: every page of the real app, on two bundled traces, shows each
number about the trace as engine/stats/analysis.py computes it.

The pages are opened with AppTest; every text they show (Markdown, captions, alerts,
metrics, tables, chart labels) is searched for the places a quantity appears, and each
place must equal the engine's value at the decimals shown. A quantity found in fewer than
two places fails too, so that a reworded page cannot make this test pass by saying nothing.
"""
import json
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.stats.analysis import TraceStats, trace_stats, verify_in_steps
from engine.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent
MAIN = ROOT / "app" / "main.py"
TRACES = ROOT / "assets" / "traces"
PAGES = ("views/stepper.py", "views/walkthrough.py", "views/interview.py", "views/trace_source.py")
STATS_TABS = ("Acceptance", "Cost and speed", "K advisor", "Race and explorer", "Compare two traces")
NUMBER = r"(\d+\.\d+)"

# Where each quantity appears, as the pages word it (after Markdown escapes and bold are removed).
PLACES = {
    "alpha": [rf"α(?: ≈ mean β)? ?= ?{NUMBER}"],
    "c": [rf"\bc = {NUMBER}", rf"c = t_draft / t_step = {NUMBER}"],
    "tokens per cycle": [rf"mean acceptance length {NUMBER}", rf"Mean acceptance length = {NUMBER}",
                         rf"committed {NUMBER} tokens on average", rf"\(measured: {NUMBER}\)"],
    "verify cost at K+1": [rf"verify pass worth {NUMBER} steps", rf"t_verify\(\d+\) in target steps = {NUMBER}",
                           rf"verify pass costing {NUMBER} target steps", rf"verifying \d+ positions took {NUMBER}",
                           rf"a pass over \d+ positions {NUMBER} steps"],
    "measured speedup": [rf"{NUMBER}× its speed", rf"measured speedup {NUMBER}×", rf"Measured speedup = {NUMBER}x",
                         rf"against a measured {NUMBER}×", rf"Measured: {NUMBER}x", rf"This trace measured {NUMBER}×"],
    "Leviathan prediction": [rf"Leviathan predicts {NUMBER}×", rf"Leviathan prediction = {NUMBER}x",
                             rf"a predicted {NUMBER}×", rf"Leviathan's prediction {NUMBER}x",
                             rf"its own α and c predict {NUMBER}×"],
    "refined prediction": [rf"refined {NUMBER}×", rf"Refined prediction = {NUMBER}x", rf"the refined one {NUMBER}x"],
}


def engine_values(stats: TraceStats) -> dict[str, float]:
    r = stats.speed
    return {"alpha": stats.alpha, "c": r.c, "tokens per cycle": stats.acceptance["mean_acceptance_length"],
            "verify cost at K+1": verify_in_steps(stats.calibration, stats.k + 1), "measured speedup": r.measured,
            "Leviathan prediction": r.leviathan, "refined prediction": r.refined}


def texts(at: AppTest) -> list[str]:
    """Everything the page shows as text, with Markdown's escapes and bold taken out."""
    out = [e.value for kind in ("markdown", "caption", "info", "warning", "success", "error")
           for e in at.get(kind)]
    out += [f"{m.label} = {m.value}" for m in at.metric]
    for chart in at.get("plotly_chart"):
        spec = json.loads(chart.proto.spec)
        out += [str(t) for trace in spec.get("data", []) for t in (trace.get("text") or [])]
    return [re.sub(r"\\(.)", r"\1", t).replace("**", "") for t in out]


def shown_places(name: str) -> tuple[list[str], AppTest]:
    """Every page's texts on the trace `name` (statistics: every tab)."""
    at = AppTest.from_file(str(MAIN), default_timeout=120)
    at.query_params["trace"] = f"bundled:{name}"
    at.run()
    found = []
    for page in PAGES:
        at.switch_page(page).run()
        assert not at.exception, (page, [e.value for e in at.exception])
        found += [f"{page}: {t}" for t in texts(at)]
    at.switch_page("views/statistics.py").run()
    for tab in STATS_TABS:
        at.session_state["stats_tab"] = tab
        at.run()
        assert not at.exception, (tab, [e.value for e in at.exception])
        found += [f"statistics {tab}: {t}" for t in texts(at)]
        if tab == "K advisor":
            advisor = at.dataframe[0].value
    return found, advisor


def agrees(shown: str, value: float) -> bool:
    """`shown` is `value` printed at the decimals shown (half a unit of the last digit)."""
    decimals = len(shown.split(".")[1])
    return abs(float(shown) - value) <= 0.5 * 10 ** -decimals + 1e-12


@pytest.mark.parametrize("name", ["default.jsonl", "chat-sampled-k6-hot-low-acceptance.jsonl"])
def test_each_quantity_reads_the_same_on_every_page(name):
    stats = trace_stats(load_trace(TRACES / name))
    assert stats.speed is not None, "both traces carry a calibration"
    places, advisor = shown_places(name)
    listed = rf"\| {re.escape(name)} \| (?:[^|]+\| ){{3}}{NUMBER}× \|"  # Choose a trace's row for this trace
    for quantity, value in engine_values(stats).items():
        patterns = PLACES[quantity] + ([listed] if quantity == "measured speedup" else [])
        seen = [(where, m.group(1)) for where in places for pattern in patterns
                for m in re.finditer(pattern, where)]
        assert len({where.split(":")[0] for where, _ in seen}) >= 2, f"{quantity} shown in under two places: {seen}"
        wrong = [(where[:160], shown) for where, shown in seen if not agrees(shown, value)]
        assert not wrong, f"{quantity} is {value:.4f} in the engine but reads otherwise: {wrong}"
    # The advisor's row at the trace's own K is the headline's refined prediction, not a second one.
    row = advisor[advisor["K"] == stats.k].iloc[0]
    assert agrees(f"{row['refined']:.3f}", stats.speed.refined)
