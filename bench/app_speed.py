"""App speed: each page's time to its first result and to all its charts; one Next step's server time.

    python -m bench.app_speed                       # default bundled trace, a generated 500-cycle trace
    python -m bench.app_speed --long-trace FILE     # use an existing long trace
    python -m bench.app_speed --pages-only          # only the per-page timings (app-pages.json and .md)

1. Pages: one server; each page opened in headless Chromium (Playwright), first cold, then
   rounds of a new visitor (a fresh browser context) and a returning browser (one context kept,
   HTTP cache warm). Times, from navigation, when the page's first result (FIRST_RESULT_OF) is
   drawn and when every chart it draws at load is (MARKS_JS). bench/floor_page.py gives the
   reference rows: a title and one small chart or table, nothing else.
2. Start to first chart: starts `streamlit run app/main.py` on the bundled default
   trace, opens it as soon as the server answers, and times until the first Plotly chart is
   drawn. Also times a second, warm page load.
3. Next step: streamlit.testing AppTest on a trace of at least 500 cycles; clicks Next
   repeatedly and reads the server's time of each script run (app/ui/timing.py).
Writes bench/results/app-speed.json and .md (or, with --pages-only, app-pages.json and .md).
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.common import RESULTS, machine_info, machine_words, write_results

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_server(port: int, deadline_s: float = 120) -> None:
    end = time.perf_counter() + deadline_s
    while time.perf_counter() < end:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=1)
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError("the Streamlit server did not answer")


def first_chart_s(page, url: str, marks: dict | None = None) -> float:
    """Seconds from navigation to the first drawn Plotly chart; `marks` also gets the page title's time."""
    start = time.perf_counter()
    page.goto(url)
    page.wait_for_selector("h1", timeout=120_000)
    if marks is not None:
        marks["title_s"] = time.perf_counter() - start
    page.wait_for_selector(".js-plotly-plot .main-svg", timeout=120_000)
    return time.perf_counter() - start


def time_to_first_chart(env: dict) -> dict:
    """Cold: process start to the first chart; browser: page load to the first chart; warm: a reload."""
    from playwright.sync_api import sync_playwright

    port = free_port()
    started = time.perf_counter()
    server = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(ROOT / "app" / "main.py"),
                               "--server.headless", "true", "--server.port", str(port),
                               "--browser.gatherUsageStats", "false"], env=env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_server(port)
        server_up = time.perf_counter() - started
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            first = first_chart_s(page, f"http://127.0.0.1:{port}/")
            cold = time.perf_counter() - started
            marks: dict = {}
            warm = [first_chart_s(browser.new_page(), f"http://127.0.0.1:{port}/", marks) for _ in range(3)]
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    return {"server_up_s": server_up, "first_page_to_chart_s": first, "cold_start_to_chart_s": cold,
            "warm_page_to_chart_s": statistics.median(warm), "warm_page_to_title_s": marks["title_s"]}


PAGES = {"Step through cycles": "", "Choose a trace": "source", "How a cycle works": "walkthrough",
         "Why rollback matters": "rollback", "Exactness lab": "exactness", "Interview practice": "interview",
         "Statistics and speed": "statistics"}
# A page's first result: the first thing on it that answers what the page is for. Chart pages put
# it in app/ui/first_result.py's container, plain Markdown that needs neither Plotly nor the data grid
# (Choose a trace: its list of bundled traces, a Markdown table):
#   stepper: the cycle's draft tokens with p_draft (and, by stage, p_target, marks, what is committed);
#   walkthrough: the chosen cycle in brief; rollback / exactness: the stored result in words;
#   statistics: alpha, acceptance, measured speedup and tokens/s.
FIRST_RESULT_BOX = (".st-key-first_result [data-testid='stMarkdownContainer'], "
                    ".st-key-first_result [data-testid='stCaptionContainer']")  # its text (st.markdown or st.caption)
FIRST_RESULT_OF = {"": FIRST_RESULT_BOX, "walkthrough": FIRST_RESULT_BOX, "rollback": FIRST_RESULT_BOX,
                   "exactness": FIRST_RESULT_BOX, "statistics": FIRST_RESULT_BOX,
                   "source": "[data-testid='stMarkdownContainer'] table",  # the table of bundled traces
                   "interview": "[data-testid='stExpander']",  # its questions (their charts sit in closed expanders)
                   "?chart=1": ".js-plotly-plot .main-svg", "?chart=0": "[data-testid='stTable'] table"}
FIRST_RESULT = (".js-plotly-plot .main-svg, [data-testid='stDataFrame'] canvas, "
                "[data-testid='stTable'] table")  # a chart or a table drawn: a page not named above

# Installed in every page before its own scripts. Each animation frame (a frame runs only when the
# main thread is free, so a mark means "could be painted") it records, in ms since navigation:
#   first: the first result's selector matches a visible element;
#   all: the script run has ended, no visible element still waits for its code (Streamlit's
#        skeleton), and every visible Plotly chart has drawn its SVG. `charts`: how many there were.
MARKS_JS = """(firstSelector) => {
  const marks = window.__speedMarks = {};
  const visible = e => e.getClientRects().length > 0;
  const tick = () => {
    const now = performance.now();
    if (marks.first === undefined && [...document.querySelectorAll(firstSelector)].some(visible)) marks.first = now;
    const app = document.querySelector("[data-testid='stApp']");
    if (marks.first !== undefined && app && app.getAttribute('data-test-script-state') === 'notRunning') {
      const charts = [...document.querySelectorAll("[data-testid='stPlotlyChart']")].filter(visible);
      const waiting = [...document.querySelectorAll("[data-testid='stSkeleton']")].filter(visible);
      if (!waiting.length && charts.every(c => c.querySelector('.main-svg'))) {
        marks.all = now; marks.charts = charts.length; return;
      }
    }
    requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
}"""


def timed_load(context, url: str, selector: str) -> dict:
    """One page load in `context`: seconds from navigation to the first result and to all charts drawn."""
    page = context.new_page()
    try:
        page.goto(url, wait_until="commit")
        page.wait_for_function("() => window.__speedMarks && window.__speedMarks.all !== undefined", timeout=120_000)
        marks = page.evaluate("() => window.__speedMarks")
    finally:
        page.close()
    return {"first_s": marks["first"] / 1000, "all_charts_s": marks["all"] / 1000, "charts": marks["charts"]}


def new_context(browser, selector: str):
    context = browser.new_context(viewport={"width": 1366, "height": 768})
    context.add_init_script(f"({MARKS_JS})({json.dumps(selector)})")
    return context


def fresh_load(browser, url: str, selector: str) -> dict:
    """One load of `url` by a new visitor: a fresh browser context, closed afterwards."""
    context = new_context(browser, selector)
    try:
        return timed_load(context, url, selector)
    finally:
        context.close()


def time_pages(env: dict, repeats: int = 3, script: Path | None = None, pages: dict | None = None) -> dict:
    """Each page, in one fresh server process: page load to its first result (FIRST_RESULT_OF) and
    to all its charts drawn at load.
    cold: the first time the page is opened (its models, stored results and caches not yet loaded),
    in a fresh browser context. Then `repeats` rounds, each one load in a fresh context (nothing
    cached: a new visitor) and one in a returning browser (one context kept for the page, opened
    once before the rounds, so its HTTP cache holds the app's scripts), alternating which goes first.
    warm: the median over the rounds. `script` and `pages`: another app (the reference page)."""
    from playwright.sync_api import sync_playwright

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(script or ROOT / "app" / "main.py"),
                               "--server.headless", "true", "--server.port", str(port),
                               "--browser.gatherUsageStats", "false"], env=env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = {}
    try:
        wait_for_server(port)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            for name, path in (pages or PAGES).items():
                selector = FIRST_RESULT_OF.get(path, FIRST_RESULT)
                url = f"http://127.0.0.1:{port}/{path}"

                cold = fresh_load(browser, url, selector)
                returning = new_context(browser, selector)
                timed_load(returning, url, selector)  # the returning browser's earlier visit
                loads = {"fresh": [], "returning": []}
                for i in range(repeats):
                    for kind in (("fresh", "returning") if i % 2 == 0 else ("returning", "fresh")):
                        loads[kind].append(fresh_load(browser, url, selector) if kind == "fresh"
                                           else timed_load(returning, url, selector))
                returning.close()
                out[name] = {"first_result": selector, "charts": cold["charts"],
                             "cold_s": cold["first_s"], "cold_all_charts_s": cold["all_charts_s"]}
                for kind, runs in loads.items():
                    prefix = "warm" if kind == "fresh" else "returning"
                    out[name].update({f"{prefix}_s": statistics.median(r["first_s"] for r in runs),
                                      f"{prefix}_all_charts_s": statistics.median(r["all_charts_s"] for r in runs),
                                      f"{prefix}_all_s": [r["first_s"] for r in runs],
                                      f"{prefix}_all_charts_all_s": [r["all_charts_s"] for r in runs]})
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    return out


REFERENCE_PAGES = {"(reference: title and one small chart)": "?chart=1",
                   "(reference: title and one small table)": "?chart=0"}  # bench/floor_page.py


def make_long_trace(path: Path, cycles: int = 500) -> Path:
    """A real run of at least `cycles` cycles: the tiny-shakespeare pair if trained, else tiny test models."""
    import torch

    from engine.config import SpecSettings
    from engine.cycle.pair import Pair
    from engine.models.loading import ModelLoadError
    from engine.run import load_preset, run_to_trace

    torch.set_num_threads(1)
    try:
        pair, prompt, preset = load_preset("tiny-shakespeare", device="cpu"), "Romeo.\n", "tiny-shakespeare"
    except (ModelLoadError, OSError, ValueError):
        from tests.tiny import noisy_pair
        pair, prompt, preset = noisy_pair(0, noise=0.05), "the cat sat on", None
    pair = Pair(pair.target, pair.draft, set())  # no EOS: run to the token budget
    for tokens_per_cycle in (3, 5):  # a cycle commits 1..K+1 tokens; retry with more if it fell short
        s = SpecSettings(k=4, temperature=1.0, max_new_tokens=cycles * tokens_per_cycle, seed=0)
        if len(run_to_trace(pair, prompt, s, path, preset=preset, chat_template=False).cycles) >= cycles:
            return path
    raise RuntimeError(f"could not make a trace of {cycles} cycles")


def next_step_ms(trace: Path, clicks: int) -> dict:
    """Server time of each Next click on the stepper, from cycle 400 of the long trace."""
    import streamlit.testing.v1.app_test as app_test
    from streamlit.runtime.scriptrunner.script_cache import ScriptCache
    from streamlit.testing.v1 import AppTest

    from app.ui import timing

    shared = ScriptCache()  # a server compiles each page once; AppTest would recompile on every run
    app_test.ScriptCache = lambda: shared
    os.environ["SPECLAB_TRACE"] = str(trace)
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120)
    at.query_params.update({"trace": "env", "cycle": "400", "stage": "4"})
    at.run()
    at.button(key="nav_next").click().run()  # warms the per-trace caches, as a user's first step does
    timing.RECENT_RUNS_MS.clear()
    timing.RECENT_RUNS_CPU_MS.clear()
    for _ in range(clicks):
        at.button(key="nav_next").click().run()
    assert not at.exception, [e.value for e in at.exception]
    runs, cpu = list(timing.RECENT_RUNS_MS), list(timing.RECENT_RUNS_CPU_MS)
    from engine.trace import load_trace

    return {"cycles": len(load_trace(trace).cycles),
            "clicks": clicks, "median_ms": statistics.median(runs), "best_ms": min(runs), "worst_ms": max(runs),
            "median_cpu_ms": statistics.median(cpu), "runs_ms": runs, "runs_cpu_ms": cpu}


def pages_markdown(pages: dict) -> list[str]:
    rows = ["", "Each page, seconds from navigation to its first result (first; bench/app_speed.py FIRST_RESULT_OF "
            "says what that is per page) and to all the charts it draws at load (charts). A fresh server; cold = "
            "first open, in a fresh browser context. Warm: median of the next rounds, each a load in a fresh context "
            "(new visitor, nothing cached) and one in a returning browser (same context, HTTP cache). "
            "Goal: first result at most 10 s cold and 2 s warm (new visitor).", "",
            "| page | cold: first | cold: charts | warm new visitor: first | warm new visitor: charts "
            "| warm returning: first | warm returning: charts | charts at load | goal |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name, t in pages.items():
        ok = "met" if t["cold_s"] <= 10 and t["warm_s"] <= 2 else "**missed**"
        ok = "" if name in REFERENCE_PAGES else ok
        rows.append(f"| {name} | {t['cold_s']:.2f} | {t['cold_all_charts_s']:.2f} | {t['warm_s']:.2f} | "
                    f"{t['warm_all_charts_s']:.2f} | {t['returning_s']:.2f} | {t['returning_all_charts_s']:.2f} | "
                    f"{t['charts']} | {ok} |")
    return rows + [""]


def markdown(result: dict) -> str:
    m, f, n = result["machine"], result["first_chart"], result["next_step"]
    ok = "met" if n["median_ms"] <= 150 else "**missed**"
    return "\n".join([
        "## App speed (bench/app_speed.py)", "",
        f"Machine: {machine_words(m)}; {m['date']}.", "",
        "| measure | time |", "|---|---|",
        f"| server start to first chart (cold, {f['trace']} trace) | {f['cold_start_to_chart_s']:.2f} s |",
        f"| of which: server process up | {f['server_up_s']:.2f} s |",
        f"| first page load to first chart | {f['first_page_to_chart_s']:.2f} s |",
        f"| later page load to first chart (warm server) | {f['warm_page_to_chart_s']:.2f} s |",
        f"| of which: page load to the page title (last warm load) | {f['warm_page_to_title_s']:.2f} s |",
        f"| one Next step, server time, {n['cycles']}-cycle trace (median of {n['clicks']}) | {n['median_ms']:.0f} ms "
        f"(best {n['best_ms']:.0f}, worst {n['worst_ms']:.0f}; CPU {n['median_cpu_ms']:.0f}); goal <= 150 ms: {ok} |",
        ""] + (pages_markdown(result["pages"]) if "pages" in result else []))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--long-trace", help="a trace of at least 500 cycles (default: generate one)")
    p.add_argument("--first-trace", help="the trace the app opens for the first-chart timing (default: bundled default)")
    p.add_argument("--clicks", type=int, default=20)
    p.add_argument("--pages-only", action="store_true", help="only the per-page timings")
    p.add_argument("--repeats", type=int, default=3, help="warm rounds per page (each: a new visitor and a returning one)")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if k != "SPECLAB_TRACE"}  # the bundled default trace
    if args.first_trace:
        env["SPECLAB_TRACE"] = str(Path(args.first_trace).resolve())
    pages = time_pages(env, args.repeats)
    pages.update(time_pages(env, args.repeats, script=HERE / "floor_page.py", pages=REFERENCE_PAGES))
    if args.pages_only:
        print("\n".join(pages_markdown(pages)))
        write_results(Path(args.out), "app-pages", {"machine": machine_info(0), "pages": pages},
                      "## App pages (bench/app_speed.py --pages-only)\n" + "\n".join(pages_markdown(pages)), indent=2)
        return 0
    first = time_to_first_chart(env)
    long_trace = Path(args.long_trace) if args.long_trace else make_long_trace(
        Path(tempfile.mkdtemp(prefix="speclab-app-bench-")) / "long.jsonl")
    first["trace"] = Path(args.first_trace).name if args.first_trace else "bundled default"
    result = {"machine": machine_info(0), "pages": pages, "first_chart": first,
              "next_step": next_step_ms(long_trace, args.clicks)}
    write_results(Path(args.out), "app-speed", result, markdown(result), indent=2)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
