"""A live run in the app against the same run from the command line: time per cycle.

    python -m bench.live_speed                    # chat preset, K=4, T=1, 16 tokens, 3 repeats
    python -m bench.live_speed --repeats 5 --max-new-tokens 32

Both sides make the same run (the preset's example prompt and chat-template choice, same K,
temperature, seed and token budget, --calibrate as the app's live runs do):
  cli  `python -m engine run ...` in its own process, nothing else running;
  app  one `streamlit run app/main.py` server, driven by headless Chromium through the Live
       run tab of Choose a trace, exactly as a visitor clicks it.
The browser runs on this machine too, which is the worst case: a class's browsers are on
other machines. Repeats are interleaved (cli, app, cli, app, ...) so a slow spell hits both.
Each run's figure is its trace's median cycle time (engine/stats/robust.py's reason); the
ratio app / cli is taken within a repeat, and the report gives its median, min and max.
Writes bench/results/live-speed.json and .md.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.app_speed import CHROMIUM, free_port, wait_for_server
from bench.common import RESULTS, machine_info, machine_words, write_results
from engine.models.presets import PRESETS
from engine.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent
GOAL = 1.2  # the goal: a live run in the app within 1.2x of the command line's time per cycle


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="chat", choices=sorted(PRESETS))
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cli-threads", type=int, default=None,
                   help="torch threads of the command-line run (OMP_NUM_THREADS); default: torch's own choice")
    p.add_argument("--app-threads", type=int, default=None,
                   help="OMP_NUM_THREADS for the app's server process; default: the app's own choice")
    p.add_argument("--out", type=Path, default=RESULTS / "live-speed")
    p.add_argument("--note", default="", help="conditions of the run (e.g. a machine shared with other jobs)")
    return p.parse_args(argv)


def trace_figures(path: Path) -> dict:
    """Per-cycle medians of one run's trace, in milliseconds."""
    cycles = load_trace(path).cycles
    return {"cycles": len(cycles),
            "cycle_ms": statistics.median(c["cycle_time_s"] for c in cycles) * 1e3,
            "verify_ms": statistics.median(c["verify_time_s"] for c in cycles) * 1e3,
            "draft_step_ms": statistics.median(t for c in cycles for t in c["draft_step_times_s"]) * 1e3}


def cli_run(args: argparse.Namespace, out: Path) -> dict:
    preset = PRESETS[args.preset]
    command = [sys.executable, "-m", "engine", "run", "--preset", args.preset, "--prompt", preset.example_prompt,
               "--k", str(args.k), "--temperature", str(args.temperature), "--max-new-tokens",
               str(args.max_new_tokens), "--seed", str(args.seed), "--calibrate", "--out", str(out)]
    if not preset.use_chat_template:
        command.append("--no-chat-template")
    env = {**os.environ, **({"OMP_NUM_THREADS": str(args.cli_threads)} if args.cli_threads else {})}
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return trace_figures(out)


def app_run(page, base: str, runs: Path, args: argparse.Namespace) -> dict:
    """One click on Run in the Live run tab; its trace is the newest file in the runs folder."""
    before = set(runs.glob("*.jsonl"))
    page.goto(f"{base}/source")
    page.get_by_role("tab", name="Live run").click()
    for key, value in (("live_max_new", args.max_new_tokens), ("live_temperature", args.temperature),
                       ("live_k", args.k), ("live_seed", args.seed)):
        field = page.locator(f".st-key-{key} input")
        field.fill(str(value))
        field.press("Enter")
        page.wait_for_timeout(800)  # the rerun that stores the value
    page.locator(".st-key-live_run button").click()
    page.get_by_text(re.compile(r"Finished: \d+ cycles, \d+ tokens")).first.wait_for(timeout=600_000)
    new = set(runs.glob("*.jsonl")) - before
    if len(new) != 1:
        raise RuntimeError(f"expected one new trace in {runs}, found {len(new)}")
    return trace_figures(new.pop())


def measure(args: argparse.Namespace) -> dict:
    from playwright.sync_api import sync_playwright

    work = Path(tempfile.mkdtemp(prefix="live-speed-"))
    runs = work / "app-runs"
    env = {**os.environ, "SPECLAB_RUNS_DIR": str(runs),
           **({"OMP_NUM_THREADS": str(args.app_threads)} if args.app_threads else {})}
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(ROOT / "app" / "main.py"),
                               "--server.headless", "true", "--server.port", str(port),
                               "--browser.gatherUsageStats", "false"], env=env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cli, app = [], []
    try:
        wait_for_server(port)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1366, "height": 768})
            page.set_default_timeout(240_000)
            app_run(page, f"http://127.0.0.1:{port}", runs, args)  # warm-up: loads the models into the server
            for i in range(args.repeats):
                cli.append(cli_run(args, work / f"cli-{i}.jsonl"))
                app.append(app_run(page, f"http://127.0.0.1:{port}", runs, args))
                print(f"repeat {i + 1}: cli {cli[-1]['cycle_ms']:.1f} ms, app {app[-1]['cycle_ms']:.1f} ms per cycle",
                      flush=True)
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    ratios = [a["cycle_ms"] / c["cycle_ms"] for a, c in zip(app, cli)]
    return {"cli": cli, "app": app, "ratios": ratios, "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios), "ratio_max": max(ratios)}


def report(result: dict) -> str:
    s, m = result["settings"], result["machine"]
    lines = ["## Live run in the app against the command line (bench/live_speed.py)", "",
             f"Machine: {machine_words(m)}; {m['date']}. Run: {s['preset']} preset, K={s['k']}, "
             f"T={s['temperature']}, {s['max_new_tokens']} tokens, seed {s['seed']}; torch threads: cli "
             f"{s['cli_threads'] or 'default'}, app {s['app_threads'] or 'default'}; the browser on the same machine."
             + (f" {result['note']}" if result["note"] else ""), "",
             "| repeat | cli ms per cycle | app ms per cycle | app / cli | cli verify ms | app verify ms |",
             "|---|---|---|---|---|---|"]
    for i, (c, a, r) in enumerate(zip(result["cli"], result["app"], result["ratios"]), start=1):
        lines.append(f"| {i} | {c['cycle_ms']:.1f} | {a['cycle_ms']:.1f} | {r:.2f} | {c['verify_ms']:.1f} | "
                     f"{a['verify_ms']:.1f} |")
    met = "met" if result["ratio_median"] <= GOAL else "not met"
    lines += ["", f"App / cli, median cycle time: {result['ratio_median']:.2f}x (min {result['ratio_min']:.2f}, "
                  f"max {result['ratio_max']:.2f}); goal <= {GOAL}x: {met}.", ""]
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch

    result = {"settings": {k: getattr(args, k) for k in ("preset", "k", "temperature", "max_new_tokens", "seed",
                                                          "repeats", "cli_threads", "app_threads")},
              "machine": machine_info(torch.get_num_threads()), "note": args.note, **measure(args)}
    text = report(result)
    write_results(args.out.parent, args.out.name, result, text)
    print(text)


if __name__ == "__main__":
    main()
