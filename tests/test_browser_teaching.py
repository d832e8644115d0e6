"""The teaching pages in a real browser: each renders without an exception in the light and
the dark theme, and a screenshot of the whole page (hidden answers opened) is saved under
test-output/ for a person to look at. Token text carrying HTML is shown, never run.

Reuses the app's browser-test helpers (tests/test_browser.py: Debian chromium, never
`playwright install`; the module skips with the reason when chromium or playwright is missing).
"""
import re
from pathlib import Path

import pytest

from tests.test_browser import (  # noqa: F401 (browser: a fixture)
    SHOTS,
    TIMEOUT_MS,
    SentFrames,
    browser,
    click_until_sent,
    streamlit_server,
    sync_api,
    xss_copy,
)
from tests.test_teaching_pages import make_teaching_folder

# A wait on live work (a measurement, a run) waits for the page to show the job's end. Alone such a job
# takes ~14 s here; with another process on both cores it ran past 180 s once. Ten minutes
# bounds a hung job without failing a slow one.
LIVE_WORK_MS = 600_000

PAGES = {"walkthrough": "How one speculative cycle works", "rollback": "What if we don't roll back?",
         "exactness": "Exactness you can see", "interview": "Interview practice"}
LIVE_ONLY = ("rollback", "exactness")
NAV_LABELS = ("How a cycle works", "Why rollback matters", "Exactness lab", "Interview practice")
SCRIPT_DONE = """() => !document.querySelector('[data-stale="true"]')
    && !(document.querySelector('header') || {innerText: ''}).innerText.includes('Stop')"""
IDLE = SCRIPT_DONE + """
    && document.querySelectorAll('.js-plotly-plot .main-svg').length >= 1"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = make_teaching_folder(tmp_path_factory.mktemp("browser_teaching"))
    xss_copy(root / "traces" / "default.jsonl", root / "traces" / "xss.jsonl")
    SHOTS.mkdir(exist_ok=True)
    return root


@pytest.fixture(scope="module", params=["light", "dark"])
def server(request, folder, tmp_path_factory):
    """One server per theme, running the pages on the tiny saved pair (SPECLAB_TEACHING_PAIR)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECLAB_TEACHING_PAIR", str(folder / "pair"))
        mp.setenv("OMP_NUM_THREADS", "1")
        mp.setenv("SPECLAB_CUSTOM_MODELS", "1")  # the live run may load the tiny pair's folders
        with streamlit_server(folder / "traces", tmp_path_factory.mktemp(f"server-{request.param}"),
                              request.param) as url:
            yield url, request.param


def settle(page, title: str) -> None:
    """Wait for the title, then until the script has finished and the charts are drawn, twice."""
    page.get_by_role("heading", name=title).first.wait_for()
    for _ in range(2):
        page.wait_for_function(IDLE)
        page.wait_for_timeout(700)


def open_expanders(page) -> None:
    """Open every closed expander (one click each), so the screenshot shows the hidden answers."""
    closed = page.locator('[data-testid="stExpander"] details:not([open]) > summary')
    for _ in range(closed.count()):
        closed.first.click()
    page.wait_for_timeout(1000)


def screenshot_whole_page(page, path: Path) -> None:
    """Streamlit scrolls inside its main container: grow the viewport to its height first."""
    height = page.evaluate("() => document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
    page.set_viewport_size({"width": 1400, "height": min(int(height) + 40, 16000)})
    page.wait_for_timeout(1500)  # Plotly redraws at the new width
    page.screenshot(path=str(path))


def new_page(browser, url: str):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(TIMEOUT_MS * 2)  # live model runs on two shared cores
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.sent = SentFrames(page)  # before goto: the page's websocket opens while it loads
    page.goto(url)
    return page, dialogs


@pytest.mark.parametrize("name", list(PAGES))
def test_teaching_page_renders(browser, server, name):
    url, theme = server
    page, dialogs = new_page(browser, f"{url}/{name}")
    try:
        if name in LIVE_ONLY:  # the injected pair has no stored result: the page waits for Run live
            page.get_by_role("heading", name=PAGES[name]).first.wait_for()
            page.get_by_text("No stored result", exact=False).first.wait_for()
            assert page.locator(".js-plotly-plot").count() == 0  # nothing heavy ran on open
            click_until_sent(page.get_by_role("button", name="Run live").first, page.sent)
        settle(page, PAGES[name])
        open_expanders(page)
        assert page.locator('[data-testid="stException"]').count() == 0
        assert page.locator(".js-plotly-plot:visible").count() >= 1
        nav = page.locator('[data-testid="stSidebarNav"]')
        assert all(nav.get_by_text(label).count() == 1 for label in NAV_LABELS)
        screenshot_whole_page(page, SHOTS / f"teaching-{name}-{theme}.png")
        assert not dialogs
    finally:
        page.close()


@pytest.mark.parametrize("server", ["light"], indirect=True)
def test_walkthrough_shows_html_token_text_as_text(browser, server):
    url, _ = server
    page, dialogs = new_page(browser, f"{url}/walkthrough?trace=bundled:xss.jsonl")
    try:
        settle(page, PAGES["walkthrough"])
        page.wait_for_timeout(1500)
        assert not dialogs, dialogs  # an <img onerror> that ran would have opened an alert
        assert page.locator("img[src='x']").count() == 0
        assert page.get_by_text("img", exact=False).count() > 0  # shown as text
    finally:
        page.close()


@pytest.mark.parametrize("server", ["light"], indirect=True)
def test_a_measurement_finishes_in_the_background_and_shows_up(browser, server):
    """In a real server the polling fragment (app/ui/jobs.py) notices the worker is done and the
    page draws the result without another click."""
    url, _ = server
    page, dialogs = new_page(browser, f"{url}/interview")
    try:
        settle(page, PAGES["interview"])
        page.get_by_text("Why does verification score K+1 positions", exact=False).first.click()
        click_until_sent(page.get_by_role("button", name="Measure the target's pass", exact=False).first, page.sent)
        # the job's end, as the page shows it; bounded for a busy 2-core machine (alone it takes ~14 s)
        page.get_by_text(re.compile("Here scoring|The repeats disagree by more than")).first.wait_for(timeout=LIVE_WORK_MS)
        page.wait_for_function(IDLE)  # the run that drew them has ended: stale elements are gone
        page.screenshot(path=str(SHOTS / "interview-measured-in-background.png"))
        assert page.locator('[data-testid="stException"]').count() == 0
        sync_api.expect(page.get_by_role("button", name="Measure the target's pass", exact=False)).to_have_count(0)
        assert not dialogs
    finally:
        page.close()


def open_tab_until_shown(page, name: str, inside, tries: int = 5) -> None:
    """Click a tab until `inside` (an element of its panel) is visible. A tab switches in the browser alone and
    sends the server nothing, so a click lost to a rerun redrawing the tabs (once in a full CI-like run on a busy
    2-core machine: the panel stayed hidden for the test's whole 3 minutes) shows only as the panel not opening."""
    for _ in range(tries):
        page.get_by_role("tab", name=name).click()
        try:
            inside.wait_for(state="visible", timeout=10_000)
            return
        except sync_api.TimeoutError:
            continue
    inside.wait_for(state="visible")


@pytest.mark.parametrize("server", ["light"], indirect=True)
def test_a_live_run_arrives_by_polling_and_the_sidebar_names_it(browser, server, folder):
    """After one click on Run, nothing else: the polling fragment notices the worker is done, the
    page shows the finished run and the sidebar names it as the open trace."""
    url, _ = server
    page, dialogs = new_page(browser, f"{url}/source")
    try:
        page.get_by_role("heading", name="Choose a trace").first.wait_for()
        page.wait_for_function(SCRIPT_DONE)
        open_tab_until_shown(page, "Live run", page.locator(".st-key-live_preset input"))
        page.locator(".st-key-live_preset input").click()  # opens the list of model pairs
        page.get_by_role("option", name=re.compile("^custom")).click()
        page.locator(".st-key-live_target input").wait_for()
        for key, name in (("live_target", "target"), ("live_draft", "draft")):
            field = page.locator(f".st-key-{key} input")
            field.fill(str(folder / "pair" / name))
            field.press("Enter")
        page.locator(".st-key-live_max_new input").fill("12")
        page.locator(".st-key-live_max_new input").press("Enter")
        page.wait_for_function(SCRIPT_DONE)
        page.wait_for_timeout(500)
        sidebar = page.locator('[data-testid="stSidebar"]')
        assert "live run:" not in sidebar.inner_text()
        # a trace at the form's K, whatever the advisor says
        click_until_sent(page.locator(".st-key-live_insist_k label"), page.sent)
        page.wait_for_function(SCRIPT_DONE)
        click_until_sent(page.locator(".st-key-live_run button"), page.sent)
        page.get_by_text(re.compile(r"Finished: \d+ cycles, \d+ tokens")).first.wait_for(timeout=LIVE_WORK_MS)
        sync_api.expect(sidebar).to_contain_text("live run: live-")
        page.screenshot(path=str(SHOTS / "live-run-finished-in-background.png"))
        assert page.locator('[data-testid="stException"]').count() == 0 and not dialogs
    finally:
        page.close()
