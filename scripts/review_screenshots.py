"""First-screen screenshots of every page, tab and bundled item at 1366x768, for a review by eye.

    .venv/bin/python scripts/review_screenshots.py [--only SUBSTRING] [--out DIR]

Starts `streamlit run app/main.py` headless on a free port (as tests/test_browser.py does), opens each view
in Chromium at a projector's 1366x768, waits until the app is idle (no script running, nothing stale, every
chart and table drawn, twice in a row, as tests/test_browser.py's `settled` does) and saves the first screen
only. Writes assets/images/review/*.png and a README.md listing each shot and what to check on it; prints
any view that scrolls sideways or hides a tab, since those are easy to miss by eye.
"""
import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from PIL import Image  # Pillow: installed with Streamlit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a file: `app` imports
from app.figures.style import STAGE_CHART_KEY  # noqa: E402 - after the path above

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "assets" / "images" / "review"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
PROJECTOR = {"width": 1366, "height": 768}
STAGE_CHART = f".st-key-{STAGE_CHART_KEY} .main-svg"  # the stepper's chart for the stage (app/views/stepper.py)
TIMEOUT_MS = 120_000  # two shared CPU cores: a cold page can take a while

# Idle: no script running, nothing stale, every chart drawn and every table on its canvas.
IDLE = """() => !document.querySelector('[data-stale="true"]')
    && !document.querySelector('[data-testid=stStatusWidget]')
    && !(document.querySelector('header') || {innerText: ''}).innerText.includes('Stop')
    && [...document.querySelectorAll('.js-plotly-plot')].every(p => p.querySelector('.main-svg'))
    && [...document.querySelectorAll('[data-testid="stDataFrame"]')].every(d => d.querySelector('canvas'))
    && !!document.querySelector('[data-testid=stMain] h1, [data-testid=stMain] h3')"""

# What a reviewer misses by eye: sideways scrolling (page, main scroller, a Markdown block) and tabs pushed
# past their list's right edge.
LAYOUT = """() => {
  const main = document.querySelector('[data-testid=stMain]');
  const wide = [];
  if (document.scrollingElement.scrollWidth > innerWidth + 1) wide.push('the page');
  if (main && main.scrollWidth > main.clientWidth + 1) wide.push('the main column');
  for (const b of document.querySelectorAll('[data-testid=stMarkdownContainer]'))
    if (b.scrollWidth > b.clientWidth + 1) wide.push('text: ' + b.innerText.slice(0, 50));
  const hidden = [];
  for (const list of document.querySelectorAll('[role=tablist]')) {
    const r = list.getBoundingClientRect();
    for (const t of list.querySelectorAll('[role=tab]')) {
      const b = t.getBoundingClientRect();
      if (b.right > r.right + 1 || b.right > innerWidth) hidden.push(t.innerText.trim());
    }
  }
  const raw = [...document.querySelectorAll('[data-testid=stMain] [data-testid=stMarkdownContainer]')]
    .map(e => e.innerText).filter(t => /<\\/?(span|div|b|code|br|a)\\b|&(lt|gt|amp|quot);/.test(t))
    .map(t => t.slice(0, 60));
  return {wide, hidden, raw};
}"""


@dataclass(frozen=True)
class Shot:
    name: str  # the PNG's name, page--tab--item
    path: str  # URL path and query
    check: str  # what to look for on it
    tab: str = ""  # a tab to open first
    subtab: str = ""  # and a tab inside it
    heading: str = ""  # a heading the page must show before it counts as drawn
    ready: str = ""  # and an element (CSS selector) it must have drawn
    why: bool = False  # open the "Why?" beside a speedup below 1 (a popover)


def bundled(folder: str, suffix: str) -> list[str]:
    return sorted(p.name for p in (ROOT / "assets" / folder).glob(f"*{suffix}"))


def shots() -> list[Shot]:
    traces = bundled("traces", ".jsonl")
    workloads = bundled("workloads", ".zip")
    cases = [n.removesuffix(".json") for n in bundled("diagnoses", ".json")]
    found = []
    stepper = ("cycle 0's stage 1 whole above the fold; heading, controls and charts agree on K and cycle; "
               "spaces and newlines shown as · and ↵ with their legend; no label on a bar")
    for t in traces:
        found.append(Shot(f"stepper--{t.removesuffix('.jsonl')}", f"/?trace=bundled:{t}", stepper,
                          heading="Cycle 0 · stage",
                          ready=".main-svg" if "-tree-" in t else STAGE_CHART))  # a tree draws its own charts
    slow = "chat-sampled-k6-hot-low-acceptance"
    found.append(Shot(f"stepper--{slow}--why", f"/?trace=bundled:{slow}.jsonl",
                      "the reasons for a speedup below 1: its numbers agree with the note and with Statistics",
                      heading="Cycle 0 · stage", ready=STAGE_CHART, why=True))
    for stage, what in [(3, "the test: the table's columns whole, p_target and p_draft values apart"),
                        (4, "the resample or bonus: the residual chart's axis fitted to its bars")]:
        found.append(Shot(f"stepper--default--stage-{stage}", f"/?trace=bundled:default.jsonl&cycle=3&stage={stage}",
                          what, heading="Cycle 3 · stage", ready=STAGE_CHART))
    for tab, what in [("Bundled examples", "the example list and its table whole, speedups below 1× said as slower"),
                      ("Live run", "the live form's fields whole, nothing cut off"),
                      ("Upload", "the uploader and what it accepts")]:
        found.append(Shot(f"source--{tab.lower().replace(' ', '-')}", "/source", what, tab=tab))
    found += [
        Shot("walkthrough--default", "/walkthrough?trace=bundled:default.jsonl",
             "the cycle's steps in order, numbers agreeing with the stepper's for the same cycle"),
        Shot("walkthrough--tree", "/walkthrough?trace=bundled:shakespeare-tree-static-sampled.jsonl",
             "a tree cycle: the tree drawn whole, tokens readable"),
        Shot("rollback--first-screen", "/rollback", "what goes wrong without rollback, shown before any control"),
        Shot("exactness--first-screen", "/exactness", "the claim (same distribution) and the experiment's result "
             "on the first screen"),
        Shot("interview--first-screen", "/interview", "the first question readable, no answer given away"),
    ]
    stats_tabs = ["Acceptance", "Cost and speed", "K advisor", "K sweep", "Batch size", "Race and explorer",
                  "Compare two traces", "KV-cache layout", "Your server"]
    for tab in stats_tabs:
        found.append(Shot(f"statistics--{slug(tab)}", "/statistics?trace=bundled:default.jsonl",
                          "headline's whole-run and median-cycle speedups named and agreeing with the tab; "
                          "axes fitted; no label on data", tab=tab))
    for tab in ["Tree acceptance", "Cost", "Compare with a chain"]:
        found.append(Shot(f"statistics-tree--{slug(tab)}", "/statistics?trace=bundled:chat-tree-static-greedy.jsonl",
                          "a tree trace's statistics: numbers agreeing with the headline", tab=tab))
    workload_tabs = ["Categories", "Positions and context", "Where the loss is", "Requests", "Batch lanes",
                     "Compare two workloads", "Upload or run live"]
    for tab in workload_tabs:  # no trace in the URL: the page as a new user first opens it
        found.append(Shot(f"workload--{slug(tab)}", "/workload",
                          "all seven tabs in view; the headline's numbers agree with the tab's; a comparison "
                          "opens on a different workload; T=0 loss said as such", tab=tab))
    found.append(Shot("workload--why", "/workload", "the same reasons as the stepper's \"Why?\", for the "
                      "workload's speedup below 1; its numbers agree with the headline", tab="Categories", why=True))
    for n, w in enumerate(workloads):
        if n:  # the first is the page's default, shot above
            found.append(Shot(f"workload--categories--{w.removesuffix('.zip')}",
                              f"/workload?trace=workload:bundled~{w}~request-0001.jsonl",
                              "this workload's headline and first chart on the first screen", tab="Categories"))
        if "batch" in w:
            found.append(Shot(f"workload--batch-lanes--{w.removesuffix('.zip')}",
                              f"/workload?trace=workload:bundled~{w}~request-0001.jsonl",
                              "the batch's lanes drawn whole, labels off the bars", tab="Batch lanes"))
    for tab in ["Ranked report", "Per request", "Draft agreement", "Run one live"]:
        found.append(Shot(f"diagnose--{slug(tab)}", "/diagnose",
                          "the verdict ranks changes by tokens/s and its chart fits the first screen; no advice "
                          "contradicting the verdict; a shared 'Why?' for speedups below 1", tab=tab))
    for case in cases[1:]:  # the first case is the page's default, shot above
        found.append(Shot(f"diagnose--ranked-report--{case}",
                          f"/diagnose?trace=workload:diagnosis~{case}--baseline.zip~request-0001.jsonl",
                          "this case's verdict and its chart on the first screen, naming the planted change",
                          tab="Ranked report"))
    return found


def slug(words: str) -> str:
    return words.lower().replace(" ", "-")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(tmp: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, SPECLAB_RUNS_DIR=str(tmp / "runs"), SPECLAB_UPLOADS_DIR=str(tmp / "uploads"))
    for name in ("SPECLAB_TRACE", "SPECLAB_TRACES_DIR", "SPECLAB_WORKLOADS_DIR", "SPECLAB_DIAGNOSES_DIR"):
        env.pop(name, None)  # the bundled items, as a new user sees them
    log = (tmp / "streamlit.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app/main.py", "--server.port", str(port),
                             "--server.headless", "true", "--browser.gatherUsageStats", "false",
                             "--theme.base", "light",
                             # an edit while it runs would put "Source file changed" in the status area for good
                             "--server.fileWatcherType", "none"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited early: see {tmp / 'streamlit.log'}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as answer:
                if answer.read() == b"ok":
                    return proc, url
        except OSError:
            time.sleep(0.5)
    proc.terminate()
    raise TimeoutError("streamlit did not start")


# What the page has drawn so far: idle twice with the same count is settled (a chart's element arrives a
# moment after the script's run ends: a stepper once read as idle with none of its charts there yet).
DRAWN = "() => [...document.querySelectorAll('[data-testid=stMain] .main-svg, [data-testid=stMain] [data-testid]')].length"


def idle(page, ready: str = "") -> None:
    if ready:
        page.wait_for_selector(ready)
    counts = [-1]
    while True:
        page.wait_for_function(IDLE)
        page.wait_for_timeout(500)  # Plotly's last redraw; and a rerun that started late shows up here
        counts.append(page.evaluate(DRAWN))
        if counts[-1] == counts[-2] and page.evaluate(IDLE):
            return


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name, exact=True).first.click()
    page.wait_for_function("n => [...document.querySelectorAll('[role=tab]')].some(t => t.innerText.trim() === n "
                           "&& t.getAttribute('aria-selected') === 'true')", arg=name)
    idle(page)


def take(browser, url: str, shot: Shot, out: Path) -> list[str]:
    """Save the shot's first screen; returns the layout problems found on it."""
    page = browser.new_page(viewport=PROJECTOR)
    page.set_default_timeout(TIMEOUT_MS)
    try:
        page.goto(url + shot.path)
        if shot.heading:
            page.wait_for_function("h => [...document.querySelectorAll('h3')].some(e => e.innerText.startsWith(h))",
                                   arg=shot.heading)
        idle(page, shot.ready)
        for tab in (shot.tab, shot.subtab):
            if tab:
                open_tab(page, tab)
        if shot.why:
            page.get_by_role("button", name="Why?", exact=True).first.click()
            page.wait_for_selector("[data-testid=stPopoverBody]")
            page.wait_for_timeout(500)  # its opening animation
        page.evaluate("window.scrollTo(0, 0)")
        found = page.evaluate(LAYOUT)
        errors = page.locator('[data-testid="stException"]').count()
        file = out / f"{shot.name}.png"
        page.screenshot(path=str(file))
        shrink(file)
    finally:
        page.close()
    return ([f"scrolls sideways: {w}" for w in found["wide"]] + [f"tab hidden: {t}" for t in found["hidden"]]
            + [f"raw markup: {t}" for t in found["raw"]] + (["a traceback on the page"] if errors else []))


def shrink(file: Path) -> None:
    """A 256-colour palette: text and flat charts stay sharp at a third of the size."""
    Image.open(file).convert("RGB").quantize(colors=256, method=Image.Quantize.FASTOCTREE).save(file, optimize=True)


def write_index(out: Path, done: list[Shot]) -> None:
    lines = ["# Review screenshots", "",
             "First screens at 1366x768 (a projector), light theme, written by `scripts/review_screenshots.py` "
             "(rerun it after a change to a page). Each row: the shot, the view it opens, what to check on it.",
             "", "Everywhere: no horizontal scroll, no cut-off column or tab, no label drawn on data, axes fitted "
             "to their data, whitespace tokens shown as · and ↵, no raw HTML or escaped markup, no advice that "
             "contradicts other advice, every number agreeing with the others on the page.", "",
             "| Shot | Opens | Check |", "| --- | --- | --- |"]
    for s in done:
        opens = s.path + (f" · tab {s.tab}" if s.tab else "") + (f" · {s.subtab}" if s.subtab else "")
        lines.append(f"| [{s.name}]({s.name}.png) | `{opens}` | {s.check} |")
    (out / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="only the shots whose name contains this")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright  # the dev requirements' browser driver

    todo = [s for s in shots() if args.only in s.name]
    args.out.mkdir(parents=True, exist_ok=True)
    problems = {}
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_server(Path(tmp))
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
                for n, shot in enumerate(todo, 1):
                    start = time.monotonic()
                    found = take(browser, url, shot, args.out)
                    print(f"[{n}/{len(todo)}] {shot.name} ({time.monotonic() - start:.0f} s)"
                          + "".join(f"\n    {f}" for f in found), flush=True)
                    if found:
                        problems[shot.name] = found
                browser.close()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    if not args.only:
        write_index(args.out, todo)
    print(f"{len(todo)} shots in {args.out}; {len(problems)} with layout problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
