"""One target decode step on the CPU against its memory limit, per way of running it.

    python -m bench.step_limit --preset chat --threads 2 --repeats 30
    python -m bench.step_limit --preset tiny-shakespeare --threads 2 --compile
    python -m bench.step_limit --preset chat --compile --dtype bfloat16   # half the bytes; the rows kernel widens them
    python -m bench.step_limit --preset chat --compile --target-weights int4   # the GGUF blocks (limit: their bytes)

A decode step at batch 1 reads every weight once, so it cannot take less than
weight bytes / memory bandwidth (the memory limit; bfloat16 weights halve the bytes). The
bandwidth is measured here with a large tensor copy (bytes read + written per second, best of 5:
bench/fast_bench.py's measurement). Each way is timed over the same cache length (64 cached
positions), --width tokens per forward (1: a decode step; K+1: a verify), on both decoders
(hf: Hugging Face's modules; own: engine/models/llama.py on the same weights):
  as_loaded  the module's own nn.Linear (F.linear: MKL on x86), a DynamicCache
  packed     engine/models/cpu_linear.py's oneDNN twin with pre-packed weights (float32 only)
  rows       engine/models/f32_rows_kernel.c, each weight read once for all rows (float32 or bfloat16, with a C
             compiler)
  static     the fast path's static cache and fixed-shape forward (engine/cycle/fast_forward.py), eager, on the
             packed twin (float32; bfloat16: as loaded)
  compiled   the same forward compiled on the module as loaded (inductor's C++, weights
             frozen in), --compile only; its "first_calls_s" is the compile time
  compiled rows  the compiled forward of a width whose linear paths chose rows: the rows twin, its
             kernel one opaque operator in the graph (float32 or bfloat16, --compile only)
Step times are medians over --repeats forwards after a warm-up, with the middle half of them.

Writes RESULTS/step-limit-PRESET[-DTYPE][-wWIDTH]-CPU.json and .md (CPU: bench/common.py cpu_tag).
"""
import argparse
import statistics
import time
from functools import partial
from pathlib import Path

import torch

from bench import common
from bench.fast_bench import measured_bandwidth_gbs, weight_bytes
from engine.cycle.fast import FixedForward, new_fast_cache
from engine.kv.ops import crop
from engine.models import f32_rows_kernel, linear_paths
from engine.models.device import timed
from engine.models.loading import LoadedModel
from engine.models.machine import load_average
from engine.run import load_preset
from engine.trace.schema import (
    AS_LOADED,
    DECODER_HF,
    DECODER_OWN,
    GGUF_WEIGHTS,
    PACKED,
    ROWS,
    TARGET_WEIGHTS,
    WEIGHTS_FLOAT32,
)

CONTEXT = 64


def quartiles(times: list[float]) -> dict:
    q = statistics.quantiles(times, n=4)
    return {"median_s": statistics.median(times), "low_s": q[0], "high_s": q[2]}


def time_dynamic(target: LoadedModel, path: str, width: int, repeats: int) -> dict:
    """The engine's normal forward (a DynamicCache) on one linear path."""
    target.linear_paths = {width: path}
    ids = [i % target.full_vocab_size for i in range(1, CONTEXT + 1 + width)]
    cache = target.new_cache()
    target.fill(ids[:CONTEXT], cache)
    times = []
    for i in range(repeats + 3):  # 3 warm-up steps
        elapsed = timed(partial(target.forward, ids[CONTEXT:], cache), target.device)[1]
        crop(cache, CONTEXT)
        if i >= 3:
            times.append(elapsed)
    return quartiles(times)


def filled_cache(target: LoadedModel) -> tuple:
    """A fast-path static cache holding CONTEXT positions of `target`, and the token ids that filled it."""
    cache = new_fast_cache(target, CONTEXT + 16)
    ids = torch.tensor([i % target.full_vocab_size for i in range(1, CONTEXT + 1)])
    target.forward(ids.tolist(), cache)
    return cache, ids


@torch.inference_mode()  # the fast path's caches are inference tensors, written in place
def time_static(target: LoadedModel, capture: str, width: int, repeats: int) -> dict:
    """The fast path's forward of `width` tokens over a static cache (capture "none" or "compile")."""
    cache, ids = filled_cache(target)
    step = FixedForward(target, cache, width, capture)
    token = ids[:width]
    times, started = [], time.perf_counter()
    for i in range(repeats + 3):
        for layer in cache.layers:
            layer.cumulative_length.fill_(CONTEXT)  # every step writes the same slot: same cache length
        elapsed = timed(partial(step.fn, token), target.device)[1]
        if i >= 3:
            times.append(elapsed)
    return {**quartiles(times), "first_calls_s": time.perf_counter() - started - sum(times)}


def decoder_ways(target: LoadedModel, args) -> dict:
    """Every way of running the target's step on the decoder it is set to."""
    ways = {}
    float_weights = target.weights not in GGUF_WEIGHTS  # int4 has one path
    packed = float_weights and target.dtype == torch.float32  # oneDNN's packing here takes float32
    rows = float_weights and target.dtype in f32_rows_kernel.DTYPES and f32_rows_kernel.unavailable() is None
    for path in (AS_LOADED, PACKED, ROWS):
        if (path == PACKED and not packed) or (path == ROWS and not rows):
            continue
        ways[path] = time_dynamic(target, path, args.width, args.repeats)
    # Named explicitly: a fast-path forward on a model whose paths nothing chose settles them first
    # (engine/models/linear_paths.py settle_if_unchosen), which would make these ways the chosen one.
    target.linear_paths = {args.width: PACKED if packed else AS_LOADED} if float_weights else None
    ways["static"] = time_static(target, "none", args.width, args.repeats)
    if args.compile:
        as_loaded = {args.width: AS_LOADED} if float_weights else None
        for name, paths in (("compiled", as_loaded), *((("compiled rows", {args.width: ROWS}),) if rows else ())):
            target.linear_paths = paths  # LoadedModel.compiled_module_for: the rows twin where chosen
            try:
                ways[name] = time_static(target, "compile", args.width, args.repeats)
            except Exception as err:  # a failed compile is a result too: say why
                ways[name] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"}
        target.linear_paths = None
    return ways


def measure(args) -> dict:
    torch.set_num_threads(args.threads)
    pair = load_preset(args.preset, device="cpu", dtype_name=args.dtype, target_weights=args.target_weights)
    target = pair.target
    bandwidth = measured_bandwidth_gbs(torch.device("cpu"), False)
    # int4: the blocks a step reads (the float weights left are norms and the embedding rows looked up)
    step_bytes = target.gguf_weights.weight_bytes if target.weights in GGUF_WEIGHTS else weight_bytes(target.model)
    limit_s = step_bytes / (bandwidth * 1e9)
    ways, rows_variants = {}, {}
    for decoder in (DECODER_HF, DECODER_OWN):
        target.use_decoder(decoder)
        if target.decoder != decoder:
            ways[decoder] = {"error": f"the own decoder does not apply: {target.decoder_fallback}"}
            continue
        # the rows kernel's variant per width as the engine measures and chooses it here (kept per machine)
        rows_variants[decoder] = (linear_paths.settle(target) or {}).get("rows_variants", {})
        ways |= {f"{decoder} {name}": w for name, w in decoder_ways(target, args).items()}
    return {"preset": args.preset, "machine": common.machine_info(args.threads, dtype=target.dtype),
            "repeats": args.repeats, "width": args.width, "dtype": str(target.dtype).removeprefix("torch."),
            "target_weights": target.weights, "weight_bytes": step_bytes, "bandwidth_gbs": bandwidth,
            "memory_limit_s": limit_s,
            "ways": ways, "rows_variants": rows_variants, "load_after": load_average(), "note": args.note}


def markdown(r: dict) -> str:
    what = "step" if r.get("width", 1) == 1 else f"forward of {r['width']} tokens (a verify)"
    weights = f" on its {r['target_weights']} blocks" if r.get("target_weights") in GGUF_WEIGHTS else ""
    lines = [f"## One {r['preset']} target {what} in {r.get('dtype', 'float32')}{weights} against its memory limit "
             "(bench/step_limit.py)", "",
             f"Machine: {common.machine_words(r['machine'])}; torch {r['machine']['torch']}; {r['machine']['date']}."
             + (f" 1-minute load {r['load_after']} at the end." if r.get("load_after") is not None else "")
             + (f" {r['note']}" if r["note"] else ""), "",
             f"Weights: {r['weight_bytes'] / 1e6:.0f} MB. Measured copy bandwidth: {r['bandwidth_gbs']:.1f} GB/s. "
             f"Memory limit: {r['memory_limit_s'] * 1000:.2f} ms a step. Medians of {r['repeats']} steps "
             "(middle half in brackets).", "",
             "| decoder, way | step (ms) | x memory limit | first calls (s) |", "|---|---|---|---|"]
    for name, w in r["ways"].items():
        if "error" in w:
            lines.append(f"| {name} | failed: {w['error']} | - | - |")
            continue
        first = f"{w['first_calls_s']:.1f}" if "first_calls_s" in w else "-"
        lines.append(f"| {name} | {w['median_s'] * 1000:.2f} ({w['low_s'] * 1000:.2f}-{w['high_s'] * 1000:.2f}) | "
                     f"{w['median_s'] / r['memory_limit_s']:.2f} | {first} |")
    for decoder, variants in (r.get("rows_variants") or {}).items():
        if variants.get(str(r["width"])):
            lines += ["", f"The rows ways on the {decoder} decoder ran the kernel's {variants[str(r['width'])]} variant, "
                      "as the engine measured and chose it for this width here."]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="chat")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--compile", action="store_true", help="also time the forward under torch.compile")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                   help="weights and compute (bfloat16: in hardware with avx512_bf16 or AMX, elsewhere on the rows kernel)")
    p.add_argument("--width", type=int, default=1, help="tokens per forward: 1 a decode step, K+1 a verify")
    p.add_argument("--target-weights", choices=TARGET_WEIGHTS, default=WEIGHTS_FLOAT32,
                   help="float32, or int4: the target's GGUF blocks (engine/models/gguf_linear.py)")
    p.add_argument("--note", default="", help="conditions of the run (e.g. other processes on the machine)")
    p.add_argument("--out", default=str(common.RESULTS))
    args = p.parse_args()
    result = measure(args)
    text = markdown(result)
    stem = "-".join(["step-limit", args.preset, *([args.dtype] if args.dtype else []),
                     *([args.target_weights] if args.target_weights in GGUF_WEIGHTS else []),
                     *([f"w{args.width}"] if args.width != 1 else []), common.cpu_tag(result["machine"])])
    common.write_results(Path(args.out), stem, result, text)
    print(text)


if __name__ == "__main__":
    main()
