"""KV-cache layouts: the memory each holds over a long run, and what one rollback costs (a benchmark, not a test).

    python -m bench.kv_layouts                                  # tiny-shakespeare preset, CPU
    python -m bench.kv_layouts --preset chat --max-new-tokens 256

Part 1, memory (deterministic, no timing): one long speculative run per layout on the same
prompt, settings and seed. After every cycle's verify (the peak of the cycle) and after its
rollback we record the bytes of K/V memory that the target's and the draft's caches hold
(engine.kv.layouts.kv_bytes_held): the tensors of a dynamic cache, the whole preallocated
buffer of a static one, the blocks in a paged cache's table. Reported: peak, mean and final.

Part 2, rollback cost: the target's cache is filled to --positions positions. One trial
appends K+1 positions (a verify, not timed), times one roll_back_cache to a random accept
length, then resets the cache (not timed). Each round runs --trials trials of every layout,
the layouts in a rotated order (interleaved, so load that comes and goes spreads evenly);
a layout's figure for a round is its median trial. Reported: the median over rounds, and
the 10th-90th percentile spread of the round figures.

Results: bench/results/kv-layouts-NAME.json and .md.
"""
import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.common import PROMPTS, RESULTS, machine_info, machine_words, write_results
from engine.config import SpecSettings
from engine.cycle.pair import Pair, TokenTexts
from engine.cycle.reference import run_cycle, start_run
from engine.kv.layouts import CacheLayout, kv_bytes_held, kv_bytes_reserved, layout_name, new_cache, roll_back_cache
from engine.kv.ops import prefill
from engine.run import encode_prompt, load_preset

VARIANTS = {"dynamic": ("dynamic", 16), "static": ("static", 16), "paged-16": ("paged", 16), "paged-4": ("paged", 4)}
LONG_RUN_PROMPT = {preset: PROMPTS[preset][0] for preset in ("tiny-shakespeare", "chat")}  # one long run per layout


def slots_held(cache) -> int:
    """K/V slots this sequence holds: positions (dynamic), the buffer (static), its blocks' slots (paged)."""
    name = layout_name(cache)
    if name == "static":
        return cache.capacity
    if name == "paged":
        return len(cache.block_table) * cache.block_size
    return int(cache.get_seq_length())


def memory_run(pair: Pair, prompt_ids: list[int], s: SpecSettings) -> dict:
    """Bytes held by both caches after each verify and after each rollback, over one run."""
    gen, texts = torch.Generator().manual_seed(s.seed), TokenTexts(pair.target.tokenizer)
    state = start_run(pair, prompt_ids, s)
    peak_per_cycle, after_rollback, unused = [], [], []
    cycle, peak = 0, 0
    verify = pair.target.forward

    def measured_forward(ids, cache):  # the verify: read the held bytes right after its append
        nonlocal peak
        out = verify(ids, cache)
        peak = kv_bytes_held(cache) + kv_bytes_held(state.draft_cache)
        return out

    pair.target.forward = measured_forward
    try:
        while not state.finished:
            run_cycle(pair, state, s, gen, cycle, texts, record=False)
            peak_per_cycle.append(peak)
            after_rollback.append(kv_bytes_held(state.target_cache) + kv_bytes_held(state.draft_cache))
            unused.append(slots_held(state.target_cache) - int(state.target_cache.get_seq_length()))
            cycle += 1
    finally:
        pair.target.forward = verify
    return {"cycles": cycle, "committed": len(state.committed), "peak_bytes": max(peak_per_cycle),
            "mean_bytes_after_verify": statistics.mean(peak_per_cycle), "final_bytes": after_rollback[-1],
            "bytes_after_verify": peak_per_cycle, "bytes_after_rollback": after_rollback,
            "mean_unused_target_slots": statistics.mean(unused), "unused_target_slots": unused,
            "reserved_bytes": kv_bytes_reserved(state.target_cache) + kv_bytes_reserved(state.draft_cache),
            "generated": list(state.generated)}


def rollback_trials(pair: Pair, variant: str, prompt_ids: list[int], k: int, trials: int,
                    rng: random.Random, capacity: int) -> float:
    """Median microseconds of one rollback over `trials` verify-and-roll-back cycles."""
    name, block = VARIANTS[variant]
    model = pair.target
    cache = new_cache(CacheLayout(name, capacity, block), model.model.config)
    prefill(model, prompt_ids, cache)
    base = len(prompt_ids) - 1
    times = []
    for _ in range(trials):
        model.forward([rng.randrange(model.full_vocab_size) for _ in range(k + 1)], cache)
        keep = base + rng.randint(1, k + 1)  # accepted drafts + the correction's slot
        start = time.perf_counter_ns()
        roll_back_cache(cache, keep)
        times.append((time.perf_counter_ns() - start) / 1000)
        roll_back_cache(cache, base)
    return statistics.median(times)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def rollback_cost(pair: Pair, prompt_ids: list[int], k: int, rounds: int, trials: int) -> dict:
    rng = random.Random(0)
    capacity = len(prompt_ids) + 2 * (k + 1)
    per_round: dict[str, list[float]] = {v: [] for v in VARIANTS}
    order = list(VARIANTS)
    for r in range(rounds):
        for variant in order[r % len(order):] + order[: r % len(order)]:
            per_round[variant].append(rollback_trials(pair, variant, prompt_ids, k, trials, rng, capacity))
    return {v: {"median_us": statistics.median(xs), "p10_us": percentile(xs, 0.1), "p90_us": percentile(xs, 0.9),
                "rounds_us": xs} for v, xs in per_round.items()}


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"## KV-cache layouts ({result['name']}, bench/kv_layouts.py)", "",
             f"{m['date']} · {machine_words(m)} · torch {m['torch']} · "
             f"transformers {m['transformers']}", "",
             f"**Conditions:** {result['conditions']} (1-minute load average {result['load_average'][0]:.1f} at the start, "
             f"{result['load_average'][1]:.1f} at the end).", "",
             f"### K/V memory held by both caches over one run (K={result['k']}, {result['max_new_tokens']} new tokens, "
             f"T={result['temperature']}, seed {result['seed']})", "",
             "Held: what this sequence occupies (dynamic: its tensors; static: the whole buffer; paged: the blocks in "
             "its table). Reserved: the tensors allocated behind the cache (paged: the pool, which an engine shares "
             "between sequences).", "",
             "Unused slots: slots the target's cache holds after a rollback that no position attends to "
             "(static: the rest of the buffer; paged: the tail of the last block, internal fragmentation).", "",
             "| layout | cycles | peak KiB held (after a verify) | mean KiB held after a verify "
             "| KiB held after the last rollback | KiB reserved | unused target slots after a rollback, mean "
             "| same tokens as dynamic |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    dyn = result["memory"]["dynamic"]["generated"]
    for v, r in result["memory"].items():
        lines.append(f"| {v} | {r['cycles']} | {r['peak_bytes'] / 1024:.1f} | {r['mean_bytes_after_verify'] / 1024:.1f} | "
                     f"{r['final_bytes'] / 1024:.1f} | {r['reserved_bytes'] / 1024:.1f} | {r['mean_unused_target_slots']:.1f} | "
                     f"{'yes' if r['generated'] == dyn else 'no'} |")
    lines += ["", f"### One rollback of the target cache ({result['positions']} positions, K={result['k']}), microseconds",
              "", f"{result['rounds']} interleaved rounds x {result['trials']} trials; a round's figure is its median trial.",
              "", "| layout | median over rounds | p10 - p90 of rounds |", "|---|---:|---:|"]
    for v, r in result["rollback"].items():
        lines.append(f"| {v} | {r['median_us']:.1f} | {r['p10_us']:.1f} - {r['p90_us']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny-shakespeare", choices=sorted(LONG_RUN_PROMPT))
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=400)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--positions", type=int, default=256, help="cache length before each timed rollback")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--conditions", default="shared 2-core CPU machine, under load from other developers' jobs: "
                        "timings are noisy, compare medians and read the spread")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0]
    pair = load_preset(args.preset, "cpu")
    prompt_ids = encode_prompt(pair.target.tokenizer, LONG_RUN_PROMPT[args.preset], args.preset == "chat")
    memory = {}
    for variant, (name, block) in VARIANTS.items():
        s = SpecSettings(k=args.k, temperature=args.temperature, seed=args.seed, max_new_tokens=args.max_new_tokens,
                         cache_layout=name, block_size=block)
        memory[variant] = memory_run(pair, prompt_ids, s)
        print(f"memory {variant}: peak {memory[variant]['peak_bytes'] / 1024:.1f} KiB", flush=True)
    long_prompt = (prompt_ids * (args.positions // len(prompt_ids) + 1))[: args.positions + 1]
    rollback = rollback_cost(pair, long_prompt, args.k, args.rounds, args.trials)
    result = {"name": args.preset, "machine": machine_info(args.threads), "conditions": args.conditions,
              "k": args.k, "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "seed": args.seed,
              "positions": args.positions, "rounds": args.rounds, "trials": args.trials,
              "memory": memory, "rollback": rollback, "load_average": [load_start, os.getloadavg()[0]]}
    write_results(Path(args.out), f"kv-layouts-{args.preset}", result, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
