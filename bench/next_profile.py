"""Where one Next on the stepper spends its server time, part by part.

    python -m bench.next_profile                 # 3 rounds of 15 Next clicks per case, about a minute
    python -m bench.next_profile --rounds 1 --out next-profile-smoke

streamlit.testing's AppTest drives the stepper on the default bundled trace (stage 1, as the
visitors of bench/class_load.py see it) and clicks Next; app/ui/timing.py gives each script run's
wall and CPU time (the script thread's own), and timers wrapped around the parts say where that
time went: building the figures (app/figures/*); what st.plotly_chart does with each: the
figure's `to_dict()` (a deep copy and the base64 encoding of its arrays), its JSON and the element
id (a hash of that JSON); and, with the figure cache, preparing a new figure for it (its one
`to_dict()` and its JSON, kept); a cached figure's `to_dict()` parses that JSON. Everything else
(the other widgets, the sidebar, session state) is "other".

Two cases: "new cycles" (each Next shows a cycle no session has drawn yet) and "cycles drawn
before" (a visitor a step behind another one: the server's figure cache, app/ui/figure_cache.py,
has them). On a branch without that cache the two cases cost the same. Like a server, the page
scripts are compiled once (AppTest alone would compile them on every run). Writes
bench/results/next-profile.json and .md (or --out STEM).
"""
import argparse
import os
import statistics
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable

import plotly.basedatatypes
import plotly.io
import streamlit.elements.plotly_chart as plotly_chart
import streamlit.testing.v1.app_test as app_test
from streamlit.runtime.scriptrunner.script_cache import ScriptCache
from streamlit.testing.v1 import AppTest

from app.figures import acceptance, caches, cycle, layouts, overview
from app.ui import timing
from bench.common import RESULTS, machine_info, machine_words, write_results

ROOT = Path(__file__).resolve().parent.parent
MAIN = str(ROOT / "app" / "main.py")
CLICKS = 15
BUILDERS = [(cycle, "cycle_figure"), (acceptance, "acceptance_figure"), (acceptance, "resample_figure"),
            (caches, "cache_figure"), (overview, "cycle_time_figure"), (cycle, "text_figure"),
            (overview, "overview_figure"), (layouts, "layout_figures")]
PARTS = {"build": "building the figures", "prepare": "preparing them for the cache (once per figure)",
         "to_dict": "figure.to_dict()", "to_json": "the figure's JSON",
         "element_id": "element id (hashes the JSON)"}


class PartTimer:
    """CPU seconds of the script thread (time.thread_time: waiting for a core on a busy machine is not
    counted) spent in wrapped functions, per part. Parts exclude each other: a wrapped call inside
    another counts for the outer one only."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.inside = threading.local()

    def wrap(self, owner: object, name: str, part: str) -> None:
        inner: Callable = getattr(owner, name)

        def timed(*args, **kwargs):
            if getattr(self.inside, "part", None) is not None:
                return inner(*args, **kwargs)
            self.inside.part, start = part, time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[part] += time.thread_time() - start
                self.inside.part = None
        setattr(owner, name, timed)


def session(stage: int) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.query_params["stage"] = str(stage)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def clear_figure_cache() -> None:
    """Empty the server's figure cache, where there is one (a branch without it has none)."""
    from app.ui import widgets
    if hasattr(widgets, "FIGURES"):
        widgets.FIGURES.clear()


def one_round(parts: PartTimer, stage: int, drawn_before: bool) -> dict:
    """CLICKS Nexts from the first cycle in a fresh session, nothing cached; with `drawn_before`,
    another session has just stepped through the same cycles."""
    clear_figure_cache()
    if drawn_before:
        ahead = session(stage)
        for _ in range(CLICKS):
            ahead.button(key="nav_next").click().run()
    at = session(stage)
    parts.seconds.clear()
    timing.RECENT_RUNS_MS.clear(), timing.RECENT_RUNS_CPU_MS.clear()
    for _ in range(CLICKS):
        at.button(key="nav_next").click().run()
    assert not at.exception
    return {"wall_ms": list(timing.RECENT_RUNS_MS), "cpu_ms": list(timing.RECENT_RUNS_CPU_MS),
            "parts_ms_per_next": {p: parts.seconds[p] * 1000 / CLICKS for p in PARTS}}


def summary(rounds: list[dict]) -> dict:
    cpu = [x for r in rounds for x in r["cpu_ms"]]
    wall = [x for r in rounds for x in r["wall_ms"]]
    per_round = [statistics.median(r["cpu_ms"]) for r in rounds]
    parts = {p: statistics.median(r["parts_ms_per_next"][p] for r in rounds) for p in PARTS}
    mean_cpu = statistics.mean(cpu)
    return {"nexts": len(cpu), "cpu_ms_median": statistics.median(cpu), "cpu_ms_mean": mean_cpu,
            "cpu_ms_median_per_round": per_round, "wall_ms_median": statistics.median(wall),
            "parts_ms_per_next": parts, "other_ms_per_next": mean_cpu - sum(parts.values())}


def markdown(result: dict) -> str:
    lines = ["## One Next on the stepper, part by part (bench/next_profile.py)", "",
             f"Machine: {machine_words(result['machine'])}; shared with other engineers' work; {result['machine']['date']}. "
             f"Code: {result['code']}. AppTest on `default.jsonl`, stage {result['stage']}, {CLICKS} Next clicks per round, "
             f"{result['rounds']} rounds per case; times are the script thread's CPU (app/ui/timing.py), "
             "per Next; the parts are that thread's CPU inside the wrapped calls, \"other\" is the mean CPU less "
             "the parts. The figure's to_dict, JSON and element id are st.plotly_chart's work.", "",
             "| case | Next CPU ms median (per round) | wall ms median | " + " | ".join(PARTS.values()) + " | other |",
             "|---|---|---|" + "---|" * (len(PARTS) + 1)]
    for name, c in result["cases"].items():
        rounds = ", ".join(f"{x:.1f}" for x in c["cpu_ms_median_per_round"])
        lines.append(f"| {name} | {c['cpu_ms_median']:.1f} ({rounds}) | {c['wall_ms_median']:.1f} | "
                     + " | ".join(f"{c['parts_ms_per_next'][p]:.1f}" for p in PARTS) + f" | {c['other_ms_per_next']:.1f} |")
    load = result["load_average_1min"]
    lines += ["", f"1-minute load average {load[0]:.1f} before, {load[1]:.1f} after (2 cores)."
              + (f" {result['note']}" if result["note"] else "")]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--stage", type=int, default=1, choices=range(1, 6))
    p.add_argument("--code", default="this checkout", help="what code ran (a branch, a commit), for the report")
    p.add_argument("--note", default="")
    p.add_argument("--out", default="next-profile")
    args = p.parse_args()
    shared = ScriptCache()  # a server compiles each page script once
    app_test.ScriptCache = lambda: shared
    os.environ.pop("SPECLAB_TRACE", None)
    parts = PartTimer()
    for owner, name in BUILDERS:
        parts.wrap(owner, name, "build")
    try:
        from app.ui.figure_cache import PreparedFigure  # where there is a figure cache
        parts.wrap(PreparedFigure, "__init__", "prepare")
        parts.wrap(PreparedFigure, "to_dict", "to_dict")  # its own: parsing the JSON it keeps
    except ImportError:
        pass
    parts.wrap(plotly.basedatatypes.BaseFigure, "to_dict", "to_dict")
    parts.wrap(plotly.io, "to_json", "to_json")
    parts.wrap(plotly_chart, "compute_and_register_element_id", "element_id")
    load_before = os.getloadavg()[0]
    result = {"machine": machine_info(1), "code": args.code, "stage": args.stage, "rounds": args.rounds,
              "clicks": CLICKS, "note": args.note, "cases": {}}
    session(args.stage)  # warm: the trace read, Plotly imported
    for name, drawn_before in (("new cycles", False), ("cycles drawn before", True)):
        result["cases"][name] = summary([one_round(parts, args.stage, drawn_before) for _ in range(args.rounds)])
    result["load_average_1min"] = [load_before, os.getloadavg()[0]]
    write_results(RESULTS, args.out, result, markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
