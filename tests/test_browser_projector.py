"""The stepper on a projector, in a real browser: 1366x768, the bundled traces (K from 2 to 8,
greedy and sampled). In every chart no two drawn labels overlap and none is cut off at
the chart's edge, read from the browser's own bounding boxes. Screenshots go to test-output/.
"""
import json
from collections import defaultdict
from pathlib import Path

import pytest

from app.figures.acceptance import TEST_TABLE_WIDTHS
from app.figures.style import STAGE_CHART_KEY
from app.views.sections.statistics_compare import COMPARE_NAMES_PX, COMPARE_TRACE_PX
from tests.test_browser import CHROMIUM, CHROMIUM_ARGS, SHOTS, TIMEOUT_MS, settled, streamlit_server

sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright python package is not installed")
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing", allow_module_level=True)

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ROOT / "assets" / "traces"
PROJECTOR = {"width": 1366, "height": 768}

# Every label Plotly draws in a chart: texts on cells, values on bars, tick labels, annotations, the axis titles, the
# title; and every bar, so an annotation drawn over a bar is found too.
LABEL_BOXES = """chart => {
  const svg = chart.querySelector('.main-svg').getBoundingClientRect();
  const sel = 'g.textpoint text, text.bartext, g.xtick text, g.ytick text, g.annotation-text-g text, .gtitle, .xtitle, .ytitle';
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  return {svg: [svg.left, svg.top, svg.right, svg.bottom],
          bars: [...chart.querySelectorAll('g.trace.bars g.point path')].map(box).filter(b => b[2] > b[0] && b[3] > b[1]),
          labels: [...chart.querySelectorAll(sel)].filter(e => e.textContent.trim()).map(e => {
            const r = e.getBoundingClientRect();
            return {text: e.textContent, box: [r.left, r.top, r.right, r.bottom],
                    kind: e.closest('g') ? e.closest('g').getAttribute('class') : ''};
          })};
}"""


# Every table (Streamlit draws them on a canvas; its accessibility table carries the same texts): whether it
# scrolls sideways, and each header's and cell's width in the table's own font, measured by the browser.
TABLE_TEXTS = """async () => {
  await document.fonts.ready;
  const canvas = document.createElement('canvas').getContext('2d');
  const width = (text, font) => { canvas.font = font; return canvas.measureText(text).width; };
  const frames = [...document.querySelectorAll('[data-testid=stDataFrame]')];
  if (!frames.every(f => f.querySelector('.dvn-scroller'))) return null;  // a table still being drawn
  return frames.map(f => {
    const scroller = f.querySelector('.dvn-scroller');
    return {scroll: [scroller.scrollWidth, scroller.clientWidth],
            headers: [...f.querySelectorAll('thead th')].map(
              e => [e.textContent, width(e.textContent, '600 14px "Source Sans"')]),
            rows: [...f.querySelectorAll('tbody tr')].map(tr => [...tr.querySelectorAll('td')].map(
              e => [e.textContent, width(e.textContent, '14px "Source Sans"')]))};
  });
}"""
CELL_PADDING_PX = 16  # 8 px either side of a table cell's text

# Text Streamlit cuts with an ellipsis (widget labels, for one): any element whose text overflows its box
# (a file uploader's hidden input, with no text, overflows its zero width and is no cut text).
ELLIPSIZED = """() => [...document.querySelectorAll('[data-testid=stMain] *')].filter(e => {
  const s = getComputedStyle(e);
  return e.textContent.trim() && s.textOverflow === 'ellipsis' && e.scrollWidth > e.clientWidth + 1;
}).map(e => e.textContent)"""


def check_tables(page, where: str, widths: dict[str, int] | None = None) -> int:
    """Assert no table scrolls sideways and every header and value fits its column: its configured
    `widths`, or, for columns sized to their content, the widest text of each column side by side fits
    the table; returns how many tables were checked."""
    # Streamlit draws a table's grid (and its scroller) a moment after the table's frame appears, and a
    # rerun may replace a table at any time: the check and the reading are one evaluation, repeated
    # until every table is drawn (TABLE_TEXTS gives null until then).
    tables = page.wait_for_function(TABLE_TEXTS).json_value()
    for i, table in enumerate(tables):
        scroll, room = table["scroll"]
        assert scroll <= room + 1, f"{where}, table {i}: {scroll} px wide in {room} px, cut off at the right"
        names = [name for name, _ in table["headers"]]
        if widths is None:
            widest = [max((row[n] for row in [table["headers"]] + table["rows"] if n < len(row)), key=lambda c: c[1])
                      for n in range(len(names))]
            need = sum(px + CELL_PADDING_PX for _, px in widest)
            assert need <= room + 1, f"{where}, table {i}: needs {need:.0f} px, has {room}: {[t for t, _ in widest]}"
            continue
        for row in [table["headers"]] + table["rows"]:
            for name, (text, px) in zip(names, row):
                assert px + CELL_PADDING_PX <= widths[name], \
                    f"{where}, table {i}: {text!r} needs {px + CELL_PADDING_PX:.0f} px, column {name!r} has {widths[name]}"
    return len(tables)


def check_no_ellipsis(page, where: str) -> None:
    cut = page.evaluate(ELLIPSIZED)
    assert not cut, f"{where}: cut off with an ellipsis: {cut}"


def first_cycle(trace: str, rejected: bool) -> int:
    records = [json.loads(line) for line in (BUNDLED / trace).read_text().splitlines()[1:]]
    return next(r["cycle"] for r in records if r.get("type") == "cycle"
                and (r["rejected_position"] is not None) == rejected and (not rejected or r["num_accepted"] > 0))


def overlaps(a: list[float], b: list[float], slack: float = 1.0) -> bool:
    return a[0] + slack < b[2] and b[0] + slack < a[2] and a[1] + slack < b[3] and b[1] + slack < a[3]


def check_labels(page, where: str) -> int:
    """Assert no overlapping and no cut-off labels in any chart, and no annotation over a bar;
    returns how many labels were checked."""
    checked = 0
    for i, chart in enumerate(page.query_selector_all(".js-plotly-plot")):
        found = chart.evaluate(LABEL_BOXES)
        left, top, right, bottom = found["svg"]
        labels = found["labels"]
        for n, a in enumerate(labels):
            box = a["box"]
            assert box[0] >= left - 1 and box[2] <= right + 1, f"{where}, chart {i}: {a['text']!r} cut off at the edge"
            for b in labels[n + 1:]:
                assert not overlaps(box, b["box"]), f"{where}, chart {i}: {a['text']!r} overlaps {b['text']!r}"
            if "annotation" in a["kind"]:
                assert not any(overlaps(box, bar) for bar in found["bars"]), \
                    f"{where}, chart {i}: the annotation {a['text']!r} is drawn over a bar"
        checked += len(labels)
    return checked


@pytest.fixture(scope="module")
def projector(tmp_path_factory):
    with streamlit_server(BUNDLED, tmp_path_factory.mktemp("projector"), "light") as url:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport=PROJECTOR)
            page.set_default_timeout(TIMEOUT_MS)
            yield url, page
            browser.close()


VIEWS = [("shakespeare-greedy-k8.jsonl", True, 3), ("shakespeare-greedy-k8.jsonl", True, 4),
         ("shakespeare-greedy-k8.jsonl", False, 4), ("chat-sampled-k6-hot-low-acceptance.jsonl", True, 3),
         ("chat-sampled-k6-hot-low-acceptance.jsonl", True, 4), ("chat-sampled-k2.jsonl", True, 3),
         ("default.jsonl", True, 3), ("default.jsonl", True, 4),
         ("chat-greedy-k4.jsonl", False, 3),  # p_target = p_draft = 1.000: their values once ran together
         ("shakespeare-sampled-k4-high-acceptance.jsonl", True, 3)]


@pytest.mark.parametrize("trace,rejected,stage", VIEWS)
def test_stepper_labels_fit_at_1366x768(projector, trace, rejected, stage):
    url, page = projector
    cycle = first_cycle(trace, rejected)
    page.goto(f"{url}/?trace=bundled:{trace}&cycle={cycle}&stage={stage}")
    settled(page, f"Cycle {cycle} · stage {stage}")
    name = f"projector-{trace.removesuffix('.jsonl')}-cycle{cycle}-stage{stage}"
    page.screenshot(path=SHOTS / f"{name}.png")
    assert check_labels(page, name) > 20
    if stage == 3:  # the test table: every header and value in its column ("not drawr" once)
        assert check_tables(page, name, TEST_TABLE_WIDTHS) == 1
    page.set_viewport_size({"width": PROJECTOR["width"], "height": 2200})  # same width: the rest of the page
    page.wait_for_timeout(800)
    page.screenshot(path=SHOTS / f"{name}-whole-page.png")
    page.set_viewport_size(PROJECTOR)


FOLD_VIEWS = [("default.jsonl", True, stage) for stage in range(1, 6)] + [
    ("default.jsonl", False, 4),  # a bonus instead of a resample
    ("chat-sampled-k6-hot-low-acceptance.jsonl", True, 3),  # slower than plain decoding: a warning on top
    ("shakespeare-cache-paged.jsonl", True, 5),  # the paged layout's block tables follow the caches
    ("shakespeare-greedy-k8.jsonl", True, 3), ("shakespeare-greedy-k8.jsonl", False, 4)]  # K=8: the longest strip


@pytest.mark.parametrize("trace,rejected,stage", FOLD_VIEWS)
def test_each_stage_shows_its_chart_without_scrolling(projector, trace, rejected, stage):
    """A projector shows the stage's own chart (app/views/stepper.py stage_chart) whole, under the
    controls, without scrolling: the test at stages 2 and 3, the resample at 4, the caches at 5."""
    url, page = projector
    cycle = first_cycle(trace, rejected)
    page.goto(f"{url}/?trace=bundled:{trace}&cycle={cycle}&stage={stage}")
    settled(page, f"Cycle {cycle} · stage {stage}")
    page.wait_for_selector(f".st-key-{STAGE_CHART_KEY} .main-svg")
    box = page.locator(f".st-key-{STAGE_CHART_KEY} .main-svg").first.bounding_box()
    top, bottom = box["y"], box["y"] + box["height"]
    assert page.evaluate("window.scrollY") == 0
    assert 0 <= top and bottom <= PROJECTOR["height"], \
        f"{trace} cycle {cycle} stage {stage}: the stage's chart spans {top:.0f}-{bottom:.0f} px of {PROJECTOR['height']}"


STATS_TABS = ["Acceptance", "Cost and speed", "K advisor", "Batch size", "Race and explorer", "Compare two traces",
              "KV-cache layout", "Your server"]  # the K sweep draws no chart until it has run


@pytest.mark.parametrize("trace", ["default.jsonl", "shakespeare-greedy-k8.jsonl"])
def test_statistics_charts_labels_fit_at_1366x768(projector, trace):
    """Every chart of every statistics tab: no overlapping or cut-off labels (e.g. the race's two
    'done' labels when both decoders finish close together)."""
    url, page = projector
    page.goto(f"{url}/statistics?trace=bundled:{trace}")
    page.wait_for_selector(".js-plotly-plot .main-svg")
    checked = tables = 0
    for tab in STATS_TABS:
        page.get_by_role("tab", name=tab).click()
        page.wait_for_timeout(2500)  # the tab's rerun and its charts
        page.set_viewport_size({"width": PROJECTOR["width"], "height": 2600})  # every chart of the tab drawn
        page.wait_for_timeout(600)
        name = f"projector-statistics-{trace.removesuffix('.jsonl')}-{tab.replace(' ', '-').lower()}"
        page.screenshot(path=SHOTS / f"{name}.png")
        checked += check_labels(page, name)
        # e.g. the comparison's model names once ran off its table; and its columns, left to size themselves,
        # cut "this trace"'s model name off: each text fits the width the page gives its column
        widths = defaultdict(lambda: COMPARE_TRACE_PX, {"": COMPARE_NAMES_PX}) if tab == "Compare two traces" else None
        tables += check_tables(page, name, widths)
        check_no_ellipsis(page, name)
        page.set_viewport_size(PROJECTOR)
    assert checked > 40 and tables >= 3


@pytest.mark.parametrize("path", ["walkthrough", "rollback", "exactness"])
def test_teaching_page_charts_labels_fit_at_1366x768(projector, path):
    """The teaching pages' charts (their stored results): no overlapping or cut-off labels."""
    url, page = projector
    page.goto(f"{url}/{path}")
    page.wait_for_selector(".js-plotly-plot .main-svg")
    page.set_viewport_size({"width": PROJECTOR["width"], "height": 4000})  # every chart on the page drawn
    page.wait_for_timeout(2500)
    page.screenshot(path=SHOTS / f"projector-{path}.png")
    assert check_labels(page, path) > 10
    page.set_viewport_size(PROJECTOR)
    page.wait_for_timeout(800)
    check_no_ellipsis(page, path)  # at the projector's size: e.g. a checkbox label in a narrow column


# ---------------------------------------------------------------- first screens, and the address bar while playing

FIRST_SCREENS = [  # page, what its title promises, and whether it is a chart (else a control, shown whole)
    ("exactness", "lab_histogram", True),  # the histogram began about 1,250 px down
    ("rollback", "rb_divergence", True),  # the page opened on four paragraphs
    ("source", "open_bundled", False)]  # the Open button sat below an 18-row table
CHART_ON_SCREEN_PX = 250  # at least this much of a chart above the fold
SCRIPT_DONE = """() => !document.querySelector('[data-stale="true"]')
    && !(document.querySelector('header') || {innerText: ''}).innerText.includes('Stop')"""


@pytest.mark.parametrize("path,key,is_chart", FIRST_SCREENS)
def test_each_page_opens_on_what_its_title_promises(projector, path, key, is_chart):
    url, page = projector
    page.goto(f"{url}/{path}")
    element = page.locator(f".st-key-{key} .main-svg" if is_chart else f".st-key-{key} button").first
    element.wait_for()
    page.wait_for_function(SCRIPT_DONE)
    page.wait_for_timeout(800)  # the layout's last move, as the script's last elements arrive
    box = element.bounding_box()
    page.screenshot(path=SHOTS / f"projector-first-screen-{path}.png")
    assert page.evaluate("document.querySelector('[data-testid=stMain]').scrollTop") == 0
    if is_chart:
        assert box["y"] + CHART_ON_SCREEN_PX <= PROJECTOR["height"], f"{path}: the chart starts at {box['y']:.0f} px"
    else:
        assert box["y"] + box["height"] <= PROJECTOR["height"], f"{path}: the button ends at {box['y'] + box['height']:.0f} px"


SHOWN_STEP = """() => {
  const h = [...document.querySelectorAll('h3')].find(e => /^Cycle \\d+ · stage \\d/.test(e.innerText));
  const q = new URLSearchParams(location.search);
  return [h ? h.innerText.match(/^Cycle (\\d+) · stage (\\d)/).slice(1).join('/') : null,
          `${q.get('cycle')}/${q.get('stage')}`, (SCRIPT_DONE)()];
}""".replace("(SCRIPT_DONE)", f"({SCRIPT_DONE})")  # one evaluation: heading, address bar and whether the run is over


def test_while_playing_the_address_bar_names_the_step_shown(projector):
    """Every step the page settles on while playing is the step its URL names (the address bar lagged a
    step behind, as seen by a user): sampled every 150 ms; a sample is settled when the script's run is
    over (nothing stale, no Stop button), whatever the machine's load makes a run take."""
    url, page = projector
    page.goto(f"{url}/?trace=bundled:default.jsonl&cycle=2&stage=1")
    settled(page, "Cycle 2 · stage 1")
    page.locator(".st-key-playing label").click()
    samples = []
    for _ in range(60):  # about 9 s at the default 1 s a step
        samples.append(tuple(page.evaluate(SHOWN_STEP)))
        page.wait_for_timeout(150)
    page.locator(".st-key-playing label").click()
    settled_steps = [(shown, in_url) for shown, in_url, done in samples if done and shown]
    assert len({shown for shown, _ in settled_steps}) >= 4, samples  # it played
    # A lagging address bar disagrees for the whole step (about six samples). One sample alone may catch
    # the moment a run has begun but neither its Stop button nor its first element has reached the page
    # (seen once under the full suite's load), so a disagreement counts when two samples in a row show it.
    lasting = [a for a, b in zip(settled_steps, settled_steps[1:]) if a == b and a[0] != a[1]]
    assert not lasting, samples
