"""The Diagnose page in Chromium at 1366x768 on every bundled diagnosis: the first screen holds the verdict
and its whole chart, the verdict names the engine's first change, and no tab is wider than the window.
Screenshots of each case's tabs go to test-output/ for a look."""
import json
import shutil
from pathlib import Path

import pytest

from engine.diagnose.verdict import Advice, verdict
from tests.test_browser import (  # noqa: F401 (browser: a fixture)
    SHOTS,
    TIMEOUT_MS,
    browser,
    streamlit_server,
)

ROOT = Path(__file__).resolve().parent.parent
CASES = sorted((ROOT / "assets" / "diagnoses").glob("*.json"))
WIDTH, HEIGHT = 1366, 768
VERDICT_TITLE = "What to change, fastest first"
IDLE = "() => !document.querySelector('[data-stale=\"true\"]') && !document.querySelector('[data-testid=stStatusWidget]')"


@pytest.fixture(scope="module")
def served(example_traces, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser-diagnose")
    (tmp / "traces").mkdir()
    shutil.copy(example_traces["sampled"], tmp / "traces" / "default.jsonl")
    SHOTS.mkdir(exist_ok=True)
    with streamlit_server(tmp / "traces", tmp, "light") as url:
        yield url


def open_case(chromium, url: str, case: str):
    """The page opened on a case the way its arms' requests lead back to it."""
    page = chromium.new_page(viewport={"width": WIDTH, "height": HEIGHT})
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(f"{url}/diagnose?trace=workload:diagnosis~{case}--baseline.zip~request-0001.jsonl")
    page.wait_for_function("t => [...document.querySelectorAll('.js-plotly-plot .gtitle')]"
                           ".some(e => e.textContent.startsWith(t))", arg=VERDICT_TITLE)
    page.wait_for_function(IDLE)
    return page


def no_sideways_scroll(page) -> None:
    wide = page.evaluate("() => document.querySelector('[data-testid=stMain]').scrollWidth")
    assert wide <= WIDTH, f"the page is {wide} px wide in a {WIDTH} px window"


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name, exact=True).click()
    page.wait_for_function("n => [...document.querySelectorAll('[role=tab]')].some(t => t.innerText.trim() === n "
                           "&& t.getAttribute('aria-selected') === 'true')", arg=name)
    page.wait_for_function(IDLE)


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_the_first_screen_holds_the_verdict_and_its_chart(browser, served, path):  # noqa: F811 (the fixture)
    d = json.loads(path.read_text(encoding="utf-8"))
    faster = verdict(d["findings"], Advice(**d["advisor"]), d["baseline"]["requests"])
    page = open_case(browser, served, path.stem)
    first = page.locator("[data-testid=stMarkdownContainer] strong", has_text="Change first" if faster else
                         "Keep these settings").first
    assert first.bounding_box()["y"] + first.bounding_box()["height"] <= HEIGHT
    if faster:
        assert first.inner_text() == f"Change first: {faster[0].name}"
    plot = page.locator(".js-plotly-plot", has=page.locator(".gtitle", has_text=VERDICT_TITLE))
    box = plot.bounding_box()
    assert box["y"] >= 0 and box["y"] + box["height"] <= HEIGHT, f"the verdict's chart ends at {box['y'] + box['height']}"
    no_sideways_scroll(page)
    page.screenshot(path=SHOTS / f"diagnose-{path.stem}-report.png")
    for tab in ("Per request", "Draft agreement"):
        open_tab(page, tab)
        no_sideways_scroll(page)
        page.screenshot(path=SHOTS / f"diagnose-{path.stem}-{tab.lower().replace(' ', '-')}.png", full_page=True)
    page.close()
