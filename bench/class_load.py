"""A class on one server: N visitors at once against one local `streamlit run app/main.py`.

    python -m bench.class_load                      # the whole plan below, about 10-15 minutes
    python -m bench.class_load --plan 5:0,20:10     # N:M pairs: N visitors, M of them start a live run
    python -m bench.class_load --quick              # 1:0 and 3:1, a smoke run of a minute or two

Each visitor opens the stepper, clicks Next 20 times (THINK_S apart on average: a student reads the stage)
and opens the statistics page. M of them first open Choose a trace > Live run, pick the
tiny-shakespeare preset, press Run and watch it (their place in the server's queue, then the
progress) until the page shows the result; then they step like the others, through their run.

The visitors are not browsers: a headless Chromium page takes about half a core while it draws
(the browser tests' renderer, on this machine), so 30 of them would saturate 2 cores long before
the server. Each visitor here is an asyncio client speaking Streamlit's own websocket protocol
(the /_stcore/stream endpoint, its protobuf messages): it sends what the browser's frontend
sends (a BackMsg rerun_script with the clicked button's trigger or the chosen option, the page
hash from the navigation message, and each fragment's auto-rerun at the interval the server
asks for) and reads what the frontend reads (ForwardMsg deltas, script_finished), drawing
nothing. All visitors share one process and one event loop; its CPU time is reported, which
says where the load generator itself would saturate.

Each configuration gets a fresh server on a free loopback port, a warm-up visitor (for live
configurations also one live run, so the model is loaded), then the N visitors at once,
bounded by --deadline-s. The server's resident memory is sampled throughout. Writes
bench/results/class-load.json and .md (or --out STEM); progress goes to --log.
"""
import argparse
import asyncio
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import psutil
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
from streamlit.proto.WidgetStates_pb2 import WidgetState
from websockets.asyncio.client import connect

from app.ui.job_queue import GONE_AFTER_S
from bench.common import RESULTS, machine_info, write_results

ROOT = Path(__file__).resolve().parent.parent
PLAN = "1:0,5:0,10:0,20:0,30:0,1:1,5:2,10:5,20:10,30:10"  # N:M visitors:live runs (N = 1, 5, 10, 20, 30)
QUICK = "1:0,3:1"
NEXTS = 20
THINK_S = 1.0  # between a visitor's clicks, on average
LIVE_PRESET = "tiny-shakespeare"  # the fast preset: a 64-token live run takes seconds on one thread
REPLY_S = 120.0  # the longest a visitor waits for one page run before calling it an error
DONE = ForwardMsg.ScriptFinishedStatus.FINISHED_SUCCESSFULLY
ERROR_ALERT, INFO_ALERT, SUCCESS_ALERT = 1, 3, 4  # streamlit.proto.Alert format values
RESULT_SHOWN = {SUCCESS_ALERT: "Finished:", INFO_ALERT: "Decoded plainly:"}  # a live run's result, as app/runs/live.py words it
CYCLE = re.compile(r"^Cycle (\d+) ")
CYCLES_OPEN = re.compile(r", (\d+) cycles$")  # the sidebar's "Open trace: ... K=4, 35 cycles"
PLACE = re.compile(r"number (\d+) in this server's queue")
LEAVER_FROM = 5  # configurations with this many live runs add a visitor who presses Run and closes the tab
LEAVE_AFTER_S = 3.0  # ... this long after the others started, so its job waits behind theirs
STATS_TITLE = "Why speculation pays off"  # the statistics page's title begins so
FIRST_RESULT = "first_result"  # the key of each page's first-result container (app/ui/first_result.py)


def log(args: argparse.Namespace, text: str) -> None:
    line = f"{time.strftime('%H:%M:%S')} {text}"
    print(line, flush=True)
    with open(args.log, "a") as f:
        f.write(line + "\n")


# ---------------------------------------------------------------- one visitor: the protocol

@dataclass
class Seen:
    """What one full script run drew, as a reader of the page would take it in."""
    headings: list[str] = field(default_factory=list)
    markdown: list[str] = field(default_factory=list)
    first_result_at: float | None = None  # when the page's first result (app/ui/first_result.py) arrived


class Visitor:
    """One browser tab's worth of Streamlit protocol: messages in, reruns out, nothing drawn."""

    def __init__(self, url: str) -> None:
        self.url = url.replace("http://", "ws://") + "/_stcore/stream"
        self.widgets: dict[str, object] = {}  # user key -> the widget's latest element proto
        self.pages: dict[str, str] = {}  # url path -> page script hash
        self.page_hash, self.query = "", ""
        self.runs: asyncio.Queue[Seen] = asyncio.Queue()  # one entry per finished full run
        self.seen = Seen()
        self.progress: list[tuple[float, str]] = []  # every progress bar's text, with when it came
        self.alerts: list[tuple[float, int, str]] = []
        self.errors: list[str] = []
        self.fragments: dict[str, asyncio.Task] = {}
        self.first_block: tuple[int, ...] | None = None  # where this run's first-result container is

    async def __aenter__(self) -> "Visitor":
        self.ws = await connect(self.url, subprotocols=["streamlit"], max_size=None, open_timeout=REPLY_S)
        self.reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc) -> None:
        for task in self.fragments.values():
            task.cancel()
        await self.ws.close()  # the tab closes
        self.reader.cancel()

    async def _read(self) -> None:
        try:
            async for data in self.ws:
                msg = ForwardMsg()
                msg.ParseFromString(data)
                self._take(msg)
        except Exception as err:  # noqa: BLE001 - a dropped connection is an error of the run, not of the bench
            self.errors.append(f"connection: {type(err).__name__}: {err}")

    def _take(self, msg: ForwardMsg) -> None:
        kind = msg.WhichOneof("type")
        if kind == "new_session" and not msg.metadata.run.fragment_ids:  # a full run starts
            for task in self.fragments.values():  # the frontend drops every auto-rerun here
                task.cancel()
            self.fragments, self.seen, self.page_hash = {}, Seen(), msg.new_session.page_script_hash
            self.first_block = None
        elif kind == "navigation":
            self.pages = {p.url_pathname: p.page_script_hash for p in msg.navigation.app_pages}
        elif kind == "page_info_changed":
            self.query = msg.page_info_changed.query_string
        elif kind == "auto_rerun":
            self._poll(msg.auto_rerun.fragment_id, msg.auto_rerun.interval)
        elif kind == "stop_auto_rerun":
            for fragment in msg.stop_auto_rerun.fragment_ids:
                task = self.fragments.pop(fragment, None)
                if task is not None:
                    task.cancel()
        elif kind == "delta" and msg.delta.WhichOneof("type") == "add_block":
            if msg.delta.add_block.id.endswith(FIRST_RESULT):
                self.first_block = tuple(msg.metadata.delta_path)
        elif kind == "delta" and msg.delta.WhichOneof("type") == "new_element":
            path = tuple(msg.metadata.delta_path)
            if self.first_block and path[:len(self.first_block)] == self.first_block and self.seen.first_result_at is None:
                self.seen.first_result_at = time.perf_counter()
            self._element(msg.delta.new_element)
        elif kind == "script_finished" and msg.script_finished == DONE:
            self.runs.put_nowait(self.seen)

    def _element(self, element) -> None:
        kind = element.WhichOneof("type")
        body = getattr(element, kind)
        if "id" in body.DESCRIPTOR.fields_by_name and body.id.startswith("$$ID-"):
            self.widgets[body.id.rsplit("-", 1)[-1]] = body  # ids end with the widget's key
        now = time.perf_counter()
        if kind == "heading":
            self.seen.headings.append(body.body)
        elif kind == "markdown":
            self.seen.markdown.append(body.body)
        elif kind == "progress":
            self.progress.append((now, body.text))
        elif kind == "alert":
            self.alerts.append((now, body.format, body.body))
            if body.format == ERROR_ALERT:
                self.errors.append(f"error shown: {body.body[:200]}")
        elif kind == "exception":
            self.errors.append(f"exception shown: {body.type}: {body.message[:200]}")

    def _poll(self, fragment: str, interval: float) -> None:
        """A fragment's auto-rerun, as the frontend keeps it: one timer per fragment, replaced only
        when its interval changes."""
        if fragment in self.fragments and getattr(self.fragments[fragment], "interval", None) == interval:
            return
        if fragment in self.fragments:
            self.fragments[fragment].cancel()

        async def tick() -> None:
            while True:
                await asyncio.sleep(interval)
                await self.send(fragment_id=fragment, auto=True)
        task = asyncio.create_task(tick())
        task.interval = interval
        self.fragments[fragment] = task

    async def send(self, widgets: tuple[WidgetState, ...] = (), page_hash: str | None = None,
                   fragment_id: str = "", auto: bool = False) -> None:
        msg = BackMsg()
        state = msg.rerun_script
        state.query_string = self.query
        state.page_script_hash = self.page_hash if page_hash is None else page_hash
        state.widget_states.widgets.extend(widgets)
        state.fragment_id, state.is_auto_rerun = fragment_id, auto
        await self.ws.send(msg.SerializeToString())

    async def act(self, widgets: tuple[WidgetState, ...] = (), page_hash: str | None = None,
                  want: Callable[[Seen], bool] | None = None) -> tuple[float, Seen]:
        """Send a rerun (a click, a choice, a page switch) and wait for its full run to finish: the
        first one after it that shows what `want` asks for (a run the server started by itself,
        such as a job's last poll, can end in between). Raises TimeoutError after REPLY_S."""
        while not self.runs.empty():  # runs that ended before this request are not its answer
            self.runs.get_nowait()
        start = time.perf_counter()
        await self.send(widgets, page_hash)
        while True:
            seen = await asyncio.wait_for(self.runs.get(), max(0.0, start + REPLY_S - time.perf_counter()))
            if want is None or want(seen):
                return time.perf_counter() - start, seen

    def click(self, key: str) -> tuple[WidgetState, ...]:
        return (WidgetState(id=self.widgets[key].id, trigger_value=True),)

    def choose(self, key: str, starts: str) -> tuple[WidgetState, ...]:
        box = self.widgets[key]
        return (WidgetState(id=box.id, string_value=next(o for o in box.options if o.startswith(starts))),)


# ---------------------------------------------------------------- what a visitor does

@dataclass
class Record:
    live: bool
    first_s: float | None = None  # the app opened -> the stepper's first result (the line above its charts)
    first_page_s: float | None = None  # the app opened -> the whole first page drawn
    next_s: list[float] = field(default_factory=list)
    stats_s: float | None = None
    live_s: float | None = None  # Run pressed -> the page shows the result
    live_plain: bool = False  # the K advisor decoded it plainly (K=0)
    queue_wait_s: float | None = None  # Run pressed -> the first progress bar that is not "waiting"
    places: list[int] = field(default_factory=list)  # places in the queue the visitor was shown
    lost_clicks: int = 0  # a Next whose next cycle never showed (within REPLY_S)
    errors: list[str] = field(default_factory=list)
    done: bool = False


def cycle_shown(seen: Seen) -> int | None:
    return next((int(m.group(1)) for h in seen.headings if (m := CYCLE.match(h))), None)


def cycles_open(seen: Seen) -> int | None:
    return next((int(m.group(1)) for t in seen.markdown if (m := CYCLES_OPEN.search(t.strip()))), None)


async def step_through(v: Visitor, rec: Record, think: Callable[[], float], seen: Seen) -> None:
    """20 Next clicks from the stepper's first cycle, `think()` seconds apart, then the statistics page."""
    shown, last = cycle_shown(seen), (cycles_open(seen) or 10**6) - 1
    if shown is None:
        raise RuntimeError("the stepper showed no cycle")
    for _ in range(NEXTS):
        await asyncio.sleep(think())
        expected = min(shown + 1, last)
        try:
            seconds, seen = await v.act(v.click("nav_next"), want=lambda s, e=expected: cycle_shown(s) == e)
        except TimeoutError:
            rec.lost_clicks += 1
            continue
        rec.next_s.append(seconds)
        shown = expected
    rec.stats_s, seen = await v.act(page_hash=v.pages["statistics"],
                                    want=lambda s: any(h.startswith(STATS_TITLE) for h in s.headings))


async def run_live(v: Visitor, rec: Record, deadline: float) -> None:
    """Choose a trace > Live run on the fast preset; watch until the page shows the result: a
    finished run, or the K advisor's plain decoding (K=0, no trace) when speculation would lose here."""
    await v.act(page_hash=v.pages["source"])
    await v.act(v.choose("live_preset", f"{LIVE_PRESET}:"))
    pressed = time.perf_counter()
    await v.act(v.click("live_run"))
    while time.perf_counter() < deadline:
        finished = [(t, fmt) for t, fmt, body in v.alerts if t >= pressed and body.startswith(RESULT_SHOWN.get(fmt, "\0"))]
        if finished:
            rec.live_s, rec.live_plain = finished[0][0] - pressed, finished[0][1] == INFO_ALERT
            break
        await asyncio.sleep(0.1)
    while v.runs.empty() and time.perf_counter() < deadline:  # the run that drew it ends before the next click
        await asyncio.sleep(0.05)
    shown = [(t, text) for t, text in v.progress if t >= pressed]
    rec.places = sorted({int(m.group(1)) for _, text in shown if (m := PLACE.search(text))})
    started = [t for t, text in shown if "waiting, number" not in text]
    rec.queue_wait_s = started[0] - pressed if started else None


async def visit(url: str, live: bool, think_s: float, deadline: float, seed: int = 0) -> Record:
    """One visitor. Its pauses between clicks are drawn uniformly from 0.5-1.5x `think_s` (seeded):
    with one fixed pause, visitors who opened the app together click in step for ever, which no
    class does (20 visitors at 3 s pauses then waited 1 s for a Next whose server time is 0.06 s)."""
    rec, draw = Record(live), random.Random(seed)
    think = (lambda: think_s * draw.uniform(0.5, 1.5)) if think_s > 0 else (lambda: 0.0)
    try:
        async with Visitor(url) as v:
            start = time.perf_counter()
            rec.first_page_s, seen = await v.act(page_hash="")  # the app's root: the stepper
            rec.first_s = seen.first_result_at - start if seen.first_result_at else None
            if live:
                await run_live(v, rec, deadline)
                # back to the stepper, on the new run
                _, seen = await v.act(page_hash=v.pages[""], want=lambda s: cycle_shown(s) is not None)
            await step_through(v, rec, think, seen)
            rec.errors += v.errors
            rec.done = True
    except Exception as err:  # noqa: BLE001 - counted as this visitor's error; the others go on
        rec.errors.append(f"{type(err).__name__}: {err}")
    return rec


async def leave(url: str, after_s: float) -> str:
    """A visitor who presses Run and closes the tab at once (its job should be dropped); "" or why not."""
    await asyncio.sleep(after_s)  # behind the live visitors in the queue
    try:
        async with Visitor(url) as v:
            await v.act(page_hash="")
            await v.act(page_hash=v.pages["source"])
            await v.act(v.choose("live_preset", f"{LIVE_PRESET}:"))
            await v.act(v.click("live_run"))
        return ""
    except Exception as err:  # noqa: BLE001 - reported with the configuration
        return f"{type(err).__name__}: {err}"


def traces_written(runs: Path) -> tuple[int, int]:
    """(complete, incomplete) live-run traces in the server's runs folder (a complete one ends in its summary)."""
    files = list(runs.glob("live-*.jsonl")) if runs.is_dir() else []
    complete = sum('"type": "summary"' in f.read_text().splitlines()[-1] for f in files if f.stat().st_size)
    return complete, len(files) - complete


# ---------------------------------------------------------------- one configuration

def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(folder: Path, extra: list[str]) -> tuple[subprocess.Popen, str]:
    """`streamlit run app/main.py` on a free loopback port (`extra`: more of its options); its URL."""
    port = free_port()
    env = dict(os.environ, SPECLAB_RUNS_DIR=str(folder / "runs"), SPECLAB_UPLOADS_DIR=str(folder / "uploads"))
    for name in ("SPECLAB_TRACE", "SPECLAB_TRACES_DIR", "SPECLAB_READ_ONLY"):
        env.pop(name, None)
    out = (folder / "server.log").open("w")
    command = [sys.executable, "-m", "streamlit", "run", "app/main.py", "--server.address", "127.0.0.1",
               "--server.port", str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false", *extra]
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 120
    while time.monotonic() < end:
        assert proc.poll() is None, f"the server exited; see {folder / 'server.log'}"
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.3)
    raise TimeoutError("the server did not answer")


async def sample_memory(proc: psutil.Process, into: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        into.append(proc.memory_info().rss / 2**20)
        await asyncio.sleep(0.5)


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summary(values: list[float]) -> dict:
    return {"n": len(values), "p50": pct(values, 0.5), "p95": pct(values, 0.95), "max": max(values) if values else None}


async def one_config(args: argparse.Namespace, n: int, m: int) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="speclab-class-load-"))
    proc, url = start_server(folder, args.server_args.split())
    server = psutil.Process(proc.pid)
    try:
        if args.no_warm_up:  # every figure a visitor sees is drawn for the first time by some visitor
            warm = Record(False)
        else:
            warm = await visit(url, m > 0, 0.0, time.perf_counter() + args.deadline_s)  # caches, Plotly, the model
        log(args, f"  warm-up: errors {warm.errors or 'none'}" + (f", live run {warm.live_s:.1f} s" if warm.live_s else ""))
        rss_idle = server.memory_info().rss / 2**20
        load_before, me, cpu_server = os.getloadavg(), psutil.Process(), server.cpu_times()
        cpu_me, wall = me.cpu_times(), time.perf_counter()
        rss, stop = [], asyncio.Event()
        sampler = asyncio.create_task(sample_memory(server, rss, stop))
        deadline = time.perf_counter() + args.deadline_s
        tasks = [asyncio.create_task(visit(url, i < m, args.think_s, deadline, seed=i)) for i in range(n)]
        leaver = asyncio.create_task(leave(url, LEAVE_AFTER_S)) if m >= LEAVER_FROM else None
        done, pending = await asyncio.wait(tasks, timeout=args.deadline_s)
        leaver_error = await leaver if leaver is not None else None
        for task in pending:
            task.cancel()
        records = [t.result() for t in done] + [Record(False, errors=["past the deadline"]) for _ in pending]
        wall = time.perf_counter() - wall
        await asyncio.sleep(1.0)  # the closed tabs disconnect
        stop.set()
        await sampler
        cpu_me_used = sum(me.cpu_times()[:2]) - sum(cpu_me[:2])
        cpu_server_used = sum(server.cpu_times()[:2]) - sum(cpu_server[:2])
        rss_after = server.memory_info().rss / 2**20
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    complete, incomplete = traces_written(folder / "runs")
    expected = sum(r.live_s is not None and not r.live_plain for r in [warm, *records] if r.live)
    if all(r.done and not r.errors for r in records):
        shutil.rmtree(folder, ignore_errors=True)  # kept, with the server's log, only when something went wrong
    steppers = [r for r in records if not r.live]
    lives = [r for r in records if r.live]
    return {
        "visitors": n, "live_runs": m, "wall_s": wall, "load_before": load_before, "load_after": os.getloadavg(),
        "first_result_s": summary([r.first_s for r in records if r.first_s is not None]),
        "first_page_s": summary([r.first_page_s for r in records if r.first_page_s is not None]),
        "next_s": summary([s for r in records for s in r.next_s]),
        "next_s_steppers_only": summary([s for r in steppers for s in r.next_s]),
        "statistics_page_s": summary([r.stats_s for r in records if r.stats_s is not None]),
        "live_result_s": summary([r.live_s for r in lives if r.live_s is not None]),
        "queue_wait_s": summary([r.queue_wait_s for r in lives if r.queue_wait_s is not None]),
        "most_places_shown": max((max(r.places) for r in lives if r.places), default=None),
        "lost_live_results": sum(r.live_s is None for r in lives),
        "live_runs_decoded_plainly": sum(r.live_plain for r in lives),
        "lost_clicks": sum(r.lost_clicks for r in records),
        "errors": sum(len(r.errors) for r in records) + sum(not r.done for r in records),
        "error_samples": sorted({e for r in records for e in r.errors})[:5],
        "server_rss_mib": {"idle_after_warm_up": rss_idle, "peak": max(rss, default=None), "after": rss_after},
        "generator_cpu_of_one_core": cpu_me_used / wall, "server_cpu_of_one_core": cpu_server_used / wall,
        "closed_tab": None if leaver_error is None else {
            "error": leaver_error, "complete_traces": complete, "incomplete_traces": incomplete,
            "complete_traces_of_visitors_who_stayed": expected,
            "its_job": ("ran to its end" if complete > expected else "stopped while it ran" if incomplete
                        else "dropped before it started")},
        "warm_up": asdict(warm),
    }


# ---------------------------------------------------------------- the report

def fmt(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


BUSY_LOAD = 1.5  # a 1-minute load on 2 cores above what the generator and the server make by themselves


def markdown(result: dict) -> str:
    mc = result["machine"]
    lines = ["## A class on one server (bench/class_load.py)", "",
             f"Machine: {mc['cpu']}, {mc['cores']} cores (load averages below); "
             f"{mc['date']}. Server: `streamlit run app/main.py` on loopback, default operator settings "
             f"(SPECLAB_MAX_JOBS = {result['max_jobs']}). Visitors: Streamlit-protocol clients in one process, "
             f"{NEXTS} Next clicks {result['think_s']:g} s apart on average (0.5-1.5x, drawn per click), then the "
             "statistics page; all open the app at the same moment; live visitors first run "
             f"the {LIVE_PRESET} preset (64 tokens) and watch it to its result.", "",
             "| N | live | first result p50 / p95 s | whole first page p95 s | Next p50 / p95 s | Next p95, steppers only "
             "| statistics p95 s | live result p50 / max s | queue wait max s | most places | errors | lost live | lost clicks "
             "| server MiB idle / peak | generator / server CPU (cores) | load before → after |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in result["configs"]:
        lines.append(
            f"| {c['visitors']} | {c['live_runs']} | {fmt(c['first_result_s']['p50'])} / {fmt(c['first_result_s']['p95'])} "
            f"| {fmt(c['first_page_s']['p95'])} "
            f"| {fmt(c['next_s']['p50'])} / {fmt(c['next_s']['p95'])} | {fmt(c['next_s_steppers_only']['p95'])} "
            f"| {fmt(c['statistics_page_s']['p95'])} | {fmt(c['live_result_s']['p50'], 1)} / {fmt(c['live_result_s']['max'], 1)} "
            f"| {fmt(c['queue_wait_s']['max'], 1)} | {c['most_places_shown'] or '–'} | {c['errors']} | {c['lost_live_results']} "
            f"| {c['lost_clicks']} | {fmt(c['server_rss_mib']['idle_after_warm_up'], 0)} / {fmt(c['server_rss_mib']['peak'], 0)} "
            f"| {fmt(c['generator_cpu_of_one_core'])} / {fmt(c['server_cpu_of_one_core'])} "
            f"| {c['load_before'][0]:.1f} → {c['load_after'][0]:.1f} |")
    lines += repeats_table(result)
    lines += ["", *[f"- {note}" for note in notes(result)]]
    return "\n".join(lines) + "\n"


def repeats_table(result: dict) -> list[str]:
    """The main figures of every run kept in the file (--previous), for their spread."""
    runs = [*result.get("previous_runs", []), {"date": result["machine"]["date"], "configs": result["configs"]}]
    if len(runs) < 2:
        return []
    lines = ["", f"Repeats: the same plan run {len(runs)} times ({', '.join(r['date'] for r in runs)}), "
             "each figure as run 1 / run 2 / ...", "",
             "| N | live | first result p95 s | Next p95 s | Next p95, steppers only | live result max s | errors |",
             "|---|---|---|---|---|---|---|"]
    for c in result["configs"]:
        same = [config(r, c["visitors"], c["live_runs"]) for r in runs]
        cells = [" / ".join(fmt(s[name][q], digits) if s else "–" for s in same)
                 for name, q, digits in (("first_result_s", "p95", 2), ("next_s", "p95", 2),
                                         ("next_s_steppers_only", "p95", 2), ("live_result_s", "max", 1))]
        errors = " / ".join(str(s["errors"]) if s else "–" for s in same)
        lines.append(f"| {c['visitors']} | {c['live_runs']} | {' | '.join(cells)} | {errors} |")
    return lines


def config(result: dict, n: int, m: int) -> dict | None:
    return next((c for c in result["configs"] if (c["visitors"], c["live_runs"]) == (n, m)), None)


def met(ok: bool) -> str:
    return "met" if ok else "**not met**"


def notes(result: dict) -> list[str]:
    """The class-load goals against these figures, the load generator's own cost, the machine's load."""
    configs, out = result["configs"], []
    if not configs:
        return out
    errors, lost = sum(c["errors"] for c in configs), sum(c["lost_live_results"] for c in configs)
    out.append(f"0 errors and 0 lost live results at every N: {met(errors == lost == 0)} ({errors} errors, {lost} lost "
               f"live results, {sum(c['lost_clicks'] for c in configs)} Next clicks that did not move on).")
    if (c := config(result, 20, 0)) is not None:
        first, nxt = c["first_result_s"]["p95"], c["next_s"]["p95"]
        out.append(f"20 visitors stepping, no live work: p95 first result {fmt(first)} s (goal <= 5 s: "
                   f"{met(first is not None and first <= 5)}), p95 Next {fmt(nxt)} s "
                   f"(goal <= 1 s: {met(nxt is not None and nxt <= 1)}).")
    if (c := config(result, 20, 10)) is not None:
        seen, nxt = c["live_result_s"]["n"], c["next_s_steppers_only"]["p95"]
        out.append(f"10 live runs queued (N=20, M=10): {seen} of 10 finished and were shown to their visitor "
                   f"(the last after {fmt(c['live_result_s']['max'], 1)} s, places up to {c['most_places_shown']} shown); "
                   f"visitors who only step kept p95 Next {fmt(nxt)} s "
                   f"(goal <= 2 s: {met(seen == 10 and nxt is not None and nxt <= 2)}).")
    left = [c for c in configs if c.get("closed_tab")]
    if left:
        out.append("A visitor who pressed Run and closed the tab at once (configurations with 5 or more live runs): "
                   + "; ".join(f"N={c['visitors']}, M={c['live_runs']}: {c['closed_tab']['its_job']}"
                               + (f" ({c['closed_tab']['error']})" if c["closed_tab"]["error"] else "") for c in left)
                   + f". The queue drops a job once its tab has been gone {GONE_AFTER_S:g} s.")
    top = max(configs, key=lambda c: c["visitors"])
    per_visitor = top["generator_cpu_of_one_core"] / top["visitors"]
    out.append(f"The load generator took {top['generator_cpu_of_one_core']:.2f} of a core at N={top['visitors']} "
               f"(about {per_visitor:.4f} per visitor), so it would fill one core only at about "
               f"{1 / per_visitor:.0f} visitors: on this 2-core machine the server saturates long before it. The server "
               "draws every visitor's pages in one Python process under one interpreter lock (at most about one core), "
               f"and used {top['server_cpu_of_one_core']:.2f} of a core on average over that run, think time included.")
    runs = [*result.get("previous_runs", []), result]
    loads = [x for r in runs for c in r["configs"] for x in (c["load_before"][0], c["load_after"][0])]
    during = "these runs" if len(runs) > 1 else "this run"
    if max(loads) >= BUSY_LOAD:
        out.append(f"The machine was shared with other work: 1-minute load averages from {min(loads):.1f} to "
                   f"{max(loads):.1f} on 2 cores during {during}, so every time here is slower than on a quiet "
                   "machine, and the server got only part of the CPU it asked for.")
    else:
        out.append(f"1-minute load averages from {min(loads):.1f} to {max(loads):.1f} on 2 cores during {during}: "
                   "the load generator and the server, nothing else heavy.")
    return out + ([result["note"]] if result.get("note") else [])


def parse_plan(text: str) -> list[tuple[int, int]]:
    pairs = []
    for item in text.split(","):
        n, _, m = item.partition(":")
        if not (n.isdigit() and m.isdigit()) or not 1 <= int(n) <= 30 or not 0 <= int(m) <= int(n):
            raise SystemExit(f"--plan: {item!r} is not N:M with 1 <= N <= 30 and 0 <= M <= N")
        pairs.append((int(n), int(m)))
    return pairs


async def main_async(args: argparse.Namespace) -> dict:
    from app.ui import operator

    result = {"machine": machine_info(1), "max_jobs": operator.max_jobs(), "think_s": args.think_s,
              "server_args": args.server_args, "note": args.note, "configs": []}
    if args.previous:  # earlier runs of the same plan, kept beside this one for the spread
        earlier = json.loads(Path(args.previous).read_text())
        result["previous_runs"] = [*earlier.get("previous_runs", []),
                                   {"date": earlier["machine"]["date"], "configs": earlier["configs"]}]
    result["machine"]["load_at_start"] = os.getloadavg()
    for n, m in parse_plan(args.plan):
        log(args, f"N={n}, M={m}: starting")
        config = await one_config(args, n, m)
        result["configs"].append(config)
        log(args, f"N={n}, M={m}: {config['wall_s']:.0f} s, Next p95 {fmt(config['next_s']['p95'])} s, "
                  f"errors {config['errors']}, lost live {config['lost_live_results']}, "
                  f"generator {config['generator_cpu_of_one_core']:.2f} cores")
        write_results(RESULTS, args.out, result, markdown(result))  # kept as it goes: a stopped run keeps what it had
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--plan", default=PLAN, help=f"N:M pairs (default {PLAN})")
    p.add_argument("--quick", action="store_true", help=f"the plan {QUICK}")
    p.add_argument("--think-s", type=float, default=THINK_S)
    p.add_argument("--deadline-s", type=float, default=240.0, help="the most one configuration's visitors may take")
    p.add_argument("--server-args", default="", help="more `streamlit run` options, e.g. '--server.fileWatcherType auto'")
    p.add_argument("--note", default="", help="a sentence for the report (what else was going on, say)")
    p.add_argument("--no-warm-up", action="store_true",
                   help="no warm-up visitor: the measured visitors draw every step's figures first (a cold server)")
    p.add_argument("--previous", help="an earlier results file of the same plan: kept in this one, for the spread")
    p.add_argument("--out", default="class-load", help="the results' file stem under bench/results/")
    p.add_argument("--log", default=str(Path(tempfile.gettempdir()) / "class-load.log"))
    args = p.parse_args()
    if args.quick:
        args.plan = QUICK
    result = asyncio.run(main_async(args))
    log(args, f"wrote bench/results/{args.out}.json and .md ({len(result['configs'])} configurations)")


if __name__ == "__main__":
    main()
