"""The compiled int4 chat forward with float32 and with 8-bit activations, interleaved in one process.

    python -m bench.int4_activations_ab --threads 2 --repeats 20

The chat target on its GGUF blocks, the own decoder, a static cache of CONTEXT positions and one fixed-shape
compiled forward per width (engine/cycle/fast.py FixedForward, capture compile), as bench/native_op_ab.py
times them. Rounds alternate --target-weights int4 and int4-a8 on the same forward (the graph is traced once
for each, its guards pick the one the layers are set to), so the machine's drift falls on both alike. A width's
time over width 1's is the verify's cost in steps. Results: RESULTS/int4-activations-ab-CPU.json and .md.
"""
import argparse
import statistics
import time
from functools import partial
from pathlib import Path

import torch

from bench.common import RESULTS, cpu_tag, machine_info, machine_words, write_results
from bench.fast_bench import measured_bandwidth_gbs
from bench.step_limit import CONTEXT
from engine.cycle.fast import FixedForward, new_fast_cache
from engine.models.device import timed
from engine.run import load_preset
from engine.trace.schema import DECODER_OWN, GGUF_WEIGHTS


def time_width(target, width: int, repeats: int) -> dict:
    """Medians (and ranges) of one compiled forward over `width` positions on each GGUF path, alternating."""
    ids = torch.tensor([i % target.full_vocab_size for i in range(1, CONTEXT + 1)])
    cache = new_fast_cache(target, CONTEXT + 16)
    target.forward(ids.tolist(), cache)
    step = FixedForward(target, cache, width, "compile")
    times = {w: [] for w in GGUF_WEIGHTS}
    for i in range(repeats + 3):
        for w in GGUF_WEIGHTS:
            target.use_weights(w)
            for layer in cache.layers:
                layer.cumulative_length.fill_(CONTEXT)
            elapsed = timed(partial(step.fn, ids[:width]), target.device)[1]
            if i >= 3:  # the first rounds trace and warm up
                times[w].append(elapsed * 1e3)
    return {w: {"median_ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t), "times_ms": t}
            for w, t in times.items()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--widths", default="1,3,5")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    machine = machine_info(args.threads)
    target = load_preset("chat", device="cpu", target_weights=GGUF_WEIGHTS[0]).target
    target.use_decoder(DECODER_OWN)
    limit_ms = target.gguf_weights.weight_bytes / (measured_bandwidth_gbs(torch.device("cpu"), False) * 1e9) * 1e3
    with torch.inference_mode():
        results = {int(w): time_width(target, int(w), args.repeats) for w in args.widths.split(",")}
    one = results[min(results)]
    lines = ["## The compiled int4 chat forward, float32 against 8-bit activations (bench/int4_activations_ab.py)", "",
             f"Machine: {machine_words(machine)}; {machine['date']}. Own decoder on the GGUF blocks, static cache of "
             f"{CONTEXT} positions; memory limit {limit_ms:.1f} ms. Medians of {args.repeats} forwards, the two "
             "paths alternating (range in brackets); steps = a width's median over width 1's on the same path.", "",
             "| width | " + " | ".join(f"{w} (ms) | {w} steps" for w in GGUF_WEIGHTS) + " |",
             "|---|" + "---|---|" * len(GGUF_WEIGHTS)]
    for width, r in results.items():
        lines.append(f"| {width} | " + " | ".join(
            f"{r[w]['median_ms']:.2f} ({r[w]['min_ms']:.2f}-{r[w]['max_ms']:.2f}) | "
            f"{r[w]['median_ms'] / one[w]['median_ms']:.2f}" for w in GGUF_WEIGHTS) + " |")
    text = "\n".join(lines) + "\n"
    write_results(args.out, f"int4-activations-ab-{cpu_tag(machine)}",
                  {"machine": machine, "limit_ms": limit_ms, "results": results,
                   "date_end": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, text)
    print(text)


if __name__ == "__main__":
    main()
