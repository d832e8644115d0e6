"""The compiled chat step on the rows kernel, its graph calling the C++ operator or the Python one, interleaved.

    python -m bench.native_op_ab --threads 2 --repeats 20
    python -m bench.native_op_ab --target-weights int4   # the int4 blocks' operator (gguf_op.cpp) instead

bench/step_limit.py's "own compiled rows" way, twice in one process: the same static cache and fixed-shape
forward (engine/cycle/fast.py FixedForward, capture compile) on the own decoder's rows twin, once traced with
f32_rows_op.cpp's `speclab_native::f32_rows_linear` in the graph and once with the Python custom operator
`speclab::f32_rows_linear`. Rounds alternate the two, so the machine's drift (30% between runs on the AVX2
EPYC) falls on both alike; each step also counts its calls into the Python `linear`, to show which operator
ran. With --target-weights int4 the same, on the GGUF blocks: gguf_op.cpp's `speclab_native::gguf_linear`
against the Python `speclab::gguf_linear` (the limit is then the blocks' bytes). Results:
RESULTS/native-op-ab[-int4]-CPU.json and .md.
"""
import argparse
import statistics
import time
from functools import partial
from pathlib import Path

import torch

from bench.common import RESULTS, cpu_tag, machine_info, machine_words, write_results
from bench.fast_bench import measured_bandwidth_gbs, weight_bytes
from bench.step_limit import CONTEXT
from engine.cycle.fast import FixedForward, new_fast_cache
from engine.models import f32_rows_kernel as rows
from engine.models import gguf_kernel
from engine.models.device import timed
from engine.run import load_preset
from engine.trace.schema import DECODER_OWN, GGUF_WEIGHTS, ROWS, TARGET_WEIGHTS, WEIGHTS_FLOAT32


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--widths", default="1,5")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--target-weights", choices=TARGET_WEIGHTS, default=WEIGHTS_FLOAT32)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    machine = machine_info(args.threads)
    int4 = args.target_weights in GGUF_WEIGHTS
    kernel_module = gguf_kernel if int4 else rows  # each holds NATIVE, prepare_compiled and the Python `linear`
    if not kernel_module.prepare_compiled():
        raise SystemExit(f"the C++ operator did not build: {kernel_module.NATIVE_MISSING}")
    cpp = kernel_module.NATIVE[0]
    target = load_preset("chat", device="cpu").target
    target.use_decoder(DECODER_OWN)
    target.use_weights(args.target_weights)
    step_bytes = target.gguf_weights.weight_bytes if int4 else weight_bytes(target.model)
    limit_ms = step_bytes / (measured_bandwidth_gbs(torch.device("cpu"), False) * 1e9) * 1e3
    python_calls = []
    kernel = kernel_module.linear
    kernel_module.linear = lambda *a: python_calls.append(1) or kernel(*a)  # what the Python operator runs
    results = {}
    with torch.inference_mode():
        for width in [int(w) for w in args.widths.split(",")]:
            target.linear_paths = {} if int4 else {width: ROWS}
            ids = torch.tensor([i % target.full_vocab_size for i in range(1, CONTEXT + 1)])
            steps = {}
            for name, op in (("C++ operator", cpp), ("Python operator", None)):
                cache = new_fast_cache(target, CONTEXT + 16)
                target.forward(ids.tolist(), cache)
                kernel_module.NATIVE[0] = op  # read while the graph is traced: each forward keeps the operator it was traced with
                steps[name] = (cache, FixedForward(target, cache, width, "compile"), op)
            times = {name: [] for name in steps}
            calls = {name: 0 for name in steps}
            for i in range(args.repeats + 3):
                for name, (cache, step, op) in steps.items():
                    kernel_module.NATIVE[0] = op
                    for layer in cache.layers:
                        layer.cumulative_length.fill_(CONTEXT)
                    before = len(python_calls)
                    elapsed = timed(partial(step.fn, ids[:width]), target.device)[1]
                    calls[name] = len(python_calls) - before
                    if i >= 3:
                        times[name].append(elapsed * 1e3)
            results[width] = {name: {"median_ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t),
                                     "python_linear_calls_per_step": calls[name], "times_ms": t}
                              for name, t in times.items()}
    kernel_module.NATIVE[0] = cpp
    way = f"{args.target_weights} blocks (gguf_linear)" if int4 else "rows twin"
    lines = [f"## The compiled chat step, its graph calling the C++ or the Python operator, {way} (bench/native_op_ab.py)",
             "", f"Machine: {machine_words(machine)}; {machine['date']}. Own decoder, {way}, static cache of {CONTEXT} "
             f"positions; memory limit {limit_ms:.1f} ms. Medians of {args.repeats} steps, the two ways alternating "
             "(range in brackets).", "",
             "| width | C++ operator (ms) | Python operator (ms) | saved | C++ x limit | Python `linear` calls a step |",
             "|---|---|---|---|---|---|"]
    for width, r in results.items():
        a, b = r["C++ operator"], r["Python operator"]
        lines.append(f"| {width} | {a['median_ms']:.2f} ({a['min_ms']:.2f}-{a['max_ms']:.2f}) | {b['median_ms']:.2f} "
                     f"({b['min_ms']:.2f}-{b['max_ms']:.2f}) | {b['median_ms'] - a['median_ms']:.2f} ms | "
                     f"{a['median_ms'] / limit_ms:.2f}x | {a['python_linear_calls_per_step']} / "
                     f"{b['python_linear_calls_per_step']} |")
    text = "\n".join(lines) + "\n"
    write_results(args.out, f"native-op-ab{'-' + args.target_weights if int4 else ''}-{cpu_tag(machine)}",
                  {"machine": machine, "target_weights": args.target_weights, "limit_ms": limit_ms, "results": results,
                   "date_end": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, text)
    print(text)


if __name__ == "__main__":
    main()
