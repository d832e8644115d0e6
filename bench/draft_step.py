"""Where the calibration's draft step stands against the draft steps a run really takes.

    python -m bench.draft_step --preset tiny-shakespeare
    python -m bench.draft_step --preset chat --repeats 3

For each K it compares three figures, in ms, at the run's mean cache length:
  back_to_back   the draft's one-token step timed over and over (engine.stats.calibrate.time_widths),
                 which is how the calibration timed it before session 15;
  in_cycle       engine.stats.calibrate.time_draft_in_cycle: K steps right after a target pass over
                 K+1 positions, what the calibration's draft_step_s is now;
  in_run         the median draft step of real speculative runs at that K (one per seed), T=1.
The K advisor multiplies the draft step by K, so a step timed too cheap makes it favour large K.
Results go to bench/results/draft-step-NAME.json and .md.
"""
import argparse
import statistics
from dataclasses import replace
from pathlib import Path

import torch

from bench import common
from engine.config import SpecSettings
from engine.cycle.reference import speculative_generate
from engine.run import prepare_advised_run
from engine.stats.calibrate import context_of_length, run_cache_len, time_draft_in_cycle, time_widths


def measure(pair, prompt: str, chat: bool, k: int, repeats: int, timings: int) -> dict:
    """Each figure `repeats` times, in ms; each timing the median of `timings` rounds."""
    s = SpecSettings(k=k, temperature=1.0, max_new_tokens=64, seed=0)
    ids = prepare_advised_run(pair, prompt, s, chat)
    context = context_of_length(ids, run_cache_len(ids, s) + 1)
    out = {"back_to_back": [], "in_cycle": [], "in_run": []}
    for seed in range(repeats):
        out["back_to_back"].append(time_widths(pair.draft, context, [1], s, timings, draw=True)[1])
        out["in_cycle"].append(time_draft_in_cycle(pair, context, s, timings))
        cycles = list(speculative_generate(pair, ids, replace(s, seed=seed), record=False))
        out["in_run"].append(statistics.median(t for c in cycles for t in c["draft_step_times_s"]))
    return {name: [t * 1e3 for t in times] for name, times in out.items()}


def markdown(result: dict) -> str:
    lines = [f"## The draft step: calibration against the run ({result['name']})", "",
             f"Machine: {common.machine_words(result['machine'])}; torch {result['machine']['torch']}; "
             f"{result['machine']['date']}. {result['note']}".rstrip(), "",
             f"Draft {result['draft']}, prompt {result['prompt']!r}, T=1, {result['repeats']} repeats of each figure "
             f"(each the median of {result['timings']} timings); ms per draft step, median (range).", "",
             "| K | back to back (old calibration) | in a cycle's place (calibration now) | in real runs | "
             "back to back / run | in a cycle / run |", "|---|---|---|---|---|---|"]
    for k, row in result["by_k"].items():
        med = {name: statistics.median(v) for name, v in row.items()}
        cells = [f"{med[name]:.2f} ({min(row[name]):.2f}-{max(row[name]):.2f})"
                 for name in ("back_to_back", "in_cycle", "in_run")]
        lines.append(f"| {k} | {' | '.join(cells)} | "
                     f"{med['back_to_back'] / med['in_run']:.2f} | {med['in_cycle'] / med['in_run']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_pair_arguments(p)
    p.add_argument("--name", help="results name (default: the preset)")
    p.add_argument("--ks", default="3,6")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timings", type=int, default=15)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--out", default=str(common.RESULTS))
    p.add_argument("--note", default="")
    args = p.parse_args(argv)
    common.check_pair_arguments(p, args)
    torch.set_num_threads(args.threads)
    pair, chat = common.load_bench_pair(args, "cpu", None)
    prompt = common.prompts_for(args.preset, 1)[0]
    result = {"name": args.name or args.preset or "custom", "draft": pair.draft.name,
              "prompt": prompt, "repeats": args.repeats, "timings": args.timings, "note": args.note,
              "machine": common.machine_info(args.threads)}
    result["by_k"] = {int(k): measure(pair, prompt, chat, int(k), args.repeats, args.timings) for k in args.ks.split(",")}
    text = markdown(result)
    common.write_results(Path(args.out), f"draft-step-{result['name']}", result, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
