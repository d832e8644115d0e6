"""The Workload page in Chromium on the shipped 100-request workload: its first chart draws, every
request link names that request's trace, and the links followed open the stepper at their cycle."""
import shutil
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from app.ui.state import parse_request_name, parse_token
from engine.workload.folder import open_workload
from engine.workload.stats import workload_stats
from tests.test_browser import (  # noqa: F401 (browser: a fixture)
    SHOTS,
    browser,
    open_page,
    streamlit_server,
)

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "assets" / "workloads" / "tiny-shakespeare-greedy-k4.zip"
LINKS = "els => els.map(a => [a.innerText, a.getAttribute('href')])"


@pytest.fixture(scope="module")
def served(example_traces, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser-workload")
    (tmp / "traces").mkdir()
    shutil.copy(example_traces["sampled"], tmp / "traces" / "default.jsonl")
    (tmp / "workloads").mkdir()
    shutil.copy(SHIPPED, tmp / "workloads" / SHIPPED.name)
    SHOTS.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECLAB_WORKLOADS_DIR", str(tmp / "workloads"))  # streamlit_server passes os.environ on
        with streamlit_server(tmp / "traces", tmp, "light") as url:
            yield url


def stepper_links(page) -> list[tuple[str, dict]]:
    found = page.eval_on_selector_all("[data-testid='stMarkdownContainer'] a[href*='trace=workload']", LINKS)
    return [(text, {k: v[0] for k, v in parse_qs(urlparse(href).query).items()}) for text, href in found]


def request_of(query: dict) -> tuple[str, int]:
    ref = parse_token(query["trace"])
    assert ref is not None and ref.kind == "workload", query
    kind, workload, file = parse_request_name(ref.name)
    assert (kind, workload) == ("bundled", SHIPPED.name)
    return file, int(query["cycle"])


def open_tab(page, name: str, link_text: str) -> None:
    """Open a tab and wait until it shows a link with this text (the last tab's links may linger a moment)."""
    page.get_by_role("tab", name=name, exact=True).click()
    page.wait_for_function("""n => [...document.querySelectorAll('[role=tab]')]
        .some(t => t.innerText.trim() === n && t.getAttribute('aria-selected') === 'true')
        && !document.querySelector('[data-stale="true"]')""", arg=name)
    page.wait_for_function("""t => [...document.querySelectorAll("a[href*='trace=workload']")]
        .some(a => a.innerText === t) && !document.querySelector('[data-stale="true"]')""", arg=link_text)


def test_workload_page_links_every_request_and_opens_its_cycles(browser, served):
    stats = workload_stats(open_workload(SHIPPED).runs())
    files = {r["id"]: r["file"] for r in stats["per_request"]}
    page, dialogs = open_page(browser, f"{served}/workload")
    try:
        page.get_by_role("heading", name="Acceptance across a workload").first.wait_for()
        page.wait_for_selector(".js-plotly-plot .main-svg")  # the categories chart
        open_tab(page, "Requests", stats["per_request"][-1]["id"])
        links = stepper_links(page)
        assert len(links) == stats["requests"] == 100
        assert {text: request_of(q)[0] for text, q in links} == files  # each request's link names its trace
        worst = stats["loss"]["worst_cycles"][0]
        open_tab(page, "Where the loss is", f"{worst['request']} · cycle {worst['cycle']}")
        _, query = next((t, q) for t, q in stepper_links(page) if t == f"{worst['request']} · cycle {worst['cycle']}")
        assert request_of(query) == (worst["file"], worst["cycle"])
        page.screenshot(path=str(SHOTS / "workload-loss.png"), full_page=True)
        assert page.locator('[data-testid="stException"]').count() == 0 and not dialogs
    finally:
        page.close()
    for file, cycle in [(files[stats["per_request"][3]["id"]], 0), (worst["file"], worst["cycle"])]:
        trace = next(r for r in stats["per_request"] if r["file"] == file)
        query = f"trace=workload:bundled~{SHIPPED.name}~{file}&cycle={cycle}&stage=3"
        page, dialogs = open_page(browser, f"{served}/?{query}")
        try:  # the link opens the stepper on that request's trace at that cycle
            page.wait_for_function("c => [...document.querySelectorAll('h3')].some(e => e.innerText.startsWith(c))",
                                   arg=f"Cycle {cycle} ·")
            page.get_by_text(f"Request {trace['id']}").first.wait_for()
            assert page.locator('[data-testid="stException"]').count() == 0 and not dialogs
        finally:
            page.close()
