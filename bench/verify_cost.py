"""Where a target forward over 1..9 new positions spends its time, layer by layer (a benchmark, not a test).

    python -m bench.verify_cost                      # both presets' targets
    python -m bench.verify_cost --preset chat --threads 1,2
    python -m bench.verify_cost --model DIR --name mine

For each model, thread count, width and variant it times one cached forward at a fixed
cache length (the cache is cropped back after each), and splits it with forward hooks:
- whole forward: the model call, as LoadedModel.forward makes it;
- decoder layers: all of them, and inside them the attention projections (q, k, v, o),
  the attention core (rope, cache update, scores; self-attention minus its projections)
  and the MLP (gate, up, down and the activation);
- output layer: the final matrix product to vocabulary logits.
Variants: `reference` is the model as loaded (F.linear -> MKL); `rows` runs every linear layer on
engine/models/f32_rows_kernel.c (each weight read once for all rows); `packed` is the engine's
fast path (engine/models/cpu_linear.py: oneDNN with pre-packed weights, 1-2 rows padded to 3);
`packed-nopad` the same without padding; `packed-all` sends 1-row decoder products through
oneDNN too. Repeats run round-robin over widths and variants, so a busy spell of
a shared machine hits every cell alike; the table gives medians and the
interquartile range of the whole forward. Hooks add a few microseconds per module.
Results: bench/results/verify-cost-NAME.json and .md.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from torch import nn

from bench.common import RESULTS, machine_info, machine_words, write_results
from engine.kv.ops import crop
from engine.models.cpu_linear import RowPolicy, output_layer_name, packed_twin
from engine.models.f32_rows_kernel import rows_twin
from engine.models.loading import load_model
from engine.models.machine import load_average
from engine.models.presets import PRESETS

PARTS = ("whole", "layers", "attn_proj", "attn_core", "mlp", "output")
VARIANTS = {  # name: RowPolicy overrides for packed_twin; None = the model as loaded
    "reference": None,
    "packed": {},  # the engine's default (engine/models/cpu_linear.py DEFAULT_POLICY)
    "packed-nopad": {"decoder": RowPolicy(dense_below=2), "output": RowPolicy()},
    "packed-all": {"decoder": RowPolicy(pad_to=3)},  # 1-row decoder products through oneDNN too
    "rows": "rows",  # engine/models/f32_rows_kernel.py's twin: each weight read once for all rows
}


def variant_model(model: nn.Module, variant: str) -> nn.Module:
    """The module tree a variant runs: the model as loaded, a packed twin, or the rows twin."""
    policy = VARIANTS[variant]
    if policy is None:
        return model
    return rows_twin(model) if policy == "rows" else packed_twin(model, policy)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", action="append", choices=sorted(PRESETS), help="repeatable; default: every preset")
    p.add_argument("--model", action="append", default=[], help="a model folder (repeatable)")
    p.add_argument("--name", help="results name (default: the presets' or folders' names joined)")
    p.add_argument("--widths", default="1-9", help='"1-9" or "1,2,3,5"')
    p.add_argument("--cache-len", type=int, default=48)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--threads", default=str(torch.get_num_threads()), help="comma-separated thread counts")
    p.add_argument("--variants", default="reference,packed", help=",".join(VARIANTS))
    p.add_argument("--out", default=str(RESULTS))
    return p.parse_args(argv)


def parse_widths(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(w) for w in text.split(",")]


class PartTimer:
    """Forward hooks that add up the time spent in each part of one forward."""

    def __init__(self, model: nn.Module) -> None:
        self.totals = dict.fromkeys(PARTS, 0.0)
        self.started: dict[int, float] = {}
        self.handles = []
        head = output_layer_name(model)
        for name, module in model.named_modules():
            part = self.part_of(name, module, head)
            if part:
                self.handles.append(module.register_forward_pre_hook(self.enter))
                self.handles.append(module.register_forward_hook(lambda m, i, o, part=part: self.leave(m, part)))

    @staticmethod
    def part_of(name: str, module: nn.Module, head: str | None) -> str | None:
        leaf = name.rsplit(".", 1)[-1]
        if name == head:
            return "output"
        if leaf in ("q_proj", "k_proj", "v_proj", "o_proj"):
            return "attn_proj"
        if leaf == "self_attn":
            return "attn_core"  # minus its projections, subtracted in `parts`
        if leaf == "mlp":
            return "mlp"
        if name.count(".") == 2 and name.rsplit(".", 2)[-2] == "layers":  # model.layers.N
            return "layers"
        return None

    def enter(self, module: nn.Module, inputs) -> None:
        self.started[id(module)] = time.perf_counter()

    def leave(self, module: nn.Module, part: str) -> None:
        self.totals[part] += time.perf_counter() - self.started[id(module)]

    def reset(self) -> None:
        self.totals = dict.fromkeys(PARTS, 0.0)

    def parts(self, whole: float) -> dict[str, float]:
        t = dict(self.totals, whole=whole)
        t["attn_core"] -= t["attn_proj"]
        return t


@torch.inference_mode()
def timed_forward(model: nn.Module, timer: PartTimer, ids: torch.Tensor, cache) -> dict[str, float]:
    timer.reset()
    start = time.perf_counter()
    model(input_ids=ids, use_cache=True, cache=cache)
    return timer.parts(time.perf_counter() - start)


def measure(models: dict[str, nn.Module], vocab: int, widths: list[int], cache_len: int,
            repeats: int) -> dict[str, dict[int, dict[str, list[float]]]]:
    """times[variant][width][part] over repeats, round-robin over widths and variants."""
    gen = torch.Generator().manual_seed(0)
    context = torch.randint(0, vocab, (1, cache_len + max(widths)), generator=gen)
    timers = {v: PartTimer(m) for v, m in models.items()}
    caches = {}
    for v, m in models.items():
        caches[v] = transformers.DynamicCache(config=m.config)
        with torch.inference_mode():
            m(input_ids=context[:, :cache_len], use_cache=True, cache=caches[v])
    times = {v: {w: {p: [] for p in PARTS} for w in widths} for v in models}
    for round_number in range(repeats + 1):  # round 0 warms up
        for w in widths:
            for v, m in models.items():
                parts = timed_forward(m, timers[v], context[:, cache_len:cache_len + w], caches[v])
                crop(caches[v], cache_len)
                if round_number:
                    for p, t in parts.items():
                        times[v][w][p].append(t)
    for timer in timers.values():
        for h in timer.handles:
            h.remove()
    return times


def quartiles(xs: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return q[0], q[2]


def summarise(times: dict) -> dict:
    """Medians in ms, the whole forward's IQR, and the whole forward in reference 1-row steps."""
    out = {}
    step = statistics.median(times["reference"][1]["whole"]) if "reference" in times and 1 in times["reference"] else None
    for v, by_width in times.items():
        own_step = statistics.median(by_width[min(by_width)]["whole"])
        rows = []
        for w, parts in by_width.items():
            med = {p: statistics.median(ts) * 1e3 for p, ts in parts.items()}
            lo, hi = quartiles(parts["whole"])
            rows.append({"width": w, **{f"{p}_ms": med[p] for p in PARTS}, "whole_iqr_ms": [lo * 1e3, hi * 1e3],
                         "in_own_steps": med["whole"] / (own_step * 1e3),
                         "in_reference_steps": med["whole"] / (step * 1e3) if step else None})
        out[v] = rows
    return out


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"## Verify cost per width: {result['name']}", "",
             f"CPU: {machine_words(m)}; torch {m['torch']}, transformers {m['transformers']}; "
             f"{m['date']}. 1-minute load {result.get('load_before', 'not recorded')} when the timings began "
             "(the CPU line's was read at the end). "
             f"Cache length {result['cache_len']}, medians of {result['repeats']} round-robin repeats. "
             "Taken on a shared machine under load from other processes unless stated otherwise: trust ratios "
             "between cells of one table (measured interleaved) more than absolute times.", ""]
    for model in result["models"]:
        for run in model["runs"]:
            lines += [f"### {model['name']}: {model['layers']} layers, hidden {model['hidden']}, vocabulary "
                      f"{model['vocab']}; {run['threads']} thread(s)", "",
                      "| variant | width | whole ms (IQR) | decoder layers | attn proj | attn core | MLP | output layer "
                      "| steps (own 1-row) | steps (reference 1-row) |",
                      "|---|---|---|---|---|---|---|---|---|---|"]
            for v, rows in run["table"].items():
                for r in rows:
                    ref = f"{r['in_reference_steps']:.2f}" if r["in_reference_steps"] else "-"
                    lines.append(f"| {v} | {r['width']} | {r['whole_ms']:.1f} ({r['whole_iqr_ms'][0]:.1f}-"
                                 f"{r['whole_iqr_ms'][1]:.1f}) | {r['layers_ms']:.1f} | {r['attn_proj_ms']:.1f} | "
                                 f"{r['attn_core_ms']:.1f} | {r['mlp_ms']:.1f} | {r['output_ms']:.1f} | "
                                 f"{r['in_own_steps']:.2f} | {ref} |")
            lines.append("")
    return "\n".join(lines)


def model_specs(args) -> list[tuple[str, str]]:
    specs = [(name, str(PRESETS[name].target_folder())) for name in (args.preset or [])]
    specs += [(Path(folder).name, folder) for folder in args.model]
    return specs or [(name, str(p.target_folder())) for name, p in PRESETS.items()]


def main(argv=None) -> int:
    args = parse_args(argv)
    transformers.logging.set_verbosity_error()
    widths, variants = parse_widths(args.widths), args.variants.split(",")
    load_before = load_average()
    specs = model_specs(args)
    result = {"name": args.name or "+".join(n for n, _ in specs), "cache_len": args.cache_len,
              "repeats": args.repeats, "widths": widths, "models": []}
    for name, folder in specs:
        loaded = load_model(folder, torch.device("cpu"), torch.float32)
        models = {v: variant_model(loaded.model, v) for v in variants}
        cfg = loaded.model.config
        entry = {"name": name, "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "vocab": cfg.vocab_size,
                 "runs": []}
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            print(f"{name}: {threads} thread(s)", flush=True)
            times = measure(models, cfg.vocab_size, widths, args.cache_len, args.repeats)
            entry["runs"].append({"threads": threads, "table": summarise(times)})
        result["models"].append(entry)
    result["machine"] = machine_info(torch.get_num_threads())  # its load average is the end's
    result["load_before"] = load_before
    text = markdown(result)
    write_results(Path(args.out), f"verify-cost-{result['name']}", result, text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
