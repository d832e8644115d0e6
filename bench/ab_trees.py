"""Two checkouts of this project, one benchmark, alternated: does a change (a refactor) cost speed?

    python -m bench.ab_trees --base /path/to/old/checkout [--rounds 2] [--name driver-loop] [--benches batch,speed,hot]

Runs, in each checkout in turn (base, this one, base, this one, ...; each in its own process with
that checkout first on the import path), the benchmarks --benches names, as their own scripts run them:
- bench.batch on tiny-shakespeare at B = 1, 4 and 16, K = 4, 16 requests x 32 tokens, greedy:
  the engine's batched speculation and its plain batched decoding, goodput in tokens/s;
- bench.speed on tiny-shakespeare at K = 4, T = 0 and 1, 3 prompts x 64 tokens x 3 repeats:
  the engine traced (a) and untraced (b), tokens/s;
- hot: this checkout's bench/hot_loop.py (the cycle loop alone, repeated in one process, on cheap
  forwards) run against each checkout's engine.
Alternating spreads a machine's drift over both checkouts. Each figure's median over rounds, its
range, and this checkout over the base go to bench/results/ab-NAME-CPU.json and .md.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from bench.common import RESULTS, cpu_tag, machine_info, machine_words, write_results

HERE = Path(__file__).resolve().parent.parent
BATCH = ["-m", "bench.batch", "--presets", "tiny-shakespeare", "--batches", "1,4,16", "--ks", "4",
         "--requests", "16", "--max-new-tokens", "32"]
SPEED = ["-m", "bench.speed", "--preset", "tiny-shakespeare", "--k", "4", "--temperatures", "0,1",
         "--prompts", "3", "--repeats", "3"]
HOT = [str(HERE / "bench" / "hot_loop.py")]
BENCHES = {"batch": BATCH, "speed": SPEED, "hot": HOT}


def run_in(checkout: Path, args: list[str], out: Path) -> None:
    """One benchmark in `checkout`, its results into `out`."""
    env = os.environ | {"PYTHONPATH": str(checkout)}
    subprocess.run([sys.executable, *args, "--out", str(out)], cwd=checkout, env=env, check=True,
                   stdout=subprocess.DEVNULL)


def figures(out: Path) -> dict[str, float]:
    """The compared figures of one round in one checkout (whichever benchmarks ran): name -> tokens/s."""
    found = {}
    for path in out.glob("batch-*.json"):
        for size in json.loads(path.read_text())["presets"][0]["sizes"]:
            found[f"batch B={size['batch']} speculative K=4"] = size["speculative"]["4"]
            found[f"batch B={size['batch']} plain"] = size["plain"]
    for path in out.glob("speed-tiny-shakespeare*.json"):
        for setting in json.loads(path.read_text())["settings"]:
            for method in ("a", "b"):
                found[f"speed T={setting['temperature']:g} {method}"] = setting["tokens_per_s"][method]
    for path in out.glob("hot-loop.json"):
        found |= {f"hot {name}": value for name, value in json.loads(path.read_text()).items()}
    return found


def summary(rounds: list[dict[str, float]]) -> dict[str, dict]:
    return {name: {"median": statistics.median(r[name] for r in rounds),
                   "range": [min(r[name] for r in rounds), max(r[name] for r in rounds)]} for name in rounds[0]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", required=True, help="the other checkout (the code before the change)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--name", default="change")
    p.add_argument("--benches", default="batch,speed", help=f"comma-separated, of {', '.join(BENCHES)}")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    benches = [BENCHES[name] for name in args.benches.split(",")]
    checkouts = {"base": Path(args.base).resolve(), "this": HERE}
    rounds: dict[str, list] = {"base": [], "this": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for which, checkout in checkouts.items():
                out = Path(tmp) / f"{which}-{r}"
                for bench in benches:
                    run_in(checkout, bench, out)
                rounds[which].append(figures(out))
                print(f"round {r + 1}, {which}: done", flush=True)
    base, this = summary(rounds["base"]), summary(rounds["this"])
    machine = machine_info(torch.get_num_threads())
    result = {"machine": machine, "rounds": args.rounds, "base": base, "this": this, "raw": rounds,
              "ratio": {name: this[name]["median"] / base[name]["median"] for name in base}}
    lines = [f"## {args.name}: this checkout against the base, alternated (bench/ab_trees.py)",
             f"Machine: {machine_words(machine)}; {args.rounds} rounds each, medians (range over rounds), tokens/s.", "",
             "| figure | base | this | this / base |", "|---|---|---|---|"]
    for name in base:
        b, t = base[name], this[name]
        lines.append(f"| {name} | {b['median']:.1f} ({b['range'][0]:.1f}-{b['range'][1]:.1f}) | "
                     f"{t['median']:.1f} ({t['range'][0]:.1f}-{t['range'][1]:.1f}) | {result['ratio'][name]:.3f} |")
    text = "\n".join(lines) + "\n"
    write_results(Path(args.out), f"ab-{args.name}-{cpu_tag(machine)}", result, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
