"""Goodput against batch size: batched speculation, plain batched decoding (the engine's and Hugging Face's
`generate`), the crossover, and the K advisor per batch size.

    python -m bench.batch [--presets tiny-shakespeare,chat] [--batches 1,2,4,8,16] [--ks 1,2,3,4,5,6]
                          [--requests 16] [--max-new-tokens 32]

Per preset: the first --requests requests of the bundled prompt set (as the chat template renders
them), greedy, so every method commits the same tokens (checked: speculation's rows equal the
engine's plain rows). engine/stats/batch_sweep.py runs them at each batch size B, in batches of B
one after another: plain batched decoding in the engine, then batched speculation at each K, then
the K advisor from this machine's forwards timed at B. This script adds Hugging Face's `generate`
on the same rows, left-padded, greedy. Goodput counts decoding only, for every method: the engine
times its steps after the prompts are read, and `generate`'s decoding is a run of N new tokens less
a run of 1 (its prefill and first token), over the N - 1 tokens between.
Writes bench/results/batch-CPU.json and .md (batch-PRESET-CPU.* when one preset is named).
"""
import argparse
import time
from dataclasses import replace
from pathlib import Path

import torch

from bench.common import RESULTS, cpu_tag, machine_info, machine_words, write_results
from engine.config import SpecSettings
from engine.cycle.reference import speculative_generate
from engine.run import load_preset
from engine.stats.batch_results import BatchSweep, batch_sweep_from_json, batch_sweep_json, crossover_words
from engine.stats.batch_sweep import batch_sweep, chunks
from engine.workload.run import bundled_prompt_ids


@torch.inference_mode()
def hf_generate(pair, prompts: list[list[int]], max_new_tokens: int, b: int) -> tuple[int, float]:
    """Hugging Face's generate on left-padded batches of B, greedy: the tokens each row commits before its
    budget or EOS, and the wall seconds."""
    model, tok = pair.target.model, pair.target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(pair.eos_ids or {0})
    started, tokens = time.perf_counter(), 0
    for rows in chunks(prompts, b):
        width = max(len(p) for p in rows)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in rows])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows])
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=pad, eos_token_id=sorted(pair.eos_ids) or None)
        for row in out[:, width:].tolist():
            ended = next((i + 1 for i, t in enumerate(row) if t in pair.eos_ids), len(row))
            tokens += min(ended, max_new_tokens)
    return tokens, time.perf_counter() - started


def hf_decode_goodput(pair, prompts: list[list[int]], max_new_tokens: int, b: int) -> float:
    """generate's decoding: N new tokens less 1 (the prefill and the first token), per second between."""
    tokens, seconds = hf_generate(pair, prompts, max_new_tokens, b)
    first_tokens, first_s = hf_generate(pair, prompts, 1, b)
    return (tokens - first_tokens) / max(seconds - first_s, 1e-9)


def single_requests(pair, prompts, s) -> float:
    """Decoding tokens/s of the engine's one-request cycle (the reference chain, untraced), request after request."""
    tokens, seconds = 0, 0.0
    for ids in prompts:
        records = list(speculative_generate(pair, ids, s, record=False))
        tokens += sum(len(rec["committed_token_ids"]) for rec in records)
        seconds += sum(rec["cycle_time_s"] for rec in records)
    return tokens / seconds


def one_preset(name: str, batches: list[int], ks: list[int], n: int, max_new_tokens: int, machine: str) -> dict:
    pair = load_preset(name)
    prompts = bundled_prompt_ids(pair, n, SpecSettings(k=max(ks), max_new_tokens=max_new_tokens))
    sweep = batch_sweep(pair, prompts, batches, ks, max_new_tokens, name, machine,
                        on_progress=lambda f, text: print(f"{name}: {text}", flush=True))
    sweep = replace(sweep, sizes=[replace(size, hf_generate=hf_decode_goodput(pair, prompts, max_new_tokens, size.batch))
                                  for size in sweep.sizes])
    single = single_requests(pair, prompts, SpecSettings(k=4, temperature=0.0, max_new_tokens=max_new_tokens))
    return batch_sweep_json(sweep) | {"single_request_k4": single}


def table(p: dict, sweep: BatchSweep) -> list[str]:
    b1 = next((s for s in sweep.sizes if s.batch == 1 and 4 in s.speculative), None)
    lines = [f"### {sweep.preset}: {sweep.requests} requests, {sweep.max_new_tokens} tokens each, greedy; "
             f"alpha {sweep.alpha:.3f} (B = 1, K = 4); {crossover_words(sweep)}", ""]
    if b1 is not None:
        lines += [f"At B = 1 and K = 4 the batched cycle decoded {b1.speculative[4]:.1f} tokens/s, the one-request "
                  f"cycle {p['single_request_k4']:.1f} ({b1.speculative[4] / p['single_request_k4']:.2f}x).", ""]
    lines += ["Goodput: committed tokens per second of decoding, over all rows (prefill left out of every method).", "",
              "| B | plain, engine tok/s | HF generate tok/s | engine / HF | best K | speculating tok/s | "
              "best / plain | acceptance at K=" + ",".join(map(str, sorted(sweep.sizes[0].speculative))) +
              " | advised K | advised / best | prefill s |",
              "|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for s in sweep.sizes:
        acc = " ".join(f"{s.acceptance_rate[k]:.2f}" for k in sorted(s.acceptance_rate))
        lines.append(f"| {s.batch} | {s.plain:.1f} | {s.hf_generate:.1f} | {s.plain / s.hf_generate:.2f} | "
                     f"{s.best_k} | {s.speculative[s.best_k]:.1f} | {s.best_speedup:.2f} | {acc} | "
                     f"{s.advised_k or 'plain'} | {s.advised_over_best:.2f} | {s.prefill_s:.2f} |")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--presets", default="tiny-shakespeare,chat")
    p.add_argument("--batches", default="1,2,4,8,16")
    p.add_argument("--ks", default="1,2,3,4,5,6")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    machine = machine_info(torch.get_num_threads())
    batches, ks = [int(b) for b in args.batches.split(",")], [int(k) for k in args.ks.split(",")]
    names = args.presets.split(",")
    presets = [one_preset(name, batches, ks, args.requests, args.max_new_tokens, str(machine.get("cpu", "")))
               for name in names]
    text = "\n".join(["## Goodput against batch size (bench/batch.py)", f"Machine: {machine_words(machine)}", "",
                      *[line for preset in presets  # each read back as the app reads it
                        for line in [*table(preset, batch_sweep_from_json(preset)), ""]]])
    stem = f"batch-{names[0]}-{cpu_tag(machine)}" if len(names) == 1 else f"batch-{cpu_tag(machine)}"
    write_results(Path(args.out), stem, {"machine": machine, "presets": presets}, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
