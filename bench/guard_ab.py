"""The compiled chat step with and without dynamo's guards on module attributes, interleaved in one process.

    python -m bench.guard_ab --threads 2 --target-weights int4-a8
    python -m bench.guard_ab --threads 2 --target-weights float32   # the own decoder's rows twin

engine/cycle/fast_forward.py compile_forward compiles with `skip_guard_on_all_nn_modules_unsafe`: before every
call dynamo otherwise checks each module attribute the graph read. Here two fixed-shape forwards over the same
static cache (engine/cycle/fast.py FixedForward, capture compile), one compiled as the engine does and one with
every guard kept, alternate round by round, so the machine's drift falls on both alike.
Results: RESULTS/guard-ab-WEIGHTS-CPU.json and .md.
"""
import argparse
import statistics
import time
from functools import partial
from pathlib import Path

import torch

from bench.common import RESULTS, cpu_tag, machine_info, machine_words, write_results
from bench.step_limit import CONTEXT
from engine.cycle.fast import FixedForward, new_fast_cache
from engine.models.device import timed
from engine.run import load_preset
from engine.trace.schema import DECODER_OWN, GGUF_WEIGHTS, ROWS, TARGET_WEIGHTS, WEIGHTS_INT4_A8


def keep_every_guard(entries: list) -> list[bool]:
    return [True] * len(entries)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--widths", default="1,5")
    p.add_argument("--target-weights", choices=TARGET_WEIGHTS, default=WEIGHTS_INT4_A8)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    machine = machine_info(args.threads)
    target = load_preset("chat", device="cpu", target_weights=args.target_weights).target
    target.use_decoder(DECODER_OWN)
    skip = torch.compiler.skip_guard_on_all_nn_modules_unsafe
    results = {}
    with torch.inference_mode():
        for width in (int(w) for w in args.widths.split(",")):
            target.linear_paths = {} if args.target_weights in GGUF_WEIGHTS else {width: ROWS}
            ids = torch.tensor([i % target.full_vocab_size for i in range(1, CONTEXT + 1)])
            cache = new_fast_cache(target, CONTEXT + 16)
            target.forward(ids.tolist(), cache)
            steps = {}
            for name, guard_filter in (("without module guards (the engine's)", skip), ("every guard", keep_every_guard)):
                torch.compiler.skip_guard_on_all_nn_modules_unsafe = guard_filter  # read when compile_forward compiles
                step = FixedForward(target, cache, width, "compile")
                for layer in cache.layers:
                    layer.cumulative_length.fill_(CONTEXT)
                step.fn(ids[:width])  # compiles now, under this filter
                steps[name] = step
            torch.compiler.skip_guard_on_all_nn_modules_unsafe = skip
            times = {name: [] for name in steps}
            for i in range(args.repeats + 3):
                for name, step in steps.items():
                    for layer in cache.layers:
                        layer.cumulative_length.fill_(CONTEXT)
                    elapsed = timed(partial(step.fn, ids[:width]), target.device)[1]
                    if i >= 3:
                        times[name].append(elapsed * 1e3)
            results[width] = {name: {"median_ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t),
                                     "times_ms": t} for name, t in times.items()}
    names = list(next(iter(results.values())))
    lines = [f"## The compiled chat step with and without module guards, {args.target_weights} (bench/guard_ab.py)", "",
             f"Machine: {machine_words(machine)}; {machine['date']}. Own decoder, static cache of {CONTEXT} positions. "
             f"Medians of {args.repeats} forwards, the two alternating (range in brackets).", "",
             "| width | " + " | ".join(f"{n} (ms)" for n in names) + " | saved |", "|---|---|---|---|"]
    for width, r in results.items():
        a, b = r[names[0]], r[names[1]]
        lines.append(f"| {width} | {a['median_ms']:.2f} ({a['min_ms']:.2f}-{a['max_ms']:.2f}) | {b['median_ms']:.2f} "
                     f"({b['min_ms']:.2f}-{b['max_ms']:.2f}) | {b['median_ms'] - a['median_ms']:.2f} ms |")
    text = "\n".join(lines) + "\n"
    write_results(args.out, f"guard-ab-{args.target_weights}-{cpu_tag(machine)}",
                  {"machine": machine, "target_weights": args.target_weights, "results": results,
                   "date_end": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, text)
    print(text)


if __name__ == "__main__":
    main()
