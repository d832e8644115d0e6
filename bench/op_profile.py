"""Where a target forward of M = 1..6 positions spends its time, operation by operation, on each linear path.

    python -m bench.op_profile --threads 2                 # the chat target, about 2-3 minutes
    python -m bench.op_profile --threads 2 --repeats 2 --widths 1,3 --note smoke

For the chat target (SmolLM2-135M: 30 layers, hidden 576, intermediate 1536, vocabulary 49,152) it times,
round-robin over the paths and widths so that a busy spell of the machine hits every cell alike:
- each matrix product shape (q, k, v, o, gate, up, down over all 30 layers' weights in turn, as a step
  streams them; the output layer 576 x 49,152) on the three linear paths: `as_loaded` (F.linear, which
  for float32 on x86 goes to MKL's sgemm: see `libraries` in the results), `packed` (oneDNN with
  pre-packed weights, engine/models/cpu_linear.py, every row count through oneDNN) and `rows`
  (engine/models/f32_rows_kernel.c, this engine's kernel);
- attention's core (rotary embedding and scaled dot-product attention over 64 cached positions),
  the RMS norms, the MLP's activation, all 30 layers' worth;
- the engine's sampling of M distributions (warp_probs at temperature 1 and a draw per row);
- the whole forward, LoadedModel.forward on each path (a DynamicCache at 64 positions);
- Python and framework overhead: the whole forward minus the sum of its parts on that path.
The memory limit is the weight bytes over the measured copy bandwidth (bench/fast_bench.py). Parts
are timed alone, so their sum only estimates the forward's own split.

Writes RESULTS/op-profile-CPU.json and .md (CPU: bench/common.py cpu_tag, with -noamx for an AVX-512
CPU without AMX) with the load average before and after: the machine is shared, and a load above
QUIET_LOAD marks the results as taken under load.
"""
import argparse
import re
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import torch
from torch import nn

from bench import common
from bench.fast_bench import measured_bandwidth_gbs, weight_bytes
from engine.config import SpecSettings
from engine.kv.ops import crop
from engine.models import f32_rows_kernel
from engine.models.cpu_linear import PackedLinear, RowPolicy
from engine.models.device import timed
from engine.models.machine import load_average
from engine.models.sampling import sample, warp_probs
from engine.run import load_preset
from engine.trace.schema import AS_LOADED, PACKED, ROWS

CONTEXT = 64  # cached positions, as engine/models/linear_paths.py times its paths
QUIET_LOAD = 0.5
SHAPES = {  # name -> the module of each decoder layer (Hugging Face's Llama); "output" is lm_head
    "q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}


def libraries() -> dict:
    """Which library each float32 path reaches here, from torch's build and MKL's / oneDNN's own verbose
    output of one 3-row product (a child process: the verbose switches print from C)."""
    probe = ("import torch;x=torch.randn(3,576);w=torch.randn(1536,576)\n"
             "with torch.backends.mkl.verbose(torch.backends.mkl.VERBOSE_ON):torch.nn.functional.linear(x,w)\n"
             "with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):torch.nn.functional.linear(x,w)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120).stdout
    config = torch.__config__.show()
    return {"mkl_available": torch.backends.mkl.is_available(), "mkldnn_available": torch.backends.mkldnn.is_available(),
            "blas": ", ".join(re.findall(r"(?:BLAS_INFO|USE_MKL|USE_MKLDNN)=\w+", config)) or "unknown",
            # the calls F.linear made: MKL prints SGEMM(...) lines, oneDNN "onednn_verbose,...,exec" lines
            "f_linear_verbose": [ln.strip()[:160] for ln in out.splitlines() if "SGEMM" in ln or ",exec," in ln][:4],
            "rows_kernel": f32_rows_kernel.unavailable() or f"built; variant {f32_rows_kernel.best_isa()}"}


def linear_fns(model: nn.Module, shape: str) -> dict:
    """path -> a function of x (M, K) running this shape over every layer's weights in turn."""
    layers = [model.lm_head] if shape == "output" else [m.get_submodule(SHAPES[shape]) for m in model.model.layers]
    packed = [PackedLinear(m, RowPolicy()) for m in layers]  # every row count through oneDNN
    rows = [f32_rows_kernel.RowsLinear(m, f32_rows_kernel.isa_to_use()) for m in layers]
    fns = {AS_LOADED: lambda x: [nn.functional.linear(x, m.weight, m.bias) for m in layers],
           PACKED: lambda x: [m(x) for m in packed]}
    if f32_rows_kernel.unavailable() is None:
        fns[ROWS] = lambda x: [m(x) for m in rows]
    return fns


def other_fns(model: nn.Module, width: int) -> dict:
    """Attention's core, norms and the activation, 30 layers' worth, on tensors of the real shapes."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    cfg = model.config
    heads, kv_heads, head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    n_layers = cfg.num_hidden_layers
    q = torch.randn(1, heads, width, head_dim)
    k_new = torch.randn(1, kv_heads, width, head_dim)
    cache_k, cache_v = torch.randn(1, kv_heads, CONTEXT + width, head_dim), torch.randn(1, kv_heads, CONTEXT + width, head_dim)
    positions = torch.arange(CONTEXT, CONTEXT + width)[None]
    cos, sin = model.model.rotary_emb(q, positions)
    mask = torch.ones(width, CONTEXT + width, dtype=torch.bool).tril(CONTEXT)

    def attention() -> None:
        for _ in range(n_layers):
            qr, kr = apply_rotary_pos_emb(q, k_new, cos, sin)
            cache_k[:, :, CONTEXT:] = kr
            nn.functional.scaled_dot_product_attention(qr, cache_k, cache_v, attn_mask=mask, enable_gqa=True)

    hidden, inner = torch.randn(1, width, cfg.hidden_size), torch.randn(1, width, cfg.intermediate_size)
    norm, act = model.model.norm, nn.functional.silu
    return {"attention core": attention,
            "norms": lambda: [norm(hidden) for _ in range(2 * n_layers + 1)],
            "activation": lambda: [act(inner) * inner for _ in range(n_layers)]}


def sampling_fn(vocab: int, width: int):
    logits, gen, s = torch.randn(width, vocab), torch.Generator().manual_seed(0), SpecSettings(temperature=1.0)
    return lambda: [sample(p, gen) for p in warp_probs(logits, s)]


def whole_fn(target, path: str, width: int):
    ids = [i % target.full_vocab_size for i in range(1, CONTEXT + width + 1)]
    cache = target.new_cache()
    target.fill(ids[:CONTEXT], cache)

    def forward() -> None:
        target.linear_paths = {width: path}
        target.forward(ids[CONTEXT:], cache)
        crop(cache, CONTEXT)
    return forward


@torch.inference_mode()
def measure(args) -> dict:
    torch.set_num_threads(args.threads)
    load_before = load_average()
    target = load_preset("chat", device="cpu").target
    model = target.model
    bandwidth = measured_bandwidth_gbs(torch.device("cpu"), False)
    limit_s = weight_bytes(model) / (bandwidth * 1e9)
    widths = [int(w) for w in args.widths.split(",")]
    cells: dict = {}  # (part, path or "", width) -> function
    shapes = [*SHAPES, "output"]
    for shape in shapes:
        for path, fn in linear_fns(model, shape).items():
            for w in widths:
                x = torch.randn(w, model.config.intermediate_size if shape == "down" else model.config.hidden_size)
                cells[(f"linear {shape}", path, w)] = partial(fn, x)
    paths = sorted({p for _, p, _ in cells}, key=[AS_LOADED, PACKED, ROWS].index)
    for w in widths:
        cells |= {(name, "", w): fn for name, fn in other_fns(model, w).items()}
        cells[("sampling", "", w)] = sampling_fn(target.full_vocab_size, w)
        cells |= {("whole forward", p, w): whole_fn(target, p, w) for p in paths}
    times: dict = {key: [] for key in cells}
    for round_number in range(args.repeats + 1):  # round 0 warms up
        for key, fn in cells.items():
            elapsed = timed(fn, target.device)[1]
            if round_number:
                times[key].append(elapsed)
    median = {key: statistics.median(t) for key, t in times.items()}
    table = {}
    for p in paths:
        for w in widths:
            linear = {s: median[(f"linear {s}", p, w)] for s in shapes}
            others = {n: median[(n, "", w)] for n in ("attention core", "norms", "activation")}
            whole = median[("whole forward", p, w)]
            table[f"{p} {w}"] = {"path": p, "width": w, "linear_s": linear, "other_s": others, "whole_s": whole,
                                 "overhead_s": whole - sum(linear.values()) - sum(others.values()),
                                 "sampling_s": median[("sampling", "", w)]}
    return {"model": "chat target (SmolLM2-135M-Instruct, float32)", "machine": common.machine_info(args.threads),
            "load_before": load_before, "load_after": load_average(), "repeats": args.repeats,
            "libraries": libraries(), "weight_bytes": weight_bytes(model), "bandwidth_gbs": bandwidth,
            "memory_limit_s": limit_s, "profile": table, "note": args.note}


def markdown(r: dict) -> str:
    ms = lambda s: f"{s * 1000:.2f}"  # noqa: E731
    loud = max(r["load_before"] or 0, r["load_after"] or 0) > QUIET_LOAD
    lib = r["libraries"]
    lines = ["## Chat target forward, operation by operation (bench/op_profile.py)", "",
             f"Machine: {common.machine_words(r['machine'])}; torch {r['machine']['torch']}; {r['machine']['date']}. "
             f"Load average {r['load_before']} before, {r['load_after']} after"
             + (" (**taken under load**: timings are inflated and noisy)." if loud else " (quiet).")
             + (f" {r['note']}" if r["note"] else ""), "",
             f"Libraries: {lib['blas']}; MKL {'on' if lib['mkl_available'] else 'off'}, oneDNN (mkldnn) "
             f"{'on' if lib['mkldnn_available'] else 'off'}. F.linear, verbose: "
             + ("; ".join(f"`{ln}`" for ln in lib["f_linear_verbose"]) or "nothing printed")
             + f". Rows kernel: {lib['rows_kernel']}.", "",
             f"Weights {r['weight_bytes'] / 1e6:.0f} MB, copy bandwidth {r['bandwidth_gbs']:.1f} GB/s: memory limit "
             f"{ms(r['memory_limit_s'])} ms a forward. Medians of {r['repeats']} (ms); every part is 30 layers' worth.", ""]
    shapes = list(next(iter(r["profile"].values()))["linear_s"])
    others = list(next(iter(r["profile"].values()))["other_s"])
    lines += ["| path | M | " + " | ".join(shapes) + " | linear sum | " + " | ".join(others)
              + " | overhead | whole | x limit | sampling |", "|---" * (len(shapes) + len(others) + 8) + "|"]
    for row in r["profile"].values():
        lin = row["linear_s"]
        lines.append(f"| {row['path']} | {row['width']} | " + " | ".join(ms(lin[s]) for s in shapes)
                     + f" | {ms(sum(lin.values()))} | " + " | ".join(ms(row["other_s"][n]) for n in others)
                     + f" | {ms(row['overhead_s'])} | {ms(row['whole_s'])} | {row['whole_s'] / r['memory_limit_s']:.2f}"
                     + f" | {ms(row['sampling_s'])} |")
    return "\n".join(lines) + "\n"


def cpu_name(m: dict) -> str:
    tag = common.cpu_tag(m)
    features = m.get("cpu_features") or []
    return tag + "-noamx" if "avx512f" in features and "amx_tile" not in features else tag


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--widths", default="1,2,3,4,5,6")
    p.add_argument("--note", default="", help="conditions of the run")
    p.add_argument("--out", default=str(common.RESULTS))
    args = p.parse_args()
    started = time.perf_counter()
    result = measure(args)
    result["seconds"] = round(time.perf_counter() - started, 1)
    text = markdown(result)
    common.write_results(Path(args.out), f"op-profile-{cpu_name(result['machine'])}", result, text)
    print(text)


if __name__ == "__main__":
    main()
