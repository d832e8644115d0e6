"""The K advisor on the fast path (`run --fast --k auto`) against every K measured, on this machine.

    python -m bench.fast_advisor --preset chat --capture compile --decoder own
    python -m bench.fast_advisor --preset chat --capture compile --decoder own --target-weights int4-a8
    python -m bench.fast_advisor --preset tiny-shakespeare --repeats 1 --max-new-tokens 16 --out /tmp/x   # a try

For each temperature and prompt, the advisor does what `run --fast --k auto` does before it runs: it times
the fast path's own forwards (engine/stats/fast_calibrate.py) and runs a pilot at K=4 on them, and
chooses a K, or K=0 (decode plainly). Then, on the same forwards (under --capture compile every width
compiles once for the whole benchmark), these arms run interleaved, --repeats times over the prompts,
each making exactly --max-new-tokens tokens (no EOS stop):
  plain     plain decoding on the fast path (fast_plain_decode)
  K=1..4    speculation at that K (fast_generate), each cycle's record made as `run` makes it for its
            trace (the file's writes aside), since the advisor's pilot and the run it advises are traced
            too; --untraced makes none (record=False), which is cheaper per cycle than the advisor assumes
  advised   each prompt at its advised K, or plainly where the advisor said K=0
Reported: tokens/s per arm (median, min-max over repeats), each arm over plain (the median over repeats of
the ratio within a repeat: a/e), the advisor's choice per prompt, and the best arm. The goal: the advised
arm at least plain (a/e >= 1.0), and close to the best arm.

Writes RESULTS/fast-advisor-NAME-CPU.json and .md.
"""
import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from bench import common
from engine.config import SpecSettings
from engine.cycle.fast import fast_generate, fast_plain_decode
from engine.stats.fast_calibrate import FastForwards, build_forwards, calibrate_on, forwards_capacity
from engine.stats.plan import KPlan, plan_k_fast

PILOT_K = 4  # as engine/cli/run.py K_AUTO_PILOT: the calibration times widths 1..5
KS = list(range(1, PILOT_K + 1))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_fast_cpu_arguments(p)
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--untraced", action="store_true", help="speculate without making the cycles' records")
    p.add_argument("--name", default=None, help="results name (default: the preset, weights and capture)")
    p.add_argument("--out", default=str(common.RESULTS))
    args = p.parse_args(argv)
    common.check_pair_arguments(p, args)
    return args


def advise(pair, forwards: FastForwards, ids: list[int], s: SpecSettings) -> tuple[KPlan, dict]:
    """What `run --fast --k auto` decides for this prompt, on forwards already built."""
    calibration = calibrate_on(pair, forwards, ids, s)
    return plan_k_fast(pair, ids, s, calibration, forwards), calibration


def arm_runner(pair, forwards: FastForwards, plans: dict[str, KPlan], record: bool = True):
    """run(arm, prompt, ids, settings) -> (tokens, seconds), as common.interleaved_rates calls it."""
    device = pair.target.device

    def run(arm: str, prompt: str, ids: list[int], s: SpecSettings) -> tuple[int, float]:
        k = plans[prompt].k if arm == "advised" else 0 if arm == "plain" else int(arm.removeprefix("K="))
        if k == 0:
            return common.timed_alone(lambda: len(fast_plain_decode(pair.target, ids, s, set(), forwards.capture,
                                                                    forwards.plain_model())), device)
        at_k = replace(s, k=k)
        return common.timed_alone(lambda: sum(len(r["committed_token_ids"]) for r in fast_generate(
            pair, ids, at_k, record=record, models=forwards.models_for(k))), device)
    return run


def bench_temperature(pair, forwards: FastForwards, prompts: list[str], ids: list[list[int]], s: SpecSettings,
                      repeats: int, record: bool) -> dict:
    plans, calibrations = {}, {}
    for prompt, prompt_ids in zip(prompts, ids):
        plans[prompt], calibrations[prompt] = advise(pair, forwards, prompt_ids, s)
        print(f"  T={s.temperature} {prompt[:30]!r}: pilot alpha {plans[prompt].alpha:.2f}, advised K={plans[prompt].k}",
              flush=True)
    arms = ["plain", *[f"K={k}" for k in KS], "advised"]
    run = arm_runner(pair, forwards, plans, record)
    for arm in arms:  # warm-up: every arm once on the longest prompt
        longest = max(range(len(ids)), key=lambda i: len(ids[i]))
        run(arm, prompts[longest], ids[longest], s)
    rates = common.interleaved_rates(run, arms, prompts, ids, s, repeats, f"T={s.temperature}")
    over_plain = {arm: common.paired_ratio(rates, arm, "plain") for arm in arms}
    best = max(arms[:-1], key=lambda a: statistics.median(rates[a]))
    return {"temperature": s.temperature, "rates": rates, "over_plain": over_plain, "best_arm": best,
            "advised": {p: {"k": plan.k, "alpha": plan.alpha, "predicted": plan.best.refined, "best_k": plan.best.k,
                            "sentence": plan.sentence} for p, plan in plans.items()},
            "calibrations": calibrations}


def markdown(result: dict) -> str:
    m, a = result["machine"], result["args"]
    lines = ["## The K advisor on the fast path against every K (bench/fast_advisor.py)", "",
             f"Machine: {common.machine_words(m)}; {m['date']}.", "",
             f"{a['preset'] or 'custom pair'}, {m['dtype']}, weights {a['target_weights']}, decoder {a['decoder']}, "
             f"`--fast --capture {a['capture']}`; {len(result['prompts'])} prompts x {a['max_new_tokens']} tokens, "
             f"{a['repeats']} repeats, arms interleaved, "
             f"{'untraced' if a.get('untraced') else 'each cycle recorded as for a trace'}; "
             f"forwards built once ({result['build_s']:.0f} s, compiles included). Rates: median tokens/s "
             "(min-max over repeats); over plain: the median over repeats of the ratio within a repeat.", ""]
    for t in result["temperatures"]:
        lines += [f"### Temperature {t['temperature']}", "", "| arm | tokens/s | over plain |", "|---|---|---|"]
        for arm, r in t["rates"].items():
            mark = " (best)" if arm == t["best_arm"] else ""
            lines.append(f"| {arm}{mark} | {statistics.median(r):.1f} ({min(r):.1f}-{max(r):.1f}) | "
                         f"{t['over_plain'][arm]:.2f} |")
        lines += ["", "| prompt | pilot alpha | advised K | the advisor's best K, predicted |", "|---|---|---|---|"]
        for prompt, adv in t["advised"].items():
            shown = prompt[:40].replace("\n", " ").replace("|", "/")
            lines.append(f"| {shown} | {adv['alpha']:.2f} | {adv['k']} | K={adv['best_k']}, "
                         f"{adv['predicted']:.2f}x |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    pair, prompts, ids = common.load_fast_cpu_pair(args, args.prompts)
    s = SpecSettings(k=PILOT_K, temperature=0.0, max_new_tokens=args.max_new_tokens, seed=0, cache_layout="static")
    capacity = max(forwards_capacity(i, s) for i in ids)
    started = time.perf_counter()
    print(f"building the fast path's forwards ({args.capture}) of widths 1 to {PILOT_K + 1}...", flush=True)
    forwards = build_forwards(pair, ids[0], list(range(1, PILOT_K + 2)), capacity, args.capture)
    calibrate_on(pair, forwards, ids[0], s, repeats=1)  # the first calls compile
    build_s = time.perf_counter() - started
    temperatures = [bench_temperature(pair, forwards, prompts, ids, replace(s, temperature=float(t)), args.repeats,
                                      not args.untraced) for t in args.temperatures.split(",")]
    machine = common.machine_info(torch.get_num_threads(), pair.target.device, pair.target.dtype)
    result = {"machine": machine, "args": vars(args), "prompts": prompts, "build_s": build_s,
              "temperatures": temperatures}
    name = args.name or "-".join([args.preset or "custom", args.target_weights, args.capture,
                                  *(["untraced"] if args.untraced else [])])
    stem = f"fast-advisor-{name}-{common.cpu_tag(machine)}"
    common.write_results(Path(args.out), stem, result, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
