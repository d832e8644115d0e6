"""What a compiled verify costs in steps, with every width timed in the same rounds (a benchmark, not a test).

    python -m bench.compiled_widths --preset chat --threads 2
    python -m bench.compiled_widths --dtype bfloat16 --paths rows,as_loaded --widths 1,3,5
    python -m bench.compiled_widths --rows-variants avx512,avx512-l2,avx2-l2 --widths 1,3,5   # the kernel's variants
    python -m bench.compiled_widths --target-weights int4-a8 --widths 1,3,5   # the GGUF blocks (paths do not apply)

bench/step_limit.py times one width per run, minutes apart; on a shared 2-core VM (the AVX-512 EPYC) the same
compiled step took 23 ms in one run and 29 ms in another, so a verify's cost in steps read off two runs says
as much about the machine's neighbours as about the forward. Here the fast path's compiled forwards
(`run --fast --capture compile`, engine/cycle/fast_forward.py) of every width and path asked for are built
first, then called round-robin: each round calls every (path, width) once, so a slow spell falls on all of
them, and each width's cost in steps is the median over rounds of its time over the same round's one-position
forward on the same path. The cache holds CONTEXT positions and every call writes the same slots.
Results: RESULTS/compiled-widths-PRESET[-DTYPE]-CPU.json and .md.
"""
import argparse
import statistics
import time
from pathlib import Path

import torch

from bench import common
from bench.common import RESULTS, cpu_tag, machine_words, write_results
from bench.step_limit import CONTEXT, filled_cache
from engine.cycle.fast import FixedForward
from engine.models.f32_rows_kernel import VARIANTS
from engine.models.loading import LoadedModel
from engine.models.machine import load_average
from engine.run import load_preset
from engine.trace.schema import AS_LOADED, DECODER_OWN, ROWS, TARGET_WEIGHTS, WEIGHTS_FLOAT32

WARM_UP = 3


def build(target: LoadedModel, path: str, width: int, variant: str | None = None) -> tuple:
    """A compiled forward of `width` positions on `path`, its cache filled to CONTEXT; compiled by its first call.
    On the rows path, `variant` names the kernel's variant (f32_rows_kernel.VARIANTS) the graph calls: each gets
    a twin of its own, so a graph compiled earlier keeps its variant."""
    # LoadedModel.compiled_module_for: the rows twin where ROWS is chosen; on the GGUF blocks the int4 module
    target.linear_paths = {width: path or AS_LOADED}
    if variant is not None:
        target._rows_twin = None  # a new twin and plan for this graph
        target.rows_variants = {width: VARIANTS[variant]}
    cache, ids = filled_cache(target)
    forward = FixedForward(target, cache, width, "compile")
    tokens = ids[:width]
    started = time.perf_counter()
    for _ in range(WARM_UP):
        call(forward, cache, tokens)
    return forward, cache, tokens, time.perf_counter() - started


def call(forward: FixedForward, cache, tokens: torch.Tensor) -> float:
    for layer in cache.layers:
        layer.cumulative_length.fill_(CONTEXT)  # the same slots every call: the same cache length
    started = time.perf_counter()
    forward.fn(tokens)
    return time.perf_counter() - started


@torch.inference_mode()  # the fast path's caches are inference tensors, written in place
def measure(args) -> dict:
    torch.set_num_threads(args.threads)
    target = load_preset(args.preset, device="cpu", dtype_name=args.dtype).target
    target.use_decoder(args.decoder)
    target.use_weights(args.target_weights)
    widths = sorted({1, *(int(w) for w in args.widths.split(","))})
    variants = args.rows_variants.split(",") if args.rows_variants else [None]
    # a way: (label, path, rows variant); the rows path once per variant asked for
    ways = [(f"{path} {v}" if path == ROWS and v else path, path, v if path == ROWS else None)
            for path in args.paths.split(",") for v in (variants if path == ROWS else [None])]
    if args.target_weights != WEIGHTS_FLOAT32:
        ways = [(args.target_weights, None, None)]  # one kernel: the linear paths are float32's choice
    forwards, first_calls = {}, {}
    for label, path, variant in ways:
        for width in widths:
            *forwards[(label, width)], first_calls[f"{label}/{width}"] = build(target, path, width, variant)
    target.linear_paths = None
    times = {key: [] for key in forwards}
    for _ in range(args.rounds):
        for key, (forward, cache, tokens) in forwards.items():
            times[key].append(call(forward, cache, tokens))
    rows = []
    for path, width in forwards:
        ms = sorted(t * 1e3 for t in times[(path, width)])
        steps = [t / one for t, one in zip(times[(path, width)], times[(path, 1)])]
        rows.append({"path": path, "width": width, "median_ms": statistics.median(ms), "q1_ms": ms[len(ms) // 4],
                     "q3_ms": ms[(3 * len(ms)) // 4], "steps": statistics.median(steps),
                     "steps_q1": sorted(steps)[len(steps) // 4], "steps_q3": sorted(steps)[(3 * len(steps)) // 4]})
    return {"preset": args.preset, "dtype": args.dtype, "target_weights": args.target_weights,
            "decoder": target.decoder, "rounds": args.rounds,
            "machine": common.machine_info(args.threads, dtype=target.dtype), "load_after": load_average(),
            "first_calls_s": first_calls, "rows": rows, "note": args.note}


def markdown(r: dict) -> str:
    lines = [f"## Compiled forwards of 1 to {max(row['width'] for row in r['rows'])} positions, round-robin "
             "(bench/compiled_widths.py)", "",
             f"Machine: {machine_words(r['machine'])}; {r['machine']['date']}. 1-minute load {r['load_after']} at the "
             f"end. {r['note']}".rstrip(), "",
             f"{r['preset']} target, {r['dtype']}, weights {r.get('target_weights', WEIGHTS_FLOAT32)}, "
             f"{r['decoder']} decoder, `--fast --capture compile`'s forward over "
             f"{CONTEXT} cached positions. {r['rounds']} rounds, each calling every path and width once; medians "
             "(middle half in brackets). `steps`: the median over rounds of the forward's time over the same round's "
             "one-position forward on the same path.", "",
             "| path | positions | forward (ms) | steps |", "|---|---|---|---|"]
    for row in r["rows"]:
        lines.append(f"| {row['path']} | {row['width']} | {row['median_ms']:.2f} ({row['q1_ms']:.2f}-{row['q3_ms']:.2f}) "
                     f"| {row['steps']:.2f} ({row['steps_q1']:.2f}-{row['steps_q3']:.2f}) |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="chat")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--decoder", default=DECODER_OWN)
    p.add_argument("--paths", default=ROWS, help=f"comma-separated of {AS_LOADED}, {ROWS}")
    p.add_argument("--rows-variants", default="",
                   help="comma-separated rows-kernel variants to compile the rows path with, each timed as a path of "
                        f"its own (of {', '.join(VARIANTS)}; default: the kernel's unmeasured default)")
    p.add_argument("--target-weights", choices=TARGET_WEIGHTS, default=WEIGHTS_FLOAT32,
                   help="float32 (on --paths), or the GGUF blocks: int4, int4-a8")
    p.add_argument("--widths", default="1,2,3,4,5,6")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--note", default="", help="conditions of the run")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    result = measure(args)
    dtype = "" if args.dtype == "float32" else f"-{args.dtype}"
    dtype += "" if args.target_weights == WEIGHTS_FLOAT32 else f"-{args.target_weights}"
    text = markdown(result)
    write_results(args.out, f"compiled-widths-{args.preset}{dtype}-{cpu_tag(result['machine'])}", result, text)
    print(text)


if __name__ == "__main__":
    main()
