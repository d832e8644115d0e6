"""The engine's cycle loop, timed in one process: batched speculation at B = 1, 4 and 16 and the one-request
chain traced and untraced, on tiny-shakespeare (whose forwards are cheap, so Python in the loop shows most).

    python bench/hot_loop.py --out FOLDER [--repeats 5]

It imports only the engine's long-standing entry points (load_preset, bundled_prompt_ids, batched_generate,
speculative_generate, run_to_trace), so bench/ab_trees.py can run this file against an older checkout put first
on the import path. Each figure is tokens over the cycles' own times (the loop's work, prefill left out),
its median over --repeats after one warm-up, and goes to FOLDER/hot-loop.json.
"""
import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

from engine.batch.cycle import batched_generate
from engine.config import SpecSettings
from engine.cycle.reference import speculative_generate
from engine.run import load_preset, run_to_trace
from engine.workload.run import bundled_prompt_ids

BATCHES = (1, 4, 16)
PROMPT = "ROMEO:\nWhat light through yonder window breaks?\n"


def batched_goodput(pair, prompts: list[list[int]], s: SpecSettings, b: int) -> float:
    """Committed tokens per second of the batched cycles, B requests at a time."""
    tokens, seconds = 0, 0.0
    for i in range(0, len(prompts), b):
        rows = prompts[i:i + b]
        outputs, cycles = batched_generate(pair, rows, s, list(range(len(rows))))
        tokens += sum(len(o) for o in outputs)
        seconds += sum(c.cycle_s for c in cycles)
    return tokens / seconds


def chain_rate(pair, prompts: list[list[int]], s: SpecSettings) -> float:
    records = [r for ids in prompts for r in speculative_generate(pair, ids, s, record=False)]
    return sum(len(r["committed_token_ids"]) for r in records) / sum(r["cycle_time_s"] for r in records)


def traced_rate(pair, s: SpecSettings, folder: Path) -> float:
    trace = run_to_trace(pair, PROMPT, s, folder / "t.jsonl", chat_template=False)
    return sum(len(c["committed_token_ids"]) for c in trace.cycles) / sum(c["cycle_time_s"] for c in trace.cycles)


def measure(repeats: int) -> dict[str, float]:
    torch.set_num_threads(2)
    pair = load_preset("tiny-shakespeare")
    greedy = SpecSettings(k=4, temperature=0.0, max_new_tokens=32)
    prompts = bundled_prompt_ids(pair, 16, greedy)
    sampled = SpecSettings(k=4, temperature=1.0, max_new_tokens=64)
    runs = {f"batch B={b} K=4": (lambda b=b: batched_goodput(pair, prompts, greedy, b)) for b in BATCHES}
    runs["chain untraced T=0"] = lambda: chain_rate(pair, prompts[:3], SpecSettings(k=4, temperature=0.0,
                                                                                      max_new_tokens=64))
    runs["chain untraced T=1"] = lambda: chain_rate(pair, prompts[:3], sampled)
    with tempfile.TemporaryDirectory() as tmp:
        runs["chain traced T=1"] = lambda: traced_rate(pair, sampled, Path(tmp))
        for run in runs.values():
            run()  # warm-up: kernels and paths settled for these shapes
        samples: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(repeats):  # interleaved, so drift spreads over every figure
            for name, run in runs.items():
                samples[name].append(run())
    return {name: statistics.median(values) for name, values in samples.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "hot-loop.json").write_text(json.dumps(measure(args.repeats), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
