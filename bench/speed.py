"""Speed benchmark: tokens/s of our engine against Hugging Face, same machine, pair, prompts, settings.

    python -m bench.speed --preset tiny-shakespeare
    python -m bench.speed --preset chat
    python -m bench.speed --target DIR --draft DIR --name tiny   # any pair, e.g. tiny test models
    python -m bench.speed --preset chat --drafter eagle            # the engine drafts with the EAGLE head
    python -m bench.speed --preset chat --drafter eagle3           # ... with the EAGLE-3 head (speculators format)
    python -m bench.speed --target DIR --draft DIR --drafter eagle --head DIR
    python -m bench.speed --preset chat --target-weights int4 --llama-python /tmp/llama-venv/bin/python

--drafter model|eagle|eagle3 chooses what drafts for methods a and b (default: the preset's default
drafter; a draft model for --target/--draft). Method c always uses the separate draft model
(--draft, or the preset's): Hugging Face has no EAGLE drafter. Head results are written
under NAME-eagle or NAME-eagle3, so they never overwrite the draft model's figures.

Methods, each generating exactly --max-new-tokens tokens (no EOS stop) from the same prompt ids:
  a  our engine, tracing on: run_to_trace (writes a trace file, records every cycle)
  b  our engine, tracing off: speculative_generate(..., record=False), no file
  c  HF assisted generation, target.generate(assistant_model=draft) with the same fixed K and
     the separate draft model (whatever --drafter is)
  d  HF plain decoding, target.generate without an assistant
  e  our plain decoding loop (engine.stats.sweep.plain_decode, target_generate's loop), whose per-token
     decode time is the t_step behind c and both predictions
  f  the llama.cpp anchor: llama-cpp-python's plain decoding of the target's own GGUF file
     (bench/llama_anchor.py in the environment --llama-python names, built by bench/build_llama_cpp.sh);
     without it the results say why f did not run
a, b and e run the engine's forward on --target-weights: float32 (the model as loaded; on a float32
CPU model each width on the faster of MKL and pre-packed oneDNN, engine/models/linear_paths.py) or
int4 (the GGUF file's blocks, engine/models/gguf_linear.py); c and d run Hugging Face on the float32
model as loaded. With int4 the results also time one target step on both weights paths, interleaved,
and every run states the memory limit: target weight bytes over the measured copy bandwidth.
Each repeat runs every method on every prompt (interleaved, so drift spreads evenly), with
its own seed shared by all methods (repeat r uses seed r; HF's methods draw from torch's
global generator, seeded with r before each call). One fixed seed would repeat one run's
luck: at K=7, T=1 on tiny-shakespeare, seed 0 took 46 cycles for 160 tokens where seeds
1-7 took 31-40.
a method's rate in one repeat is its tokens over its time summed over the prompts. The
table reports each rate's median over repeats, and each ratio as the median over repeats
of the ratio within a repeat. Times are end to end (prefill included).

K: --k N, or "auto": a short calibrated pilot run and the K advisor's best K (refined
prediction), chosen separately for each temperature. Results go to
bench/results/speed-NAME.json and .md, and bench/results/speed.md collects every preset.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
import transformers

from bench import common, hf
from bench.bench_report import write_reports
from engine.config import SpecSettings
from engine.cycle.pair import Pair
from engine.cycle.reference import speculative_generate
from engine.drafters.eagle import load_head
from engine.drafters.eagle3 import load_eagle3
from engine.mode import RunMode
from engine.models.device import pick_device, timed
from engine.models.presets import PRESETS, default_drafter
from engine.run import encode_prompt, prepare_advised_run, run_to_trace
from engine.stats.analysis import (
    advice_sentence,
    advise_k,
    advised_k,
    best_k,
    calibration_of,
    cycle_times,
    measured_alpha,
    overhead_of,
    refined_speedup,
)
from engine.stats.calibrate import calibrate
from engine.stats.sweep import plain_decode
from engine.trace.metrics import predicted_speedup
from engine.trace.schema import (
    DECODER_HF,
    DECODERS,
    DRAFT_MODEL,
    EAGLE,
    EAGLE3,
    GGUF_WEIGHTS,
    TARGET_WEIGHTS,
    WEIGHTS_FLOAT32,
    WEIGHTS_INT4,
    WEIGHTS_INT4_A8,
)

METHODS = ("a", "b", "c", "d", "e")
ANCHOR = "f"
METHOD_NAMES = {"a": "engine, tracing on", "b": "engine, tracing off", "c": "HF assisted generation",
                "d": "HF plain decoding", "e": "engine plain decoding", "f": "llama.cpp plain decoding"}
BENCH_DRAFTERS = (DRAFT_MODEL, EAGLE, EAGLE3)  # what drafts for methods a and b
HEADS = (EAGLE, EAGLE3)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.add_pair_arguments(p)
    p.add_argument("--drafter", choices=BENCH_DRAFTERS, default=None,
                   help="what drafts in methods a and b (default: the preset's default drafter; model for --target)")
    p.add_argument("--head", help="--drafter eagle or eagle3 with --target: the head's folder (a preset ships its own)")
    p.add_argument("--name", help="results name (default: the preset; -eagle or -eagle3 is added for a head)")
    p.add_argument("--k", default="auto", help='draft tokens per cycle, or "auto" (the K advisor\'s best K)')
    p.add_argument("--temperatures", default="0,1", help="comma-separated; 0 = greedy")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--prompts", type=int, default=3, help="how many of the preset's prompts")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtype", default=None, help="float32 (default), bfloat16 or float16 (GPU only)")
    p.add_argument("--out", default=str(common.RESULTS))
    p.add_argument("--note", default="", help="conditions to print with the results (e.g. a machine under load)")
    p.add_argument("--target-weights", choices=TARGET_WEIGHTS, default=WEIGHTS_FLOAT32,
                   help="what the target's linear layers run on in a, b and e (engine/models/gguf_linear.py for int4)")
    p.add_argument("--decoder", choices=DECODERS, default=DECODER_HF,
                   help="the code a, b and e run the target and the draft model on (hf, or own: engine/models/llama.py)")
    p.add_argument("--llama-python", default=os.environ.get("SPECLAB_LLAMA_PYTHON"),
                   help="a Python with llama-cpp-python (bench/build_llama_cpp.sh) for the llama.cpp anchor f")
    args = p.parse_args(argv)
    common.check_pair_arguments(p, args)
    if args.drafter is None:
        args.drafter = default_drafter(args.preset or "")
        if args.drafter not in BENCH_DRAFTERS:
            p.error(f"the preset's default drafter {args.drafter!r} is not benchmarked here: pass --drafter")
    if args.drafter in HEADS and not args.preset and not args.head:
        p.error(f"--drafter {args.drafter} with --target/--draft needs --head DIR")
    if args.head and args.drafter not in HEADS:
        p.error("--head is for --drafter eagle or eagle3")
    return args


def results_name(args) -> str:
    """The results file's name: eagle figures never overwrite the draft model's."""
    name = args.name or args.preset or "custom"
    name = f"{name}-{args.drafter}" if args.drafter in HEADS and args.drafter not in name else name
    name = f"{name}-{args.target_weights}" if args.target_weights in GGUF_WEIGHTS and "int4" not in name else name
    return f"{name}-own" if args.decoder != DECODER_HF and "own" not in name else name


def load_speed_pair(args, device: str) -> tuple[Pair, bool]:
    """The target, the separate draft (method c's assistant, and the drafter of a/b for --drafter
    model) and, for --drafter eagle or eagle3, the head drafting for a/b on the same target; no EOS stop."""
    def head(pair: Pair):
        folder = args.head or PRESETS[args.preset].own_draft_folder(args.drafter)
        if folder is None or not Path(folder).is_dir():
            raise SystemExit(f"preset {args.preset!r} ships no {args.drafter} head: pass --head DIR")
        return load_head(folder, pair.target) if args.drafter == EAGLE else load_eagle3(folder, pair.target)

    return common.load_bench_pair(args, device, args.dtype, head if args.drafter in HEADS else None)


# ---------------------------------------------------------------- one timed generation per method

class Runner:
    """Runs each method once on one prompt; keeps the traces method a writes."""

    def __init__(self, pair: Pair, preset: str | None, chat: bool, k: int, folder: Path,
                 anchor: "LlamaAnchor | None" = None) -> None:
        self.pair, self.preset, self.chat, self.folder, self.anchor = pair, preset, chat, folder, anchor
        self.assistant = hf.full_vocab_assistant(pair.draft)
        hf.no_eos(pair.target.model)
        hf.no_eos(self.assistant)
        hf.fix_k(self.assistant, k)
        self.traces: list = []
        self.plain_step_s: list[float] = []

    def run(self, method: str, prompt: str, ids: list[int], s: SpecSettings) -> tuple[int, float]:
        pair, device = self.pair, self.pair.target.device
        if method == "a":
            path = self.folder / f"trace-{len(self.traces)}.jsonl"
            self.traces.append(path)
            return timed(lambda: run_to_trace(pair, prompt, s, path, preset=self.preset,
                                              chat_template=self.chat).summary["num_generated"], device)
        if method == "b":
            return timed(lambda: sum(len(r["committed_token_ids"])
                                     for r in speculative_generate(pair, ids, s, record=False)), device)
        if method == ANCHOR:
            return self.anchor.run(ids, s)
        if method in ("c", "d"):
            torch.manual_seed(s.seed)
            assistant = self.assistant if method == "c" else None
            return timed(lambda: len(hf.hf_generate(pair.target.model, ids, s, assistant)), device)
        (n, decode_s), seconds = timed(lambda: plain_decode(pair.target, ids, s, pair.eos_ids), device)
        self.plain_step_s.append(decode_s / n)  # t_step as plain decoding meets it, prefill aside
        return n, seconds


# ---------------------------------------------------------------- the llama.cpp anchor (method f)

class LlamaAnchor:
    """bench/llama_anchor.py running in another Python, kept alive for the whole benchmark: each
    request is timed inside that process, while this one waits on the pipe (no CPU taken)."""

    def __init__(self, python: str, gguf: Path, threads: int) -> None:
        script = Path(__file__).with_name("llama_anchor.py")
        self.proc = subprocess.Popen([python, str(script), str(gguf), str(threads)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready = self.proc.stdout.readline()
        if not ready:
            raise RuntimeError(self.proc.stderr.read().strip().splitlines()[-1:] or "the anchor exited")
        self.info = json.loads(ready)

    def run(self, ids: list[int], s: SpecSettings) -> tuple[int, float]:
        return self.ask({"ids": ids, "max_new_tokens": s.max_new_tokens, "temperature": s.temperature, "seed": s.seed})

    def prompt_seconds(self, ids: list[int]) -> float:
        """The time llama.cpp takes to evaluate `ids` alone (no token decoded)."""
        return self.ask({"ids": ids, "max_new_tokens": 0, "temperature": 0.0, "seed": 0})[1]

    def ask(self, req: dict) -> tuple[int, float]:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:  # the anchor died mid-request (a crash in llama.cpp shows as a negative signal number)
            code = self.proc.wait(timeout=30)
            last = self.proc.stderr.read().strip().splitlines()[-1:] or ["nothing on stderr"]
            raise RuntimeError(f"the llama.cpp anchor exited with code {code} during a request: {last[0]}")
        got = json.loads(line)
        return got["tokens"], got["seconds"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def start_anchor(args, pair: Pair) -> tuple["LlamaAnchor | None", str]:
    """The anchor, or None with the reason it does not run."""
    gguf = pair.target.gguf_file
    if gguf is None:
        return None, "the target has no GGUF file"
    if not args.llama_python:
        return None, "no --llama-python given (bench/build_llama_cpp.sh builds llama-cpp-python)"
    try:
        anchor = LlamaAnchor(args.llama_python, gguf, args.threads)
    except (OSError, RuntimeError, ValueError) as err:
        return None, f"llama-cpp-python did not start: {err}"
    return anchor, f"llama-cpp-python {anchor.info['version']}: {anchor.info['system_info'].strip()}"


# ---------------------------------------------------------------- the weights path and the memory limit

def step_times(pair: Pair, ids: list[int], s: SpecSettings, repeats: int = 15) -> dict:
    """One target decode step on each weights path, round-robin (a slow spell hits both), at the
    calibration's cache length; medians in ms. Only where int4 is loaded (float32 is always there)."""
    from engine.stats.calibrate import context_of_length, time_widths

    target, now = pair.target, pair.target.weights
    context = context_of_length(ids, len(ids) + s.max_new_tokens // 2)
    times: dict[str, list[float]] = {w: [] for w in TARGET_WEIGHTS}
    try:
        for _ in range(repeats):
            for w in TARGET_WEIGHTS:
                target.use_weights(w)
                times[w].append(time_widths(target, context, [1], s, 1, draw=True)[1])
    finally:
        target.use_weights(now)
    med = {w: statistics.median(t) * 1e3 for w, t in times.items()}
    return {"float32_ms": med[WEIGHTS_FLOAT32], "int4_ms": med[WEIGHTS_INT4], "int4_a8_ms": med[WEIGHTS_INT4_A8],
            "speedup": med[WEIGHTS_FLOAT32] / med[WEIGHTS_INT4], "repeats": repeats}


def memory_limit(pair: Pair, device: torch.device) -> dict:
    """Weight bytes one target step reads, over the measured copy bandwidth: the fastest a step can be."""
    from bench.fast_bench import measured_bandwidth_gbs, weight_bytes

    bw = measured_bandwidth_gbs(device, dry_run=False)
    out = {"bandwidth_gbs": bw, "float32_weight_bytes": weight_bytes(pair.target.model)}
    out["float32_floor_ms"] = out["float32_weight_bytes"] / bw / 1e6
    if pair.target.gguf_weights is not None:
        out["int4_weight_bytes"] = pair.target.gguf_weights.weight_bytes
        out["int4_floor_ms"] = out["int4_weight_bytes"] / bw / 1e6
    return out


# ---------------------------------------------------------------- one setting (temperature)

CALIBRATION_REPEATS = 15  # more than the default 7: c and both predictions rest on it


def choose_k(pair: Pair, prompts: list[str], s: SpecSettings, preset: str | None, chat: bool,
             folder: Path) -> dict:
    """The K advisor's pick among K = 1..8 from pilot runs at K=4 on every prompt.

    A short untimed run first, so the pilot's step times are not those of cold first
    calls; alpha and the draft step are pooled over the prompts, verify costs come from
    one calibration.
    """
    list(speculative_generate(pair, encode_prompt(pair.target.tokenizer, prompts[0], chat),
                              replace(s, max_new_tokens=8), record=False))
    # As many repeats as the final calibration: at the default 7, pilots on a 2-core EPYC put the best
    # K's prediction anywhere from 2.06x to 3.00x on one Shakespeare prompt (session 15).
    cal = calibrate(pair, prepare_advised_run(pair, prompts[0], s, chat), s, repeats=CALIBRATION_REPEATS)
    traces = [run_to_trace(pair, p, s, folder / f"pilot-{i}.jsonl", RunMode(calibration=cal if i == 0 else None),
                           preset=preset, chat_template=chat)
              for i, p in enumerate(prompts)]
    cycles = [c for t in traces for c in t.cycles]
    alpha = measured_alpha(cycles)
    times = cycle_times(cycles)
    advice = advise_k(alpha, times.draft_step_s, calibration_of(traces[0].header), list(range(1, 9)),
                      overhead_of(cycles, times))
    best = best_k(advice)
    # With K=0 advised (no K beats plain decoding here) the benchmark still runs the best K, so the
    # prediction it rests on is measured; the results say what the advisor told a user to do.
    return {"k": best.k, "advised_k": advised_k(advice).k, "advice": advice_sentence(advice),
            "pilot_alpha": alpha, "predicted_refined": best.refined,
            "advice_table": [{"k": a.k, "leviathan": a.leviathan, "refined": a.refined} for a in advice]}


def bench_setting(pair: Pair, args, temperature: float, prompts: list[str], chat: bool,
                  anchor: LlamaAnchor | None = None) -> dict:
    preset = args.preset
    base = SpecSettings(k=4, temperature=temperature, max_new_tokens=args.max_new_tokens, seed=0)
    folder = Path(tempfile.mkdtemp(prefix="speclab-bench-"))
    pilot = choose_k(pair, prompts, base, preset, chat, folder) if args.k == "auto" else None
    k = pilot["k"] if pilot else int(args.k)
    s = SpecSettings(k=k, temperature=temperature, max_new_tokens=args.max_new_tokens, seed=0)
    ids = [encode_prompt(pair.target.tokenizer, p, chat) for p in prompts]
    runner = Runner(pair, preset, chat, k, folder, anchor)
    methods = [*METHODS, *([ANCHOR] if anchor else [])]
    for method in methods:  # warm-up: first calls pay for allocations and lazy imports
        runner.run(method, prompts[0], ids[0], s)
    runner.traces.clear()
    runner.plain_step_s.clear()
    rates = common.interleaved_rates(runner.run, methods, prompts, ids, s, args.repeats, f"T={temperature}")
    cal = calibrate(pair, ids[0], s, repeats=CALIBRATION_REPEATS)
    return summarise(rates, runner.traces, statistics.median(runner.plain_step_s), cal, s, pilot)


def summarise(rates: dict, trace_paths: list[Path], t_step: float, cal: dict, s: SpecSettings,
              pilot: dict | None) -> dict:
    """Ratios, alpha, c and both predictions (the refined one with the cycles' measured overhead).
    t_step is the median per-token time of method e's decoding loop, measured interleaved with the
    other methods: on a shared machine a separate calibration drifts by tens of percent between runs,
    and c and both predictions rest on t_step."""
    from engine.trace import load_trace

    traces = [load_trace(p) for p in trace_paths]
    cycles = [c for t in traces for c in t.cycles]
    times = cycle_times(cycles)
    alpha = measured_alpha(cycles)
    c = times.draft_step_s / t_step
    med = {m: statistics.median(r) for m, r in rates.items()}
    ratios = {f"{x}/{y}": common.paired_ratio(rates, x, y)
              for x, y in (("a", "c"), ("a", "d"), ("a", "b"), ("b", "e"), ("e", "d"), ("a", "e"), ("a", "f"),
                           ("e", "f"))}
    # Both predictions divide by t_step, plain decoding's step on the engine's own loop (e), so what
    # they predict is a/e; a/d is the same on the float32 path but not on int4 (d runs float32).
    measured = ratios["a/e"]
    leviathan = predicted_speedup(alpha, s.k, c)
    # at the run's own K the overhead is what its cycles spent, not CycleOverhead's estimate for another K
    refined = refined_speedup(alpha, s.k, t_step, times.draft_step_s, times.verify_s, times.catch_up_s + times.other_s)
    return {
        "temperature": s.temperature, "k": s.k, "max_new_tokens": s.max_new_tokens, "pilot": pilot,
        "tokens_per_s": med, "rates": rates,
        "ratios": ratios,
        "alpha": alpha, "c": c, "calibration": cal,
        "predicted": {"leviathan": leviathan, "refined": refined},
        "measured_speedup": measured, "measured_as": "a/e", "fraction_of_leviathan": measured / leviathan,
        "fraction_of_refined": measured / refined,
        "profile_ms": {"draft_steps": times.draft_s * 1e3, "verify": times.verify_s * 1e3,
                       "catch_up": times.catch_up_s * 1e3, "other": times.other_s * 1e3, "cycle": times.cycle_s * 1e3,
                       "draft_step": times.draft_step_s * 1e3, "target_step": t_step * 1e3,
                       "calibrated_target_step": cal["target_step_s"] * 1e3, "verify_in_steps": times.verify_s / t_step},
        "tracing_overhead": 1 - med["a"] / med["b"],
        "cycles": len(cycles),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    name = results_name(args)
    device = str(pick_device(args.device))
    machine = common.machine_info(args.threads, torch.device(device), None)  # the load before our own work
    pair, chat = load_speed_pair(args, device)
    prompts = common.prompts_for(args.preset, args.prompts)
    anchor, anchor_words = start_anchor(args, pair)
    print(f"llama.cpp anchor: {anchor_words}", flush=True)
    started = time.time()
    settings = []
    try:
        for temperature in (float(t) for t in args.temperatures.split(",")):
            print(f"{name}: temperature {temperature}", flush=True)
            settings.append(bench_setting(pair, args, temperature, prompts, chat, anchor))
    finally:
        if anchor:
            anchor.close()
    first = encode_prompt(pair.target.tokenizer, prompts[0], chat)
    steps = step_times(pair, first, SpecSettings(k=1, temperature=0.0, max_new_tokens=args.max_new_tokens)) \
        if pair.target.weights in GGUF_WEIGHTS else None
    result = {"name": name, "preset": args.preset, "target": pair.target.name, "draft": pair.draft.name,
              "target_weights": pair.target.describe_weights(), "decoder": pair.target.decoder,
              "anchor": anchor_words if anchor else None,
              "anchor_skipped": None if anchor else anchor_words, "step_times": steps,
              "memory_limit": memory_limit(pair, pair.target.device) if pair.target.device.type == "cpu" else None,
              "load_average_1min_end": common.load_average(),
              "drafter": pair.drafter.kind, "drafter_name": pair.drafter.describe()["name"],
              "draft_pruned_vocab": pair.draft.kept_token_ids is not None, "prompts": prompts,
              "repeats": args.repeats, "seeds": list(range(args.repeats)),
              "machine": {**machine, "dtype": str(pair.target.dtype).removeprefix("torch.")},
              "wall_s": time.time() - started,
              "settings": settings, "note": args.note}
    write_reports(result, Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
