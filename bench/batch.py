"""Goodput against batch size: batched speculation, plain batched decoding (the engine's and Hugging Face's
`generate`), the crossover, and the K advisor per batch size.

    python -m bench.batch [--presets tiny-shakespeare,chat] [--batches 1,2,4,8,16] [--ks 1,2,3,4,5,6]
                          [--requests 16] [--max-new-tokens 16]

Per preset: the first --requests requests of the bundled prompt set (as the chat template renders
them), greedy, so every method commits the same tokens (checked: speculation's rows equal the
engine's plain rows). At each batch size B the requests run in batches of B, one batch after
another, by each method in turn:
- plain batched decoding in the engine (engine/batch/plain.py): one target forward per step for all rows;
- Hugging Face's `generate` on the same rows, left-padded, greedy; its tokens are counted up to each
  row's budget or EOS (it keeps stepping finished rows, as the engine does);
- batched speculation (engine/batch/cycle.py) at each K.
Goodput: committed tokens over all rows per second of wall time. Then the K advisor per batch size
(engine/stats/batch_plan.py): this machine's forwards timed at B, the acceptance measured at B = 1
and K = 4, and the K it picks (0: decode plainly), set against the best K measured. Writes
bench/results/batch-CPU.json and .md (batch-PRESET-CPU.* when one preset is named).
"""
import argparse
import time
from dataclasses import replace
from pathlib import Path
from statistics import median

import torch

from bench.common import RESULTS, cpu_tag, machine_info, machine_words, write_results
from engine.batch.cycle import batched_generate
from engine.batch.plain import batched_plain_generate
from engine.cli_diagnose import PROMPT_SET
from engine.config import SpecSettings
from engine.cycle.reference import speculative_generate
from engine.run import encode_prompt, load_preset
from engine.stats.batch_plan import PLAIN_K, advise_batch_k, measure_batch_costs
from engine.workload.prompts import read_prompts


def chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def plain_engine(pair, prompts, s, b) -> tuple[list[list[int]], float]:
    started, outputs = time.perf_counter(), []
    for rows in chunks(prompts, b):
        outputs += batched_plain_generate(pair.target, rows, s, list(range(len(rows))), pair.eos_ids).outputs
    return outputs, time.perf_counter() - started


@torch.inference_mode()
def hf_generate(pair, prompts, s, b) -> tuple[int, float]:
    """Hugging Face's generate on left-padded batches; the tokens each row commits before its budget or EOS."""
    model, tok = pair.target.model, pair.target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(pair.eos_ids or {0})
    started, tokens = time.perf_counter(), 0
    for rows in chunks(prompts, b):
        width = max(len(p) for p in rows)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in rows])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows])
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=s.max_new_tokens, do_sample=False,
                             pad_token_id=pad, eos_token_id=sorted(pair.eos_ids) or None)
        for row in out[:, width:].tolist():
            ended = next((i + 1 for i, t in enumerate(row) if t in pair.eos_ids), len(row))
            tokens += min(ended, s.max_new_tokens)
    return tokens, time.perf_counter() - started


def speculative(pair, prompts, s, b) -> dict:
    started, outputs, cycles = time.perf_counter(), [], []
    for rows in chunks(prompts, b):
        out, batch_cycles = batched_generate(pair, rows, s, list(range(len(rows))))
        outputs += out
        cycles += batch_cycles
    seconds = time.perf_counter() - started
    tested = [r for c in cycles for r in c.rows if not r.idle]
    accepted = sum(r.num_accepted for r in tested)
    rejections = sum(r.num_accepted < s.k for r in tested)
    return {"outputs": outputs, "seconds": seconds, "acceptance_rate": accepted / (s.k * len(tested)),
            "alpha": accepted / (accepted + rejections) if accepted + rejections else 0.0,
            "other_s": median(c.bookkeeping_s for c in cycles)}


def single_requests(pair, prompts, s) -> float:
    """Tokens/s of the engine's one-request cycle (the reference chain, untraced), request after request."""
    started, tokens = time.perf_counter(), 0
    for ids in prompts:
        tokens += sum(len(rec["committed_token_ids"]) for rec in speculative_generate(pair, ids, s, record=False))
    return tokens / (time.perf_counter() - started)


def one_batch_size(pair, prompts, s, b, ks, alpha) -> dict:
    plain_outputs, plain_s = plain_engine(pair, prompts, s, b)
    tokens = sum(len(o) for o in plain_outputs)
    hf_tokens, hf_s = hf_generate(pair, prompts, s, b)
    row = {"batch": b, "tokens": tokens, "plain_engine": tokens / plain_s, "hf_generate": hf_tokens / hf_s,
           "speculative": {}, "acceptance_rate": {}}
    other = []
    for k in ks:
        spec = speculative(pair, prompts, SpecSettings(k=k, temperature=0.0, max_new_tokens=s.max_new_tokens), b)
        if spec["outputs"] != plain_outputs:
            raise AssertionError(f"B={b} K={k}: speculation's rows differ from plain greedy decoding")
        row["speculative"][k] = tokens / spec["seconds"]
        row["acceptance_rate"][k] = spec["acceptance_rate"]
        other.append(spec["other_s"])
    costs = measure_batch_costs(pair, prompts[:b], [k + 1 for k in ks])
    costs = replace(costs, other_s=median(other))  # the run's per-cycle bookkeeping
    advised = advise_batch_k(alpha, costs)
    best_k = max(ks, key=lambda k: row["speculative"][k])
    best = max(row["speculative"][best_k], row["plain_engine"])
    got = row["plain_engine"] if advised == PLAIN_K else row["speculative"][advised]
    return row | {"best_k": best_k, "best_speedup": row["speculative"][best_k] / row["plain_engine"],
                  "advised_k": advised, "advised_over_best": got / best,
                  "predicted": {k: costs.goodput(alpha, k) for k in ks} | {"plain": costs.plain_goodput()},
                  "engine_over_hf": row["plain_engine"] / row["hf_generate"]}


def one_preset(name: str, batches: list[int], ks: list[int], n: int, max_new_tokens: int) -> dict:
    pair = load_preset(name)
    chat = bool(getattr(pair.target.tokenizer, "chat_template", None))
    requests = read_prompts(PROMPT_SET)[:n]
    prompts = [encode_prompt(pair.target.tokenizer, r.text, chat, r.messages) for r in requests]
    s = SpecSettings(k=4, temperature=0.0, max_new_tokens=max_new_tokens)
    speculative(pair, prompts[:2], s, 2)  # one-off costs before anything is timed
    pilot = speculative(pair, prompts, s, 1)
    single = single_requests(pair, prompts, s)
    batched_one = len([t for o in pilot["outputs"] for t in o]) / pilot["seconds"]
    rows = [one_batch_size(pair, prompts, s, b, ks, pilot["alpha"]) for b in batches]
    crossover = next((r["batch"] for r in rows if r["best_speedup"] < 1.0), None)
    return {"preset": name, "requests": len(prompts), "max_new_tokens": max_new_tokens, "alpha_at_b1_k4": pilot["alpha"],
            "rows": rows, "crossover_batch": crossover, "single_request_k4": single, "batched_b1_k4": batched_one,
            "batched_b1_over_single": batched_one / single}


def crossover_words(p: dict) -> str:
    first = p["rows"][0]["batch"] if p["rows"] else None
    if p["crossover_batch"] is None:
        return "speculation pays at every batch size measured"
    if p["crossover_batch"] == first:
        return f"speculation does not pay even at B = {first}: no K beats plain decoding here"
    return f"speculation stops paying at B = {p['crossover_batch']}"


def table(p: dict) -> list[str]:
    lines = [f"### {p['preset']}: {p['requests']} requests, {p['max_new_tokens']} tokens each, greedy; "
             f"alpha {p['alpha_at_b1_k4']:.3f} (B = 1, K = 4); {crossover_words(p)}", "",
             f"At B = 1 and K = 4 the batched cycle ran {p['batched_b1_k4']:.1f} tokens/s, the one-request cycle "
             f"{p['single_request_k4']:.1f} ({p['batched_b1_over_single']:.2f}x).", "",
             "| B | plain, engine tok/s | HF generate tok/s | engine / HF | best K | speculating tok/s | "
             "best / plain | acceptance at K=1..max | advised K | advised / best |",
             "|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for r in p["rows"]:
        acc = " ".join(f"{a:.2f}" for a in r["acceptance_rate"].values())
        lines.append(f"| {r['batch']} | {r['plain_engine']:.1f} | {r['hf_generate']:.1f} | {r['engine_over_hf']:.2f} | "
                     f"{r['best_k']} | {r['speculative'][r['best_k']]:.1f} | {r['best_speedup']:.2f} | {acc} | "
                     f"{r['advised_k'] or 'plain'} | {r['advised_over_best']:.2f} |")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--presets", default="tiny-shakespeare,chat")
    p.add_argument("--batches", default="1,2,4,8,16")
    p.add_argument("--ks", default="1,2,3,4,5,6")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    machine = machine_info(torch.get_num_threads())
    batches, ks = [int(b) for b in args.batches.split(",")], [int(k) for k in args.ks.split(",")]
    presets = [one_preset(name, batches, ks, args.requests, args.max_new_tokens) for name in args.presets.split(",")]
    text = "\n".join(["## Goodput against batch size (bench/batch.py)", f"Machine: {machine_words(machine)}", "",
                      *[line for preset in presets for line in [*table(preset), ""]]])
    names = args.presets.split(",")
    stem = f"batch-{names[0]}-{cpu_tag(machine)}" if len(names) == 1 else f"batch-{cpu_tag(machine)}"
    write_results(Path(args.out), stem, {"machine": machine, "presets": presets}, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
