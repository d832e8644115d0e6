"""The fast path's own step times, as `run --fast --k auto` calibrates them, over several rounds on this machine.

    python -m bench.fast_step_times --preset chat --decoder own
    python -m bench.fast_step_times --preset chat --decoder own --target-weights int4-a8
    python -m bench.fast_step_times --preset tiny-shakespeare --capture none --rounds 1 --out /tmp/x   # a try

The forwards are built once (engine/stats/fast_calibrate.py: under --capture compile each width compiles
once), then calibrated --rounds times as the advisor calibrates them: the target's one-token step (warped
and drawn), its forwards of 1 to K+1 positions, and the draft's one-token step where a cycle meets it,
right after a target pass over K+1 positions (so the draft's weights are read from memory, not from the
caches a back-to-back loop keeps them in), each timed once in each of --repeats rounds. Reported per
quantity: the calibration's figure (each quantity's median over its rounds), its median over calibrations
and min-max; then what the K advisor weighs, each forward and the draft step over the target step, from the
same timings read two ways: as the calibration reads them (separate medians, then the ratio) and as paired
medians (each round's ratio to the one-position forward, then the median), with their spread over the
calibrations. Run it on two commits alternately
to compare them.

Writes RESULTS/fast-step-times-NAME-CPU.json and .md.
"""
import argparse
import statistics
import time
from pathlib import Path

import torch

from bench import common
from engine.config import SpecSettings
from engine.stats.calibrate import context_of_length, run_cache_len
from engine.stats.fast_calibrate import calibrate_fast, refill, separate_medians, time_fast_rounds


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_fast_cpu_arguments(p)
    p.add_argument("--k", type=int, default=2, help="the verify widths timed are 1 to K+1")
    p.add_argument("--rounds", type=int, default=3, help="calibrations")
    p.add_argument("--repeats", type=int, default=15, help="rounds of a calibration: each quantity timed once in each")
    p.add_argument("--name", default=None, help="results name (default: the preset and weights)")
    p.add_argument("--out", default=str(common.RESULTS))
    args = p.parse_args(argv)
    common.check_pair_arguments(p, args)
    return args


def paired_medians(rounds: list[dict], reference: int | str = 1) -> dict:
    """Each quantity as the median over rounds of its ratio to `reference` timed in the same round, times the
    reference's own median: a reading a slow spell that lands on one round's quantities together cannot move,
    set beside the calibration's own (separate medians) to see which is steadier here."""
    base = statistics.median(r[reference] for r in rounds)
    return {key: base * statistics.median(r[key] / r[reference] for r in rounds) for key in rounds[0]}


def named(times: dict) -> dict[str, float]:
    """A calibration's seconds by fast_calibrate's keys -> ms by quantity name, the steps first."""
    widths = sorted(key for key in times if isinstance(key, int))
    return {"target step": times["step"] * 1e3, "draft step": times["draft"] * 1e3,
            **{f"forward of {w}": times[w] * 1e3 for w in widths}}


def in_steps(times: dict) -> dict[str, float]:
    """What the K advisor weighs: each forward and the draft step over the target step."""
    return {f"{q} / step": t / times["target step"] for q, t in times.items() if q != "target step"}


def summary(rounds: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {q: {"median": statistics.median(r[q] for r in rounds), "min": min(r[q] for r in rounds),
                "max": max(r[q] for r in rounds)} for q in rounds[0]}


def markdown(result: dict) -> str:
    m, a, s = result["machine"], result["args"], result["summary"]
    lines = ["## The fast path's step times (bench/fast_step_times.py)", "",
             f"Machine: {common.machine_words(m)}; {m['date']}.", "",
             f"{a['preset'] or 'custom pair'}, weights {a['target_weights']}, decoder {a['decoder']}, "
             f"`--fast --capture {a['capture']}`; forwards built once ({result['build_s']:.0f} s), then "
             f"{a['rounds']} calibrations of {a['repeats']} rounds each; the draft step timed right after a target "
             f"pass over {a['k'] + 1} positions.", "",
             "| quantity | ms, median over calibrations | min-max |", "|---|---|---|"]
    lines += [f"| {q} | {v['median']:.3f} | {v['min']:.3f}-{v['max']:.3f} |" for q, v in s.items()]
    ratios = [r["draft step"] / r["target step"] for r in result["rounds"]]
    lines += ["", f"Draft step over target step: {statistics.median(ratios):.3f} "
                  f"({min(ratios):.3f}-{max(ratios):.3f} over calibrations).", "",
              "In target steps, the same timings read two ways (median over calibrations, min-max, and the spread "
              "max - min):", "", "| ratio | paired medians | spread | separate medians | spread |", "|---|---|---|---|---|"]
    paired, separate = result["steps_summary"]["paired"], result["steps_summary"]["separate"]
    for q, v in paired.items():
        w = separate[q]
        lines.append(f"| {q} | {v['median']:.3f} ({v['min']:.3f}-{v['max']:.3f}) | {v['max'] - v['min']:.3f} | "
                     f"{w['median']:.3f} ({w['min']:.3f}-{w['max']:.3f}) | {w['max'] - w['min']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    pair, [prompt], [ids] = common.load_fast_cpu_pair(args, 1)
    s = SpecSettings(k=args.k, temperature=1.0, max_new_tokens=64, seed=0, cache_layout="static")
    machine = common.machine_info(torch.get_num_threads())
    started = time.perf_counter()
    _, forwards = calibrate_fast(pair, ids, s, args.capture, repeats=1)  # builds (compiles) every forward once
    build_s = time.perf_counter() - started
    context = context_of_length(ids, run_cache_len(ids, s) + 1)
    refill(pair, forwards, context)  # as calibrate_on does
    rounds, steps = [], {"paired": [], "separate": []}
    for n in range(args.rounds):
        raw = time_fast_rounds(forwards, context, s, args.repeats)
        rounds.append(named(separate_medians(raw)))  # what the calibration records
        steps["separate"].append(in_steps(rounds[-1]))
        steps["paired"].append(in_steps(named(paired_medians(raw))))
        print(f"calibration {n + 1}: " + "  ".join(f"{q} {v:.3f}" for q, v in rounds[-1].items()), flush=True)
    result = {"machine": machine, "args": vars(args), "prompt": prompt, "build_s": build_s, "rounds": rounds,
              "summary": summary(rounds), "steps": steps,
              "steps_summary": {way: summary(r) for way, r in steps.items()}}
    name = args.name or f"{args.preset or 'custom'}-{args.target_weights}"
    stem = f"fast-step-times-{name}-{common.cpu_tag(machine)}"
    text = markdown(result)
    common.write_results(Path(args.out), stem, result, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
