"""The fast path against Hugging Face and our own plain decoding, in tokens/s, beside the physical limit.

    python -m bench.fast_bench --preset tiny-shakespeare --dtypes float32,bfloat16   # on a CUDA GPU
    python -m bench.fast_bench --preset tiny-shakespeare --device cpu --dry-run --out /tmp/x   # tries the script
    python -m bench.fast_bench --preset chat --device cpu --capture compile --decoder own --dtypes float32,bfloat16
        # the CPU fast path compiled, on the engine's own decoder (bfloat16 where the CPU has it in hardware)

Methods, each generating exactly --max-new-tokens tokens (no EOS stop) from the same prompt ids:
  a   fast path, tracing on: every cycle's record written to a trace file (engine/cycle/fast.py)
  b   fast path, tracing off: record=False (one copy per cycle of the tokens alone)
  c   HF assisted generation, target.generate(assistant_model=draft), the same fixed K
  d   HF plain generate, eager (its default dynamic cache)
  d'  HF plain generate at its best setting: cache_implementation="static", which makes
      generate compile the forward on CUDA (torch.compile); on the CPU compile is off
  e   our plain decoding on the fast path: one-token forwards over a static cache, captured
The fast path's caches and captured forwards are built once per (dtype, K, T) and reused by every
run (FastModels): a capture per prompt would be charged to every run. Methods run interleaved
within each repeat; a rate's median and its min-max over repeats are reported, and each ratio is
the median over repeats of the ratio within a repeat.

Physical limit: plain decoding reads every target weight once per token, so it can make at most
bandwidth / target weight bytes tokens/s. Speculation reads the target once and the draft K times
per cycle, and once more after a full accept (a share f of the cycles), for L tokens (L = mean
acceptance length), so its limit is bandwidth x L / (target + (K+f) draft bytes). Both are given with
the datasheet bandwidth (when the GPU is known) and with a bandwidth measured here by a device-to-device
copy.

Writes RESULTS/fast-NAME.json and .md.
"""
import argparse
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import transformers
from transformers import CompileConfig

from bench import common, hf
from bench.speed import start_anchor
from engine.config import SpecSettings
from engine.cycle.fast import FastModels, FastPlainModel, fast_generate, fast_plain_decode, plan_fast_path
from engine.cycle.pair import Pair
from engine.kv.layouts import layout_for_run
from engine.mode import RunMode
from engine.models.device import pick_device, pick_dtype
from engine.models.presets import PRESETS
from engine.run import encode_prompt, make_header
from engine.stats.analysis import cycle_times, measured_alpha
from engine.trace.format import TraceWriter, load_trace, make_summary
from engine.trace.schema import DECODER_HF, DECODERS, GGUF_WEIGHTS, TARGET_WEIGHTS, WEIGHTS_FLOAT32

METHODS = ("a", "b", "c", "d", "d'", "e")
ANCHOR = "f"  # llama.cpp's plain decoding of the target's GGUF file, with --llama-python (bench/speed.py's anchor)
METHOD_NAMES = {"a": "fast path, traced", "b": "fast path, untraced", "c": "HF assisted generation",
                "d": "HF generate, eager", "d'": "HF generate, static cache + compile",
                "e": "our plain decoding, fast path", ANCHOR: "llama.cpp plain, same GGUF"}
# Datasheet HBM bandwidth in GB/s (NVIDIA product pages: H200 4.8 TB/s, H100 SXM 3.35 TB/s, A100 80GB SXM 2.0 TB/s).
DATASHEET_GBS = {"H200": 4800.0, "H100": 3350.0, "A100": 2039.0}
GOALS = [  # (preset, ratio, at least, wording): the fast path's goals; fp32, greedy, on the GPU
    ("chat", "a/d", 10.0, "chat: (a) at least 10x HF eager generate"),
    ("chat", "a/e", 1.3, "chat: (a)/(e) at least 1.3"),
    ("tiny-shakespeare", "a/e", 1.8, "tiny-shakespeare: (a)/(e) at least 1.8"),
    ("tiny-shakespeare", "a/d'", 1.5, "tiny-shakespeare: (a)/(d') at least 1.5"),
    (None, "a/b", 0.95, "tracing costs at most 5% (a/b at least 0.95)"),
]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.add_pair_arguments(p)
    p.add_argument("--name", help="results name (default: the preset)")
    p.add_argument("--k", default="5", help="draft tokens per cycle; a comma list runs each")
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--capture", default=None, help="graph (default on CUDA), compile or none")
    p.add_argument("--target-weights", choices=TARGET_WEIGHTS, default=WEIGHTS_FLOAT32,
                   help="what the target's linear layers run on in a, b and e (int4: the GGUF blocks, CPU)")
    p.add_argument("--decoder", choices=DECODERS, default=DECODER_HF,
                   help="the code the engine's methods (a, b, e) run on; HF's methods run Hugging Face's modules")
    p.add_argument("--methods", default=",".join(METHODS), help="a subset of " + ",".join(METHODS))
    p.add_argument("--llama-python", default=None,
                   help="a Python with llama-cpp-python (bench/build_llama_cpp.sh): adds method f, llama.cpp's plain "
                        "decoding of the target's GGUF file, interleaved with the others")
    p.add_argument("--dry-run", action="store_true",
                   help="try every step of the script with tiny sizes (8 tokens, 1 prompt, 1 repeat); not a measurement")
    p.add_argument("--out", default=str(common.RESULTS))
    args = p.parse_args(argv)
    common.check_pair_arguments(p, args)
    if args.dry_run:
        args.max_new_tokens, args.prompts, args.repeats = min(args.max_new_tokens, 8), 1, 1
    unknown = set(args.methods.split(",")) - set(METHODS)
    if unknown:
        p.error(f"unknown methods {sorted(unknown)}; choose from {', '.join(METHODS)}")
    return args


# ---------------------------------------------------------------- the physical limit

def weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def measured_bandwidth_gbs(device: torch.device, dry_run: bool) -> float:
    """Device-to-device copy of a large buffer: bytes read + written per second (best of 5)."""
    n = (1 << 20) if dry_run else (1 << 28)  # 4 MiB or 1 GiB of float32
    src = torch.empty(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    best = min(common.timed_alone(lambda: dst.copy_(src), device)[1] for _ in range(5))
    return 2 * src.numel() * src.element_size() / best / 1e9


def datasheet_gbs(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in DATASHEET_GBS.items() if k in name), None)


def limits(pair: Pair, k: int, mean_acceptance_length: float, catch_up_share: float,
           bandwidth_gbs: float | None) -> dict | None:
    if not bandwidth_gbs:
        return None
    # int4: the blocks a target step reads, not the float32 copy the model was loaded as
    int4 = pair.target.weights in GGUF_WEIGHTS
    target = pair.target.gguf_weights.weight_bytes if int4 else weight_bytes(pair.target.model)
    draft = weight_bytes(pair.draft.model)
    bw = bandwidth_gbs * 1e9
    return {"bandwidth_gbs": bandwidth_gbs, "plain_tokens_per_s": bw / target,
            "speculative_tokens_per_s": bw * mean_acceptance_length / (target + (k + catch_up_share) * draft)}


# ---------------------------------------------------------------- one run per method

class Runner:
    """Every method on one pair at one (K, T), with the fast path's caches and graphs built once."""

    def __init__(self, pair: Pair, preset: str | None, k: int, capacity: int, capture: str, dry_run: bool,
                 folder: Path, anchor=None) -> None:
        self.pair, self.preset, self.k, self.folder, self.dry_run = pair, preset, k, folder, dry_run
        self.anchor = anchor  # bench/speed.py LlamaAnchor, for method f
        self.models = FastModels.empty(pair, k, capacity, capture)
        self.plain = FastPlainModel.empty(pair.target, capacity, capture)
        self.assistant = hf.full_vocab_assistant(pair.draft)
        hf.no_eos(pair.target.model)
        hf.no_eos(self.assistant)
        hf.fix_k(self.assistant, k)
        self.trace_paths: list[Path] = []

    def traced(self, prompt: str, ids: list[int], s: SpecSettings) -> int:
        """run_to_trace's work on the fast path: header, one record per cycle, summary, all written."""
        path = self.folder / f"trace-{len(self.trace_paths)}.jsonl"
        self.trace_paths.append(path)
        header = make_header(self.pair, s, prompt, ids, self.preset, False, RunMode(fast=self.models.capture))
        header["cache_layout"]["capacity"] = self.models.capacity  # one buffer serves every prompt
        header["fast_path"] = {"capture": self.models.capture}
        cycles = []
        with TraceWriter(path) as writer:
            writer.write(header)
            start = time.perf_counter()
            for rec in fast_generate(self.pair, ids, s, models=self.models):
                writer.write(rec)
                cycles.append(rec)
            text = self.pair.target.tokenizer.decode([t for c in cycles for t in c["committed_token_ids"]])
            summary = make_summary(cycles, s.k, text, "max_new_tokens", time.perf_counter() - start)
            writer.write(summary)
        return summary["num_generated"]

    def run(self, method: str, prompt: str, ids: list[int], s: SpecSettings) -> tuple[int, float]:
        pair, device = self.pair, self.pair.target.device
        if method == "a":
            return common.timed_alone(lambda: self.traced(prompt, ids, s), device)
        if method == "b":
            return common.timed_alone(lambda: sum(len(r["committed_token_ids"])
                                     for r in fast_generate(pair, ids, s, record=False, models=self.models)), device)
        if method == "e":
            return common.timed_alone(lambda: len(fast_plain_decode(pair.target, ids, s, set(), model=self.plain)), device)
        if method == ANCHOR:
            return self.anchor.run(ids, s)  # timed inside llama.cpp's process, prompt evaluation included as in e
        torch.manual_seed(s.seed)
        if method in ("c", "d"):
            assistant = self.assistant if method == "c" else None
            return common.timed_alone(lambda: len(hf.hf_generate(pair.target.model, ids, s, assistant)), device)
        return common.timed_alone(lambda: len(hf_static_generate(pair.target.model, ids, s, compile_=not self.dry_run)), device)


@torch.inference_mode()
def hf_static_generate(target, prompt_ids: list[int], s: SpecSettings, compile_: bool) -> list[int]:
    """HF generate with a static cache; on CUDA that makes it compile the forward (d')."""
    config = hf.generation_config(s)
    config.cache_implementation = "static"
    if compile_:
        config.compile_config = CompileConfig(fullgraph=False)
    else:
        config.disable_compile = True
    ids = torch.tensor([prompt_ids], device=target.device)
    out = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return out[0, len(prompt_ids):].tolist()


# ---------------------------------------------------------------- one setting

def bench_setting(pair: Pair, args, k: int, temperature: float, prompts: list[str], chat: bool,
                  capture: str, methods: list[str], bandwidth: dict, anchor=None) -> dict:
    s = SpecSettings(k=k, temperature=temperature, max_new_tokens=args.max_new_tokens, seed=0, cache_layout="static")
    ids = [encode_prompt(pair.target.tokenizer, p, chat) for p in prompts]
    capacity = max(layout_for_run(s, len(i)).capacity for i in ids)
    folder = Path(tempfile.mkdtemp(prefix="speclab-fast-bench-"))
    runner = Runner(pair, args.preset, k, capacity, capture, args.dry_run, folder, anchor)
    methods = [*methods, *([ANCHOR] if anchor else [])]
    warm_start = time.perf_counter()
    longest = max(range(len(ids)), key=lambda i: len(ids[i]))
    for method in methods:  # warm-up: captures, compilation, allocations (HF keeps a static cache this long)
        runner.run(method, prompts[longest], ids[longest], s)
    warm_up_s = time.perf_counter() - warm_start
    runner.trace_paths.clear()
    rates = common.interleaved_rates(runner.run, methods, prompts, ids, s, args.repeats, f"K={k} T={temperature}")
    return summarise(pair, s, rates, runner.trace_paths, capture, warm_up_s, bandwidth)


def summarise(pair: Pair, s: SpecSettings, rates: dict, trace_paths: list[Path], capture: str, warm_up_s: float,
              bandwidth: dict) -> dict:
    traces = [load_trace(p) for p in trace_paths]  # the loader must accept what the fast path wrote
    cycles = [c for t in traces for c in t.cycles]
    times = cycle_times(cycles)
    mean_len = (sum(len(c["committed_token_ids"]) for c in cycles) / len(cycles)) if cycles else None
    catch_up_share = (sum(c["draft_catch_up"] for c in cycles) / len(cycles)) if cycles else 0.0
    ratios = {f"{x}/{y}": common.paired_ratio(rates, x, y)
              for x, y in (("a", "b"), ("a", "c"), ("a", "d"), ("a", "d'"), ("a", "e"), ("e", "d"), ("d'", "d"),
                           ("e", ANCHOR), ("a", ANCHOR)) if x in rates and y in rates}
    return {
        "k": s.k, "temperature": s.temperature, "max_new_tokens": s.max_new_tokens, "capture": capture,
        "warm_up_s": warm_up_s,
        "tokens_per_s": {m: statistics.median(r) for m, r in rates.items()},
        "spread": {m: [min(r), max(r)] for m, r in rates.items()}, "rates": rates, "ratios": ratios,
        "alpha": measured_alpha(cycles) if cycles else None, "mean_acceptance_length": mean_len,
        "profile_ms": None if times is None else {
            "cycle": times.cycle_s * 1e3, "draft_steps": times.draft_s * 1e3, "verify": times.verify_s * 1e3,
            "d_K_step": times.catch_up_s * 1e3, "other": times.other_s * 1e3, "draft_step": times.draft_step_s * 1e3},
        "limits": {name: limits(pair, s.k, mean_len or 1.0, catch_up_share, bw) for name, bw in bandwidth.items()},
        "cycles": len(cycles),
    }


# ---------------------------------------------------------------- report

def ratio_cell(ratios: dict, name: str) -> str:
    return "-" if ratios.get(name) is None else f"{ratios[name]:.2f}"


def limit_cell(limits: dict, key: str) -> str:
    """A physical limit in tokens/s, with the datasheet and with the measured bandwidth ("-" where unknown)."""
    return " / ".join(f"{limits[n][key]:.0f}" if limits.get(n) else "-" for n in ("datasheet", "measured"))


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"### Fast path: {result['name']} ({result['target']} ← {result['draft']})", "",
             f"Machine: {m.get('gpu') or common.machine_words(m)}; torch {m['torch']}, "
             f"transformers {m['transformers']}; {m['date']}.",
             f"{len(result['prompts'])} prompts x {result['repeats']} repeats; tokens/s are medians over repeats "
             "(min-max in brackets), end to end.", ""]
    if result["dry_run"]:
        lines += ["**DRY RUN: tiny sizes on this device, to try the script. Not a measurement.**", ""]
    for block in result["runs"]:
        if "error" in block:
            lines += [f"- {block['dtype']}: failed: {block['error']}", ""]
            continue
        lines += [f"#### {block['dtype']}, capture {block['capture']}, decoder {block.get('decoder', DECODER_HF)}"
                  + (f", target weights {block['target_weights']['path']}" if block.get("target_weights") else "")
                  + (f" (asked for {block['capture_asked']}, which failed: {block['capture_error']})"
                     if block.get("capture_error") else ""), ""]
        methods = [m for m in (*METHODS, ANCHOR) if m in block["settings"][0]["tokens_per_s"]]
        ratio_names = ["a/e", "a/d", "a/d'", "a/b", "a/c", *(["e/f", "a/f"] if ANCHOR in methods else [])]
        lines += ["| K | T | " + " | ".join(f"{m} {METHOD_NAMES[m]}" for m in methods) + " | "
                  + " | ".join(ratio_names) + " | limit plain (datasheet / measured BW) | limit spec. | alpha |",
                  "|" + "---|" * (len(methods) + len(ratio_names) + 5)]
        for st in block["settings"]:
            tps, sp, r = st["tokens_per_s"], st["spread"], st["ratios"]
            lim = st["limits"]
            alpha = "-" if st["alpha"] is None else f"{st['alpha']:.2f}"
            lines.append(f"| {st['k']} | {st['temperature']:g} | "
                         + " | ".join(f"{tps[m]:.0f} [{sp[m][0]:.0f}-{sp[m][1]:.0f}]" for m in methods)
                         + " | " + " | ".join(ratio_cell(r, x) for x in ratio_names)
                         + f" | {limit_cell(lim, 'plain_tokens_per_s')} | {limit_cell(lim, 'speculative_tokens_per_s')} "
                         f"| {alpha} |")
        lines += ["", "Where a traced cycle's time goes (ms, mean per cycle):", "",
                  "| K | T | cycle | draft steps | d_K step | verify | other (test, sampling, rollback, copy, Python) |",
                  "|---|---|---|---|---|---|---|"]
        for st in block["settings"]:
            p = st["profile_ms"]
            if p:
                lines.append(f"| {st['k']} | {st['temperature']:g} | {p['cycle']:.3f} | {p['draft_steps']:.3f} "
                             f"| {p['d_K_step']:.3f} | {p['verify']:.3f} | {p['other']:.3f} |")
        if block.get("anchor"):
            lines.append(f"llama.cpp: {block['anchor']}")
        lines.append("")
    lines += ["Goals (the fast path's, fp32 greedy on the GPU):", "", *goal_lines(result), ""]
    return "\n".join(lines)


def goal_lines(result: dict) -> list[str]:
    if result["dry_run"] or result["machine"]["device"] == "cpu":
        return ["- not evaluated: not a GPU measurement"]
    out = []
    for preset, ratio, least, words in GOALS:
        if preset not in (None, result["preset"]):
            continue
        for block in result["runs"]:
            for st in block.get("settings", []):
                if block["dtype"] == "float32" and st["temperature"] == 0 and st["ratios"].get(ratio) is not None:
                    got = st["ratios"][ratio]
                    out.append(f"- {words}: K={st['k']} {got:.2f} {'met' if got >= least else 'NOT met'}")
    return out or ["- no fp32 greedy setting measured"]


def write_reports(result: dict, out: Path) -> None:
    common.write_results(out, f"fast-{result['name']}", result, markdown(result))


# ---------------------------------------------------------------- main

def run_dtype(args, dtype: str, prompts: list[str], methods: list[str]) -> dict:
    pair, chat = common.load_bench_pair(args, str(pick_device(args.device)), dtype)
    device = pair.target.device
    plan = plan_fast_path(device, args.capture)
    print(plan.message, flush=True)
    bandwidth = {"datasheet": datasheet_gbs(device), "measured": measured_bandwidth_gbs(device, args.dry_run)}
    block = {"dtype": dtype, "capture": plan.capture, "capture_asked": plan.capture, "decoder": pair.target.decoder,
             "target_weights": pair.target.describe_weights(),
             "target_weight_bytes": weight_bytes(pair.target.model), "draft_weight_bytes": weight_bytes(pair.draft.model),
             "bandwidth_gbs": bandwidth, "settings": []}
    args.threads = torch.get_num_threads()  # the anchor runs llama.cpp on as many threads as torch has here
    anchor, block["anchor"] = start_anchor(args, pair) if args.llama_python else (None, None)
    for k in (int(x) for x in str(args.k).split(",")):
        for temperature in (float(t) for t in args.temperatures.split(",")):
            try:
                st = bench_setting(pair, args, k, temperature, prompts, chat, block["capture"], methods, bandwidth,
                                   anchor)
            except Exception as err:  # a failed capture must not cost the rest of the GPU session
                if block["capture"] == "none":
                    raise
                block["capture_error"] = f"{type(err).__name__}: {err}"[:300]
                traceback.print_exc()
                print(f"capture {block['capture']} failed; this dtype continues without capture", flush=True)
                block["capture"] = "none"
                st = bench_setting(pair, args, k, temperature, prompts, chat, "none", methods, bandwidth, anchor)
            block["settings"].append(st)
    if anchor:
        anchor.close()
    return block


def runs_on_cpu(dtype: str) -> bool:
    """bfloat16 runs on a CPU that has it in hardware, or on the rows kernel (engine/models/device.py pick_dtype)."""
    try:
        pick_dtype(torch.device("cpu"), dtype)
    except ValueError:
        return False
    return True


def main(argv=None) -> int:
    args = parse_args(argv)
    transformers.logging.set_verbosity_error()
    name = args.name or args.preset or "custom"
    device = pick_device(args.device)
    dtypes = [d for d in args.dtypes.split(",") if device.type == "cuda" or d == "float32" or runs_on_cpu(d)]
    prompts = common.prompts_for(args.preset, args.prompts)
    methods = [m for m in METHODS if m in args.methods.split(",")]
    started = time.time()
    runs = []
    for dtype in dtypes:
        print(f"{name}: {dtype}", flush=True)
        try:
            runs.append(run_dtype(args, dtype, prompts, methods))
        except Exception as err:
            if args.dry_run:
                raise
            traceback.print_exc()
            runs.append({"dtype": dtype, "error": f"{type(err).__name__}: {err}"[:300]})
    names = (PRESETS[args.preset].target_name, PRESETS[args.preset].draft_name) if args.preset else (args.target, args.draft)
    result = {"name": name, "preset": args.preset, "target": names[0], "draft": names[1], "prompts": prompts,
              "repeats": args.repeats, "dry_run": args.dry_run, "methods": METHOD_NAMES,
              "machine": common.machine_info(torch.get_num_threads(), device), "wall_s": time.time() - started, "runs": runs}
    write_reports(result, Path(args.out))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
