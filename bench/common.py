"""What the benchmarks share: the prompts they time, the clock, the pair they load, the interleaved
repeat loop and its paired ratios, the machine they ran on, and the writing of their results.

Timing goes through engine.models.device.timed, the project's one clock (it waits for the
device's queued work before reading the time); `timed_alone` also waits for the work queued
before the call, so a timing never pays for the previous one.
"""
import argparse
import json
import os
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, TypeVar

import torch
import transformers

from engine.cycle.pair import Pair
from engine.drafters.base import Drafter
from engine.models.device import sync, timed
from engine.models.machine import cpu_features, cpu_model, load_average
from engine.models.presets import PRESETS
from engine.run import encode_prompt, load_pair, load_preset, settle_linear_paths
from engine.trace.schema import DECODER_HF, DECODERS, TARGET_WEIGHTS, WEIGHTS_FLOAT32

T = TypeVar("T")

RESULTS = Path(__file__).resolve().parent / "results"

# The prompts a speed benchmark times, per preset; "custom" for a --target/--draft pair.
PROMPTS = {
    "chat": ["Explain why the sky is blue in two sentences.", "What is a good way to learn to cook?",
             "Give me three tips for a job interview."],
    "tiny-shakespeare": ["Romeo.\n", "King Henry.\nWhat say you", "Enter a Messenger.\n"],
    "custom": ["the cat sat on", "the dog ran", "a cat"],
}


def prompts_for(preset: str | None, count: int) -> list[str]:
    """The first `count` prompts of a preset (the custom ones for a --target/--draft pair)."""
    return PROMPTS.get(preset or "custom", PROMPTS["custom"])[:count]


# ---------------------------------------------------------------- the clock

def timed_alone(fn: Callable[[], T], device: torch.device) -> tuple[T, float]:
    """engine.models.device.timed after the device has finished what was queued before the call."""
    sync(device)
    return timed(fn, device)


# ---------------------------------------------------------------- the pair

def add_pair_arguments(p: argparse.ArgumentParser) -> None:
    """--preset, or --target and --draft (checked by `check_pair_arguments`)."""
    p.add_argument("--preset", choices=sorted(PRESETS))
    p.add_argument("--target"), p.add_argument("--draft")


def check_pair_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if bool(args.preset) == bool(args.target and args.draft):
        p.error("give --preset, or both --target and --draft")


def add_fast_cpu_arguments(p: argparse.ArgumentParser) -> None:
    """The pair and the settings a benchmark of the CPU fast path runs under (`load_fast_cpu_pair`)."""
    add_pair_arguments(p)
    p.add_argument("--capture", choices=("none", "compile"), default="compile")
    p.add_argument("--decoder", choices=DECODERS, default=DECODER_HF)
    p.add_argument("--target-weights", choices=TARGET_WEIGHTS, default=WEIGHTS_FLOAT32)
    p.add_argument("--threads", type=int, default=None)


def load_fast_cpu_pair(args: argparse.Namespace, prompts: int) -> tuple[Pair, list[str], list[list[int]]]:
    """The pair on the CPU (--threads set first) on the linear paths this machine measured faster, as a run
    settles them before it builds its forwards, and the first `prompts` prompts, encoded."""
    if args.threads:
        torch.set_num_threads(args.threads)
    pair, chat = load_bench_pair(args, "cpu", None)
    settle_linear_paths(pair)
    texts = prompts_for(args.preset, prompts)
    return pair, texts, [encode_prompt(pair.target.tokenizer, t, chat) for t in texts]


def load_bench_pair(args: argparse.Namespace, device: str, dtype: str | None,
                    drafter: Callable[[Pair], Drafter] | None = None) -> tuple[Pair, bool]:
    """The preset's pair (or --target/--draft) with no EOS stop, so every method makes max_new_tokens
    tokens, and whether prompts go through the chat template. `drafter(pair)`, when given, makes
    the drafter on the loaded target (else the separate draft model drafts)."""
    weights = getattr(args, "target_weights", WEIGHTS_FLOAT32)
    decoder = getattr(args, "decoder", DECODER_HF)
    if args.preset:
        pair = load_preset(args.preset, device, dtype, target_weights=weights, decoder=decoder)
        chat = PRESETS[args.preset].use_chat_template
    else:
        pair = load_pair(args.target, args.draft, device, dtype_name=dtype, target_weights=weights, decoder=decoder)
        chat = False
    return Pair(pair.target, pair.draft, set(), drafter(pair) if drafter else None), chat


# ---------------------------------------------------------------- repeats and ratios

def interleaved_rates(run: Callable, methods: list[str], prompts: list[str], ids: list[list[int]], s, repeats: int,
                      label: str) -> dict[str, list[float]]:
    """tokens/s per method and repeat: every repeat runs every method on every prompt, interleaved so
    drift spreads evenly, with the repeat's seed shared by all methods; a rate is tokens over time
    summed over the prompts. `run(method, prompt, prompt_ids, settings)` returns (tokens, seconds)."""
    rates = {m: [] for m in methods}
    for repeat in range(repeats):
        totals = {m: [0, 0.0] for m in methods}
        seeded = replace(s, seed=repeat)
        for prompt, prompt_ids in zip(prompts, ids):
            for method in methods:
                n, t = run(method, prompt, prompt_ids, seeded)
                assert n == s.max_new_tokens, f"method {method} generated {n} tokens, not {s.max_new_tokens}"
                totals[method][0] += n
                totals[method][1] += t
        for m, (n, t) in totals.items():
            rates[m].append(n / t)
        print(f"  {label} repeat {repeat + 1}: " + "  ".join(f"{m} {rates[m][-1]:.1f}/s" for m in methods), flush=True)
    return rates


def paired_ratio(rates: dict, x: str, y: str) -> float | None:
    """Median over repeats of rate x / rate y within the same repeat: the methods ran
    interleaved, so a slow spell of the machine hits both sides of each ratio. None when
    either method did not run."""
    if x not in rates or y not in rates:
        return None
    return statistics.median(a / b for a, b in zip(rates[x], rates[y]))


# ---------------------------------------------------------------- the machine and the results

def machine_info(threads: int, device: torch.device | None = None, dtype: torch.dtype | None = None) -> dict:
    gpu = torch.cuda.get_device_name(device) if device is not None and device.type == "cuda" else None
    return {"cpu": cpu_model(), "cpu_features": cpu_features(), "cores": os.cpu_count(), "torch_threads": threads,
            "load_average_1min": load_average(), "os": platform.platform(),
            "device": str(device) if device is not None else "cpu", "gpu": gpu,
            "dtype": str(dtype).removeprefix("torch.") if dtype is not None else None,
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def machine_words(m: dict) -> str:
    """The machine line every results file opens with: CPU model, vector features, cores, threads, load.
    Results taken before the features and load were recorded say so."""
    features = ", ".join(m["cpu_features"]) if m.get("cpu_features") else (
        "no AVX2" if "cpu_features" in m else "features not recorded")
    load = m.get("load_average_1min")
    load_words = f"1-minute load {load} at the start" if load is not None else "load not recorded"
    threads = f", {m['torch_threads']} torch threads" if m.get("torch_threads") else ""
    return f"{m['cpu']} ({features}), {m['cores']} cores{threads}; {load_words}"


def cpu_tag(m: dict) -> str:
    """A short name of the CPU for result files: its vendor and family, and its widest vector feature
    (the same model name covers Xeons with and without AMX, and the kernels differ)."""
    name = m["cpu"].lower()
    family = next((f for f in ("epyc", "xeon", "ryzen", "core") if f in name), "cpu")
    vendor = "amd" if "amd" in name else "intel" if "intel" in name else ""
    features = m.get("cpu_features") or []
    widest = next((f.split("_")[0] for f in ("amx_tile", "avx512f", "avx2") if f in features), "")
    return "-".join(p for p in (vendor, family, widest.removesuffix("f")) if p)


def write_results(folder: Path, stem: str, result: dict, text: str, indent: int = 1, json_end: str = "") -> None:
    """FOLDER/STEM.json (the result) and FOLDER/STEM.md (`text`), the folder made if missing."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.json").write_text(json.dumps(result, indent=indent) + json_end)
    (folder / f"{stem}.md").write_text(text)
