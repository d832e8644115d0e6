"""Prompt lookup benchmark: our engine against Hugging Face, on input-grounded prompts.

    python -m bench.prompt_lookup                     # chat preset, CPU, T=0 and T=1
    python -m bench.prompt_lookup --repeats 5 --max-new-tokens 96

Prompts contain the text the answer should reuse (rewrite, fix, repeat back), where
prompt lookup pays off. Methods, each generating up to --max-new-tokens tokens from the
same prompt ids (no EOS stop, so every method makes the same number of tokens):
  a  our engine with the prompt-lookup drafter, tracing on (run_to_trace writes a trace file)
  c  HF generate(prompt_lookup_num_tokens=K, max_matching_ngram_size=N)
  d  HF plain generate
Repeats are interleaved (every method on every prompt, then the next repeat) so drift
on a shared machine spreads over all methods; each repeat has its own seed shared by
all methods. A rate is tokens / time summed over the prompts; ratios are medians over
repeats of the ratio within a repeat, with their min and max. Results go to
bench/results/prompt-lookup-chat.json and .md.

HF's prompt lookup is greedy-only in the versions this project supports (it raises
or falls back when sampling); its T=1 row is reported as not run if HF refuses.
"""
import argparse
import json
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path

import torch

from bench import hf
from bench.common import RESULTS, machine_info, machine_words, write_results
from engine.config import SpecSettings
from engine.cycle.pair import Pair
from engine.drafters.registry import DrafterOptions
from engine.models.device import timed
from engine.run import encode_prompt, load_preset, run_to_trace
from engine.trace import load_trace
from engine.trace.schema import PROMPT_LOOKUP

PROMPTS = [
    "Fix the spelling in this paragraph and write it out again: The quick brown fox jumpd over the lazy dog. "
    "The dog was not amused and barked at the fox untill it ran away into the forest.",
    "Rewrite this code with the bug fixed:\ndef total(xs):\n    s = 0\n    for x in xs:\n        s = x\n    return s\n",
    "Repeat this list, adding a full stop at the end of each line:\n- buy milk\n- call the bank\n"
    "- water the plants\n- book a table for four\n- send the report to Anna",
]
METHOD_NOTE = "Methods are interleaved and paired per repeat; the spread (min-max over repeats) is reported."


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--max-ngram", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS / "prompt-lookup-chat")
    p.add_argument("--note", default="", help="conditions of the run (e.g. a machine shared with other jobs)")
    return p.parse_args(argv)


def run_engine(pair: Pair, prompt: str, s: SpecSettings, folder: Path) -> int:
    trace = run_to_trace(pair, prompt, s, folder / "bench.jsonl", preset="chat")
    return trace.summary["num_generated"]


def run_hf(pair: Pair, ids: list[int], s: SpecSettings, lookup: dict | None) -> int:
    gen_config = hf.generation_config(s)
    if lookup:
        gen_config.prompt_lookup_num_tokens = lookup["k"]
        gen_config.max_matching_ngram_size = lookup["max_ngram"]
    x = torch.tensor([ids])
    with torch.inference_mode():
        out = pair.target.model.generate(input_ids=x, attention_mask=torch.ones_like(x), generation_config=gen_config)
    return out.shape[1] - len(ids)


def run_method(method: str, pair: Pair, prompt: str, ids: list[int], s: SpecSettings, args, folder: Path) -> int:
    """Tokens made by one method on one prompt: a (our engine), c (HF prompt lookup) or d (HF plain)."""
    if method == "a":
        return run_engine(pair, prompt, s, folder)
    return run_hf(pair, ids, s, {"k": args.k, "max_ngram": args.max_ngram} if method == "c" else None)


def bench_temperature(pair: Pair, args, temperature: float, folder: Path) -> dict:
    prompts = [(p, encode_prompt(pair.target.tokenizer, p, True)) for p in PROMPTS]
    rates: dict[str, list[float]] = {"a": [], "c": [], "d": []}
    errors: dict[str, str] = {}
    acceptance = []
    for r in range(args.repeats + 1):  # repeat 0 warms up and is not kept
        totals = {m: [0, 0.0] for m in rates}
        for prompt, ids in prompts:
            s = SpecSettings(k=args.k, temperature=temperature, seed=r, max_new_tokens=args.max_new_tokens)
            for m in rates:
                if m in errors:
                    continue
                torch.manual_seed(r)
                try:
                    n, t = timed(partial(run_method, m, pair, prompt, ids, s, args, folder))
                except (ValueError, RuntimeError) as err:  # e.g. HF refusing prompt lookup with sampling
                    errors[m] = f"{type(err).__name__}: {err}"[:300]
                    continue
                totals[m][0] += n
                totals[m][1] += t
                if m == "a" and r:
                    acceptance.append(load_trace(folder / "bench.jsonl").summary["acceptance_rate"])
        if r:
            for m, (n, t) in totals.items():
                if m not in errors and t > 0:
                    rates[m].append(n / t)
    result = {"temperature": temperature, "rates_tokens_per_s": rates, "errors": errors,
              "engine_acceptance_rate_median": statistics.median(acceptance) if acceptance else None}
    for x, y in (("a", "d"), ("a", "c")):
        if rates[x] and rates[y] and len(rates[x]) == len(rates[y]):
            ratios = [a / b for a, b in zip(rates[x], rates[y])]
            result[f"{x}/{y}"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
    return result


def report(results: list[dict], args, machine: dict) -> str:
    lines = ["# Prompt lookup on the chat preset (CPU)", "",
             f"Machine: {machine_words(machine)}; torch {machine['torch']}, transformers {machine['transformers']}; "
             f"{machine['date']}.", "", f"{args.note} {METHOD_NOTE}".strip(), "",
             f"K={args.k}, max n-gram {args.max_ngram}, {args.max_new_tokens} new tokens, {len(PROMPTS)} input-grounded "
             f"prompts, {args.repeats} repeats, {args.threads} threads.", "",
             "| T | a engine (tok/s) | c HF prompt lookup | d HF plain | a/d (min-max) | a/c (min-max) | engine acceptance |",
             "|---|---|---|---|---|---|---|"]
    for res in results:
        med = {m: (f"{statistics.median(v):.2f}" if v else "not run") for m, v in res["rates_tokens_per_s"].items()}
        ratio = {key: (f"{res[key]['median']:.2f} ({res[key]['min']:.2f}-{res[key]['max']:.2f})" if key in res else "-")
                 for key in ("a/d", "a/c")}
        acc = res["engine_acceptance_rate_median"]
        lines.append(f"| {res['temperature']} | {med['a']} | {med['c']} | {med['d']} | {ratio['a/d']} | {ratio['a/c']} | "
                     f"{'-' if acc is None else f'{acc:.2f}'} |")
        for m, err in res["errors"].items():
            lines.append(f"\nT={res['temperature']}, method {m} not run: {err}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    machine = machine_info(args.threads)  # before the runs: the load it records is the one they started under
    torch.set_num_threads(args.threads)
    pair = load_preset("chat", "cpu", drafter=DrafterOptions(PROMPT_LOOKUP, max_ngram=args.max_ngram))
    hf.no_eos(pair.target.model)
    pair.eos_ids = set()  # no EOS stop: every method makes max_new_tokens tokens
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for t in (float(x) for x in args.temperatures.split(",")):
            results.append(bench_temperature(pair, args, t, Path(tmp)))
            print(json.dumps(results[-1], indent=1), flush=True)
            save_results(results, args, machine)  # after each temperature: a stopped run keeps what it measured
    print(report(results, args, machine))
    return 0


def save_results(results: list[dict], args, machine: dict) -> None:
    payload = {"note": f"{args.note} {METHOD_NOTE}".strip(), "machine": machine,
               "settings": {k: str(v) for k, v in vars(args).items()},
               "prompts": PROMPTS, "results": results}
    write_results(args.out.parent, args.out.with_suffix("").name, payload, report(results, args, machine),
                  indent=2, json_end="\n")


if __name__ == "__main__":
    sys.exit(main())
