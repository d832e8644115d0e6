"""The teacher-forced agreement probe against greedy speculative runs of the same requests.

    python -m bench.agreement_probe [--presets tiny-shakespeare,chat] [--per-category 2] [--max-new-tokens 32]

Per request, a greedy speculative run (engine.run.run_to_trace). Then the probe over those runs'
own outputs as the diagnosis runs it (engine/diagnose/agreement.py `agreements`): requests of
similar length through each model in batches, one forward over their prompts, then one over their
continuations. The runs read their prompts too (the same prefill), so the cost of the generated
tokens is the continuation forwards against the runs' cycles (the sum of their records'
cycle_time_s; goal: under 0.1). The whole probe, prompts included, is set against the whole runs
beside it, and so is the probe one request at a time (its continuation forward only, given the
prompt's cache: how this bench measured before the probe was batched). Reported per preset: the
measured acceptance rate (accepted / drafted over all requests), the probe's prediction of it and their
difference (goal: within 0.05). Writes
bench/results/agreement-probe-CPU.json and .md.
"""
import argparse
import tempfile
import time
from pathlib import Path

import torch

from bench.common import RESULTS, cpu_tag, machine_info, machine_words, write_results
from engine.config import SpecSettings
from engine.diagnose.agreement import ROWS_PER_FORWARD, agreements, continuation_logits, simulate_greedy_cycles
from engine.diagnose.requests import PROMPT_SET, per_category
from engine.kv.ops import prefill
from engine.run import load_preset, run_to_trace
from engine.workload.prompts import read_prompts


def one_preset(name: str, n: int, max_new_tokens: int, k: int) -> dict:
    pair = load_preset(name)
    s = SpecSettings(k=k, temperature=0.0, max_new_tokens=max_new_tokens)
    requests = per_category(read_prompts(PROMPT_SET), n)
    out = Path(tempfile.mkdtemp(prefix="speclab-probe-"))
    run_to_trace(pair, requests[0].text, s, out / "warm.jsonl", messages=requests[0].messages)  # one-off costs
    run_s = one_by_one_s = cycles_s = 0.0
    drafted = accepted = predicted_drafted = predicted_accepted = 0
    prompts, outputs = [], []
    for i, r in enumerate(requests):
        start = time.perf_counter()
        trace = run_to_trace(pair, r.text, s, out / f"{i}.jsonl", messages=r.messages)
        run_s += time.perf_counter() - start
        drafted += sum(len(c["draft_token_ids"]) for c in trace.cycles)
        accepted += sum(c["num_accepted"] for c in trace.cycles)
        cycles_s += sum(c["cycle_time_s"] for c in trace.cycles)
        prompts.append(trace.header["prompt_token_ids"])
        outputs.append(trace.summary["generated_token_ids"])
        caches = [prefill(m, prompts[-1]) for m in (pair.target, pair.draft)]  # what the run also paid
        start = time.perf_counter()
        for m, c in zip((pair.target, pair.draft), caches):
            continuation_logits(m, prompts[-1], outputs[-1], c)
        one_by_one_s += time.perf_counter() - start
    timings: dict[str, float] = {}
    start = time.perf_counter()
    found = agreements(pair.target, pair.draft, prompts, outputs, s, timings)
    probe_s = time.perf_counter() - start
    for probe in found:
        cycles = simulate_greedy_cycles(probe.top1, k, max_new_tokens)
        predicted_drafted += k * len(cycles)
        predicted_accepted += sum(cycles)
    measured, predicted = accepted / drafted, predicted_accepted / predicted_drafted
    return {"preset": name, "requests": len(requests), "k": k, "max_new_tokens": max_new_tokens,
            "rows_per_forward": ROWS_PER_FORWARD,
            "measured_acceptance_rate": measured, "predicted_acceptance_rate": predicted,
            "difference": predicted - measured, "run_s": run_s, "cycles_s": cycles_s, "probe_s": probe_s,
            "cost_ratio": probe_s / cycles_s, "whole_ratio": probe_s / run_s,
            "batched_continuations_s": timings.get("continuations_s"),
            "batched_continuation_ratio": timings.get("continuations_s", float("nan")) / cycles_s,
            "one_by_one_continuation_s": one_by_one_s, "one_by_one_ratio": one_by_one_s / cycles_s}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--presets", default="tiny-shakespeare,chat")
    p.add_argument("--per-category", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    machine = machine_info(torch.get_num_threads())
    rows = [one_preset(name, args.per_category, args.max_new_tokens, args.k) for name in args.presets.split(",")]
    text = "\n".join([
        "## The agreement probe against greedy speculative runs (bench/agreement_probe.py)",
        f"Machine: {machine_words(machine)}", "",
        "| preset | requests | measured acceptance | probe's prediction | difference (goal within 0.05) "
        "| cycles s | probe's continuation forwards s (batched) | / cycles (goal < 0.1) "
        "| whole probe s (prompts included) | / whole runs | one by one: continuation / cycles |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *[f"| {r['preset']} | {r['requests']} | {r['measured_acceptance_rate']:.3f} | "
          f"{r['predicted_acceptance_rate']:.3f} | {r['difference']:+.3f} | {r['cycles_s']:.1f} | "
          f"{r['batched_continuations_s']:.2f} | {r['batched_continuation_ratio']:.3f} | {r['probe_s']:.2f} | "
          f"{r['whole_ratio']:.3f} | {r['one_by_one_ratio']:.3f} |" for r in rows]])
    write_results(Path(args.out), f"agreement-probe-{cpu_tag(machine)}", {"machine": machine, "rows": rows}, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
