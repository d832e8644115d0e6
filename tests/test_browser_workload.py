"""The Workload page in Chromium on the shipped workloads: its first chart draws, every request link
names that request's trace, and the links followed open the stepper at their cycle; at 1366x768 every
tab is in view and no tab's content makes the page scroll sideways. On a replica (`engine replica`'s
folder, tests/replica_sample.py), clicking the request's link opens the stepper at the replica's cycle
where it parts from its server; on a vLLM capture folder, a request's link opens its captured trace."""
import shutil
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from app.ui.state import parse_request_name, parse_token
from engine.workload.folder import open_workload
from engine.workload.stats import workload_stats
from tests.replica_sample import PARTED, build_replica_runs
from tests.test_browser import (  # noqa: F401 (browser: a fixture)
    SHOTS,
    TIMEOUT_MS,
    browser,
    open_page,
    streamlit_server,
)
from tests.test_browser_projector import PROJECTOR
from tests.test_captured_workload import mixed_capture
from tests.test_workload_truth import DRAFT, LOOKUP, TWIN

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
            page.get_by_text(f"{trace['id']} ({trace['category']}) of workload").first.wait_for()  # the sidebar names it
            assert page.locator('[data-testid="stException"]').count() == 0 and not dialogs
        finally:
            page.close()


# Sideways overflow at three levels: the page, Streamlit's main scroller (a too-wide table widened it while
# the page itself stayed put) and each Markdown block (a table wider than its column scrolls inside it);
# and each tab's box against its tab list's (a tab past the list's right edge is hidden behind an arrow).
LAYOUT = """() => {
  const main = document.querySelector('[data-testid=stMain]');
  const list = document.querySelector('[role=tablist]').getBoundingClientRect();
  return {page: [document.scrollingElement.scrollWidth, innerWidth], main: [main.scrollWidth, main.clientWidth],
          blocks: [...main.querySelectorAll('[data-testid=stMarkdownContainer]')]
            .filter(b => b.scrollWidth > b.clientWidth + 1).map(b => b.innerText.slice(0, 60)),
          hidden: [...document.querySelectorAll('[role=tab]')].map(t => [t.innerText.trim(), t.getBoundingClientRect()])
            .filter(([_, r]) => r.left < list.left - 1 || r.right > list.right + 1 || r.right > innerWidth)
            .map(([name, _]) => name)};
}"""
SETTLED = """() => !document.querySelector('[data-stale="true"]')
    && !(document.querySelector('header') || {innerText: ''}).innerText.includes('Stop')"""


@pytest.fixture(scope="module")
def chat_served(tmp_path_factory):
    """The bundled chat workloads: 11 categories (the widest tables) and a batched twin listed second."""
    tmp = tmp_path_factory.mktemp("browser-workload-chat")
    (tmp / "workloads").mkdir()
    for name in (DRAFT, TWIN, LOOKUP):
        shutil.copy(SHIPPED.parent / name, tmp / "workloads" / name)
    SHOTS.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECLAB_WORKLOADS_DIR", str(tmp / "workloads"))
        with streamlit_server(ROOT / "assets" / "traces", tmp, "light") as url:
            yield url


def test_every_workload_tab_fits_1366x768(browser, chat_served):
    page = browser.new_page(viewport=PROJECTOR)
    page.set_default_timeout(TIMEOUT_MS)
    try:
        page.goto(f"{chat_served}/workload")
        page.wait_for_selector(".js-plotly-plot .main-svg")
        names = [t.strip() for t in page.eval_on_selector_all("[role=tab]", "els => els.map(e => e.innerText)")]
        assert "Upload or run live" in names and len(names) == 7
        for name in names:
            page.get_by_role("tab", name=name, exact=True).click()
            page.wait_for_function("""n => [...document.querySelectorAll('[role=tab]')]
                .some(t => t.innerText.trim() === n && t.getAttribute('aria-selected') === 'true')""", arg=name)
            for _ in range(2):  # a rerun that started late shows up in the second wait
                page.wait_for_function(SETTLED)
                page.wait_for_timeout(500)
            layout = page.evaluate(LAYOUT)
            page.screenshot(path=str(SHOTS / f"workload-1366-{name.lower().replace(' ', '-')}.png"))
            assert layout["page"][0] <= layout["page"][1], (name, layout)
            assert layout["main"][0] <= layout["main"][1], (name, layout)
            assert not layout["blocks"] and not layout["hidden"], (name, layout)
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        page.close()


def unsafe_name(data: bytes) -> bytes:
    from tests.test_workload_zips import members, zipped
    return zipped({**members(), "../escaped.txt": b"outside"})


@pytest.mark.parametrize("damage", ["wrong_crc", "encrypted", "points_at_another_header", "unsafe_name"])
def test_a_damaged_workload_upload_is_refused_in_one_line(browser, served, damage):
    """Through the real upload widget: one line naming the file and the entry, no traceback, nothing kept."""
    from tests import test_workload_zips as zips
    data = (unsafe_name if damage == "unsafe_name" else getattr(zips, damage))(zips.good())
    page = browser.new_page(viewport=PROJECTOR)
    page.set_default_timeout(TIMEOUT_MS)
    try:
        page.goto(f"{served}/workload")
        page.get_by_role("tab", name="Upload or run live", exact=True).click()
        page.locator(".st-key-workload_upload input[type=file]").set_input_files(
            {"name": f"{damage}.zip", "mimeType": "application/zip", "buffer": data})
        alert = page.locator('[data-testid="stAlertContentError"]', has_text="Could not open this file as a workload")
        alert.first.wait_for()
        said = alert.first.locator('[data-testid="stMarkdownContainer"]').inner_text().strip()  # not the icon's name
        assert "\n" not in said and f"{damage}.zip" in said, said
        named = {"unsafe_name": "'../escaped.txt'", "points_at_another_header": "overlaps"}.get(damage, f"'{zips.VICTIM}'")
        assert f"entry {named}" in said or named in said, said  # the entry at fault (two overlapping: the first)
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        page.close()


def follow_to_cycle(page, link, cycle):
    """Click a request link and return the page it opened (a new tab, as Streamlit opens a Markdown link, or this
    one) once its stepper shows that cycle's heading."""
    stepper = page
    if link.first.get_attribute("target") == "_blank":
        with page.context.expect_page() as opened:
            link.first.click()
        stepper = opened.value
    else:
        link.first.click()
    stepper.set_default_timeout(TIMEOUT_MS)
    stepper.wait_for_function("c => [...document.querySelectorAll('h3')].some(e => e.innerText.startsWith(c))",
                              arg=f"Cycle {cycle} ·")
    return stepper


@pytest.fixture(scope="module")
def replica_served(example_traces, tmp_path_factory):
    """A server whose only workload is a replica with a hand-made comparison (no vLLM needed)."""
    root, parted_at = build_replica_runs(tmp_path_factory.mktemp("browser-replica"), Path(example_traces["sampled"]))
    SHOTS.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECLAB_WORKLOADS_DIR", str(root / "no-bundled"))
        with streamlit_server(root / "traces", root, "light") as url:
            yield url, parted_at


def test_clicking_a_replicas_request_opens_the_stepper_at_the_cycle_where_it_parts(browser, replica_served):
    url, parted_at = replica_served
    page, dialogs = open_page(browser, f"{url}/workload")
    stepper = page
    try:
        page.get_by_role("heading", name="Against its server").first.wait_for()
        link = page.locator("[data-testid='stMarkdownContainer'] a[href*='trace=workload']",
                            has_text=f" · cycle {parted_at}")
        link.first.wait_for()
        assert link.count() == 1
        text, query = stepper_links(page)[[t for t, _ in stepper_links(page)].index(link.first.inner_text())]
        ref = parse_token(query["trace"])
        assert parse_request_name(ref.name) == ("run", "replica-of-vllm", PARTED) and query["cycle"] == str(parted_at)
        # The stepper, as the person sees it: the cycle's heading names the replica's cycle where it parts.
        stepper = follow_to_cycle(page, link, parted_at)
        shown = stepper.eval_on_selector_all("h3", "els => els.map(e => e.innerText)")
        assert [h for h in shown if h.startswith("Cycle ")][0].startswith(f"Cycle {parted_at} ·"), shown
        assert "replica-of-vllm" in stepper.locator("[data-testid=stSidebar]").inner_text()
        stepper.screenshot(path=str(SHOTS / "replica-link-stepper.png"))
        assert stepper.locator('[data-testid="stException"]').count() == 0 and not dialogs
    finally:
        if stepper is not page:
            stepper.close()
        page.close()


@pytest.fixture(scope="module")
def capture_served(example_traces, tmp_path_factory):
    """A server whose only workload is a vLLM capture folder (the recorder fed made-up steps, no vLLM needed)
    put under the live runs' workloads, as an engineer would copy SPECLAB_CAPTURE_DIR there."""
    root = tmp_path_factory.mktemp("browser-capture")
    mixed_capture(root / "runs" / "workloads" / "captured-vllm")
    (root / "traces").mkdir()
    shutil.copy(example_traces["sampled"], root / "traces" / "default.jsonl")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECLAB_WORKLOADS_DIR", str(root / "no-bundled"))
        with streamlit_server(root / "traces", root, "light") as url:
            yield url


def test_a_captured_request_opens_from_the_workload_page_in_the_stepper(browser, capture_served):
    page, dialogs = open_page(browser, f"{capture_served}/workload")
    stepper = page
    try:
        page.get_by_role("heading", name="Acceptance across a workload").first.wait_for()
        open_tab(page, "Requests", "cmpl-c")
        links = {text: q for text, q in stepper_links(page)}
        assert set(links) == {"cmpl-a", "cmpl-b", "cmpl-c"}  # the finished greedy requests, each its own trace
        ref = parse_token(links["cmpl-c"]["trace"])
        assert parse_request_name(ref.name) == ("run", "captured-vllm", "request-0005.jsonl")
        link = page.locator("[data-testid='stMarkdownContainer'] a[href*='trace=workload']", has_text="cmpl-c")
        stepper = follow_to_cycle(page, link, links["cmpl-c"].get("cycle", "0"))
        assert "cmpl-c" in stepper.locator("[data-testid=stSidebar]").inner_text()
        stepper.screenshot(path=str(SHOTS / "capture-link-stepper.png"))
        assert stepper.locator('[data-testid="stException"]').count() == 0 and not dialogs
    finally:
        if stepper is not page:
            stepper.close()
        page.close()
