"""Suffix decoding against prompt lookup and plain decoding, over prompt sets of one session each.

    python -m bench.suffix_vs_lookup                   # both presets, both prompt sets, T=0
    python -m bench.suffix_vs_lookup --quick           # a smoke run: a few requests, few tokens
    python -m bench.suffix_vs_lookup --presets chat --max-new-tokens 96

Each prompt set runs as one session, request after request, as an agent or a server sees them:
the suffix drafter is built fresh for the set and its global tree (earlier requests' outputs) grows
over the set's requests, so later requests draft from earlier answers; prompt lookup sees only the
request in hand. The sets: the bundled `categories.jsonl` (varied requests) and `agentic.jsonl`
(templated tool calls, SQL and JSON extraction, whose answers share structure). Per request the
three methods run back to back (plain, prompt lookup, suffix), so drift on the machine spreads over
all three. Greedy by default (T=0): every method must produce the same tokens, which is checked.

Per preset, set and method: tokens/s, speed-up over plain, mean acceptance length (1 + accepted /
drafts, vLLM V1), draft acceptance rate, the share of cycles that drafted, and for suffix decoding
the share of drafts from the global tree. One pass, no repeats: read the speed-ups with the
machine's load in mind (the results file records it). Results go to
bench/results/suffix-vs-lookup-<cpu>.md and .json (`--quick`: suffix-vs-lookup-quick-<cpu>).
"""
import argparse
import sys
import time
from pathlib import Path

import torch

from bench.common import RESULTS, cpu_tag, machine_info, machine_words, write_results
from engine.config import SpecSettings
from engine.cycle.pair import Pair
from engine.cycle.plain import target_generate
from engine.cycle.reference import speculative_generate
from engine.drafters.registry import DrafterOptions, build_drafter
from engine.models.presets import PRESETS
from engine.run import check_prompt_fits, encode_prompt, load_preset
from engine.trace.schema import PROMPT_LOOKUP, SUFFIX, SUFFIX_GLOBAL
from engine.workload.prompts import BUNDLED_PROMPT_SET, read_prompts

AGENTIC = BUNDLED_PROMPT_SET.parent / "agentic.jsonl"
METHODS = ("plain", PROMPT_LOOKUP, SUFFIX)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="tiny-shakespeare,chat")
    p.add_argument("--prompt-sets", default=f"{BUNDLED_PROMPT_SET},{AGENTIC}")
    p.add_argument("--requests", type=int, default=0, help="the first N requests of each set (0: all)")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="tiny-shakespeare, 4 requests a set, 16 tokens: does it run?")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--note", default="", help="conditions of the run (e.g. a machine shared with other jobs)")
    p.add_argument("--name", default="", help="appended to the results' name (a second run, other options)")
    p.add_argument("--suffix-min-prob", type=float, default=DrafterOptions().suffix_min_prob,
                   help="suffix decoding's pruning threshold (vLLM's default 0.1)")
    p.add_argument("--suffix-cached-requests", type=int, default=DrafterOptions().suffix_cached_requests,
                   help="earlier outputs the global tree keeps (vLLM's default 10,000; 0: the request's own tree only)")
    args = p.parse_args(argv)
    if args.quick:
        args.presets, args.requests, args.max_new_tokens = "tiny-shakespeare", 4, 16
    return args


def fresh_suffix(lookup: Pair, args) -> Pair:
    """A suffix drafter over the prompt-lookup pair's target, its global tree empty: one per session."""
    options = DrafterOptions(SUFFIX, suffix_min_prob=args.suffix_min_prob,
                             suffix_cached_requests=args.suffix_cached_requests)
    drafter = build_drafter(lookup.target, options, lambda folder: None)
    return Pair(lookup.target, None, lookup.eos_ids, drafter)


def run_speculative(pair: Pair, ids: list[int], s: SpecSettings) -> tuple[list[int], float, list[dict]]:
    start = time.perf_counter()
    records = list(speculative_generate(pair, ids, s, record=False))
    return [t for r in records for t in r["committed_token_ids"]], time.perf_counter() - start, records


def run_plain(pair: Pair, ids: list[int], s: SpecSettings) -> tuple[list[int], float, list[dict]]:
    start = time.perf_counter()
    tokens = target_generate(pair.target, ids, s, pair.eos_ids)
    return tokens, time.perf_counter() - start, []


def empty_tally() -> dict:
    return {"requests": 0, "tokens": 0, "seconds": 0.0, "cycles": 0, "drafts": 0, "drafted": 0, "accepted": 0,
            "global_drafts": 0}


def add_run(tally: dict, tokens: list[int], seconds: float, records: list[dict]) -> None:
    drafting = [r for r in records if r.get("draft_token_ids")]
    tally["requests"] += 1
    tally["tokens"] += len(tokens)
    tally["seconds"] += seconds
    tally["cycles"] += len(records)
    tally["drafts"] += len(drafting)
    tally["drafted"] += sum(len(r["draft_token_ids"]) for r in drafting)
    tally["accepted"] += sum(r["num_accepted"] for r in records)
    tally["global_drafts"] += sum(r.get("drafter_state", {}).get("source") == SUFFIX_GLOBAL for r in drafting)


def run_set(lookup: Pair, preset: str, path: Path, args) -> dict:
    """Every request of one prompt set through the three methods; the suffix drafter's tree starts empty."""
    pairs = {PROMPT_LOOKUP: lookup, SUFFIX: fresh_suffix(lookup, args)}
    requests = read_prompts(path)[: args.requests or None]
    s = SpecSettings(k=args.k, temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=0)
    tallies, skipped = {m: empty_tally() for m in METHODS}, []
    for n, request in enumerate(requests, 1):
        ids = encode_prompt(pairs[PROMPT_LOOKUP].target.tokenizer, request.text, PRESETS[preset].use_chat_template)
        try:
            check_prompt_fits(pairs[PROMPT_LOOKUP], len(ids), s)
        except ValueError:
            skipped.append(request.id)
            continue
        outputs = {}
        for method in METHODS:
            run = run_plain if method == "plain" else run_speculative
            tokens, seconds, records = run(pairs[PROMPT_LOOKUP if method == "plain" else method], ids, s)
            add_run(tallies[method], tokens, seconds, records)
            outputs[method] = tokens
        if s.temperature == 0 and len({tuple(t) for t in outputs.values()}) != 1:
            raise AssertionError(f"{preset} {request.id}: greedy outputs differ between methods: exactness broken")
        print(f"  {preset} {path.stem} {n}/{len(requests)} {request.id}: "
              + "  ".join(f"{m} {tallies[m]['tokens'] / tallies[m]['seconds']:.1f}/s" for m in METHODS), flush=True)
    return {"preset": preset, "prompt_set": path.name, "skipped": skipped, "methods": summarise(tallies)}


def summarise(tallies: dict) -> dict:
    plain = tallies["plain"]["tokens"] / max(tallies["plain"]["seconds"], 1e-9)
    out = {}
    for method, t in tallies.items():
        rate = t["tokens"] / max(t["seconds"], 1e-9)
        out[method] = t | {"tokens_per_s": rate, "speedup": rate / plain if plain else None,
                           "mean_acceptance_length": 1 + t["accepted"] / t["drafts"] if t["drafts"] else None,
                           "acceptance_rate": t["accepted"] / t["drafted"] if t["drafted"] else None,
                           "drafting_share": t["drafts"] / t["cycles"] if t["cycles"] else None,
                           "global_share": t["global_drafts"] / t["drafts"] if t["drafts"] else None}
    return out


def number(x, form: str) -> str:
    return "–" if x is None else format(x, form)


def report(results: list[dict], args, machine: dict) -> str:
    lines = ["# Suffix decoding vs prompt lookup vs plain decoding", "",
             f"Machine: {machine_words(machine)}. {machine['date']}." + (f" {args.note}" if args.note else ""),
             f"K={args.k}, T={args.temperature:g}, up to {args.max_new_tokens} new tokens a request, one pass"
             + (" (--quick: a smoke run, not a measurement)" if args.quick else "") + ". Each prompt set is one session: "
             "the suffix drafter's global tree grows over its requests. Suffix options: depth 24, factor 1.0, "
             f"min probability {args.suffix_min_prob:g}, {args.suffix_cached_requests:,} cached requests "
             "(vLLM's defaults: 0.1 and 10,000).", "",
             "| preset | prompt set | method | requests | tokens/s | speed-up | mean acc. length | acceptance rate "
             "| cycles drafting | drafts from global tree |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for method, m in r["methods"].items():
            lines.append(f"| {r['preset']} | {r['prompt_set']} | {method} | {m['requests']} | {m['tokens_per_s']:.1f} "
                         f"| {number(m['speedup'], '.2f')}x | {number(m['mean_acceptance_length'], '.2f')} "
                         f"| {number(m['acceptance_rate'], '.2f')} | {number(m['drafting_share'], '.0%')} "
                         f"| {number(m['global_share'] if method == SUFFIX else None, '.0%')} |")
        if r["skipped"]:
            lines.append(f"| {r['preset']} | {r['prompt_set']} | skipped (too long for the context) "
                         f"| {len(r['skipped'])} | | | | | | |")
    return "\n".join(lines) + "\n"


def warm_up(lookup: Pair, args) -> None:
    """One short untimed run of each method (first calls pay for allocation and lazy loading); the
    suffix drafter here is a throwaway, so no session's global tree sees it."""
    ids = encode_prompt(lookup.target.tokenizer, "Warm up.", False)
    s = SpecSettings(k=args.k, temperature=args.temperature, max_new_tokens=4, seed=0)
    run_plain(lookup, ids, s)
    run_speculative(lookup, ids, s)
    run_speculative(fresh_suffix(lookup, args), ids, s)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    machine = machine_info(args.threads)
    results = []
    with torch.inference_mode():
        for preset in args.presets.split(","):
            lookup = load_preset(preset, device="cpu", drafter=DrafterOptions(PROMPT_LOOKUP))
            warm_up(lookup, args)
            for path in args.prompt_sets.split(","):
                results.append(run_set(lookup, preset, Path(path), args))
    stem = f"suffix-vs-lookup-{'quick-' if args.quick else ''}{cpu_tag(machine)}" + (f"-{args.name}" if args.name else "")
    text = report(results, args, machine)
    write_results(args.out, stem, {"machine": machine, "settings": vars(args) | {"out": str(args.out)},
                                   "results": results}, text)
    print(text)
    print(f"wrote {args.out / stem}.md and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
