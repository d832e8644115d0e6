"""Why the int4 path has its own kernel: PyTorch's int4 CPU kernels against ours, on the chat target's layers.

    python -m bench.int4_kernels --threads 2 --repeats 30

PyTorch's `aten._weight_int4pack_mm_for_cpu` takes a Q4_1 block as a group of 32 with a scale and a zero
point: its weight is (q - 8) * scale + zero, so scale = d and zero = m + 8 d give the file's d * q + m.
Two questions, both answered here on the real file:
1. Exactness: on x86 its vectorised kernel exists for bfloat16 activations only, with bfloat16 scales and
   zero points. How many of the file's d, m and m + 8 d survive bfloat16 unchanged?
2. Speed: each kernel on the chat target's four layer shapes (576x576, 192x576, 1536x576, 576x1536) and the
   49152x576 output layer, 1 and 5 rows, against F.linear on the float32 weights. Medians of --repeats.

3. A whole step's products: every linear layer of the file once, in order, each on its own blocks (so
   the 96 MB stream from memory as in a real step, where the layers above stay in cache), at 1 and 5
   rows, through the same calls the model makes (engine/models/gguf_kernel.BlockMatrix). Against the
   memory limit: block bytes over the measured copy bandwidth (bench/fast_bench.py's measurement).

Writes RESULTS/int4-kernels.json and .md.
"""
import argparse
import statistics
from functools import partial
from pathlib import Path

import torch

from bench import common
from bench.fast_bench import measured_bandwidth_gbs
from engine.models import gguf_kernel
from engine.models.gguf_blocks import block_tensor, dequantize, read_gguf
from engine.models.presets import smollm2_gguf

LAYERS = ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.ffn_up.weight", "blk.0.ffn_down.weight",
          "token_embd.weight")


def scales(blocks: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The float16 d and m of every block, as float32: (N, nb) each (m is zero for Q8_0)."""
    b = blocks.view(blocks.shape[0], -1, 20 if kind == "Q4_1" else 34)
    d = b[..., 0:2].contiguous().view(torch.float16).float()[..., 0]
    m = b[..., 2:4].contiguous().view(torch.float16).float()[..., 0] if kind == "Q4_1" else torch.zeros_like(d)
    return d, m


def survives_bf16(x: torch.Tensor) -> float:
    return (x.to(torch.bfloat16).float() == x).float().mean().item()


def torch_int4_args(tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch's packed weight and (K/32, N, 2) scales and zeros for a Q4_1 tensor."""
    b = tensor.blocks.view(tensor.out_features, -1, 20)
    q = torch.cat([b[..., 4:20] & 15, b[..., 4:20] >> 4], dim=-1).reshape(tensor.out_features, -1).int()
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    d, m = scales(tensor.blocks, "Q4_1")
    zeros = torch.stack([d, m + 8 * d], dim=-1).transpose(0, 1).contiguous().to(dtype)  # (K/32, N, 2)
    return packed, zeros


def median_ms(fn, repeats: int) -> float:
    fn()
    return statistics.median(common.timed_alone(fn, torch.device("cpu"))[1] for _ in range(repeats)) * 1e3


def torch_int4_row(t, w: torch.Tensor, x: torch.Tensor, dtype: torch.dtype, repeats: int) -> tuple[float, float]:
    """PyTorch's int4 kernel on `dtype` activations: median ms, and the largest distance of its output
    from the float32 product (the mapping above is exact in float32; bfloat16 rounds)."""
    packed, zeros = torch_int4_args(t, dtype)
    run = partial(torch.ops.aten._weight_int4pack_mm_for_cpu, x.to(dtype), packed, 32, zeros)
    return median_ms(run, max(3, repeats // 5)), (run().float() - x @ w.T).abs().max().item()


def layer_row(t, rows: int, repeats: int) -> dict:
    w = dequantize(t)
    x = torch.randn(rows, t.in_features)
    row = {"layer": t.name, "type": t.kind, "shape": [t.out_features, t.in_features], "rows": rows,
           "float32_linear_ms": median_ms(partial(torch.nn.functional.linear, x, w), repeats),
           "ours_ms": median_ms(partial(gguf_kernel.linear, x, t.blocks, t.kind, t.out_features), repeats)}
    if t.kind == "Q4_1":
        for dtype, key in ((torch.float32, "torch_int4_float32"), (torch.bfloat16, "torch_int4_bfloat16")):
            row[f"{key}_ms"], row[f"{key}_max_error"] = torch_int4_row(t, w, x, dtype, repeats)
    return row


def all_layers(file, rows: int, repeats: int) -> dict:
    """One pass over every block-typed layer of the file, as a step would make it: median ms of `repeats`."""
    matrices = [gguf_kernel.BlockMatrix(t.blocks, t.kind, t.out_features, t.in_features)
                for t in (block_tensor(file, info) for info in file.tensors.values()
                          if info.type_name in gguf_kernel.BLOCK_TYPES and len(info.shape) == 2)]
    inputs = {m.in_features: torch.randn(rows, m.in_features) for m in matrices}

    def one_pass() -> None:
        for m in matrices:
            m(inputs[m.in_features])

    return {"rows": rows, "layers": len(matrices), "block_bytes": sum(m.weights.numel() for m in matrices),
            "ms": median_ms(one_pass, repeats)}


def measure(args) -> dict:
    torch.set_num_threads(args.threads)
    file = read_gguf(smollm2_gguf())
    rows_out = []
    survive = {"d": [], "m": [], "m+8d": []}
    for name in LAYERS:
        t = block_tensor(file, file.tensors[name])
        d, m = scales(t.blocks, t.kind)
        if t.kind == "Q4_1":
            survive["d"].append(survives_bf16(d))
            survive["m"].append(survives_bf16(m))
            survive["m+8d"].append(survives_bf16(m + 8 * d))
        for rows in (1, 5):
            rows_out.append(layer_row(t, rows, args.repeats))
            print(rows_out[-1], flush=True)
    k = block_tensor(file, file.tensors["blk.0.attn_k.weight"])
    packed, zeros = torch_int4_args(k, torch.float32)
    back = torch.ops.aten._weight_int4pack_mm_for_cpu(torch.eye(k.in_features), packed, 32, zeros)
    step = [all_layers(file, rows, args.repeats) for rows in (1, 5)]
    return {"machine": common.machine_info(args.threads), "repeats": args.repeats, "rows": rows_out,
            "all_layers": step, "bandwidth_gbs": measured_bandwidth_gbs(torch.device("cpu"), False),
            "torch_int4_float32_weights_exact": bool(torch.equal(back.T, dequantize(k))),
            "bf16_exact_fraction": {k: statistics.mean(v) for k, v in survive.items()}}


def markdown(result: dict) -> str:
    ex = result["bf16_exact_fraction"]
    lines = ["## PyTorch's int4 CPU kernels against the int4 path's own (bench/int4_kernels.py)", "",
             f"Machine: {common.machine_words(result['machine'])}. Medians of {result['repeats']} calls (PyTorch's int4: "
             f"fewer, they are slow), ms.", "",
             f"Q4_1 scales that survive bfloat16 unchanged (layers above): d {ex['d']:.1%}, m {ex['m']:.1%}, "
             f"zero point m + 8d {ex['m+8d']:.1%}. PyTorch's vectorised x86 kernel takes bfloat16 scales and zero "
             "points, so the other weights would not be the file's.", "",
             "| layer | type | shape | rows | F.linear float32 | ours | torch int4, float32 | torch int4, bfloat16 |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        cells = [f"{r[k]:.3f}" if k in r else "-" for k in ("float32_linear_ms", "ours_ms", "torch_int4_float32_ms",
                                                            "torch_int4_bfloat16_ms")]
        shape = f"{r['shape'][0]}x{r['shape'][1]}"
        lines.append(f"| {r['layer']} | {r['type']} | {shape} | {r['rows']} | " + " | ".join(cells) + " |")
    errors = [(r["torch_int4_float32_max_error"], r["torch_int4_bfloat16_max_error"]) for r in result["rows"]
              if "torch_int4_float32_max_error" in r]
    exact = "equal" if result.get("torch_int4_float32_weights_exact") else "**differ from**"
    lines += ["", f"Largest |output - float32 product| of PyTorch's kernel over these layers: float32 variant "
              f"{max(e[0] for e in errors):.2g} (its scalar loop sums serially), bfloat16 variant "
              f"{max(e[1] for e in errors):.2g}. Read back with identity inputs, the float32 variant's weights of "
              f"blk.0.attn_k {exact} the file's: scale = d, zero = m + 8d is the exact mapping."]
    if "all_layers" in result:
        bw = result["bandwidth_gbs"]
        lines += ["", f"A whole step's products, each layer on its own blocks (streamed from memory), through the "
                  f"calls the model makes; measured copy bandwidth {bw:.1f} GB/s:", "",
                  "| rows | layers | block MB | ms | memory limit ms | x limit |", "|---|---|---|---|---|---|"]
        for a in result["all_layers"]:
            limit_ms = a["block_bytes"] / bw / 1e6
            lines.append(f"| {a['rows']} | {a['layers']} | {a['block_bytes'] / 1e6:.1f} | {a['ms']:.2f} | "
                         f"{limit_ms:.2f} | {a['ms'] / limit_ms:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--out", default=str(common.RESULTS))
    args = p.parse_args(argv)
    result = measure(args)
    common.write_results(Path(args.out), "int4-kernels", result, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
