"""The teacher-forced agreement probe against greedy speculative runs of the same requests.

    python -m bench.agreement_probe [--presets tiny-shakespeare,chat] [--per-category 2] [--max-new-tokens 32]

Per request: a greedy speculative run (engine.run.run_to_trace); then the probe as a diagnosis runs
it (engine/diagnose/probe.py): both models over every request's prompt and that run's own output, in
batched forwards, with no cache and no prefill of their own. Its time is set against the runs'
cycles alone (the sum of their records' cycle_time_s: the prompt's prefill left out of the runs, though
the probe reads the prompt too, so the ratio errs against the probe) and against the whole runs.
Reported per preset: the measured acceptance rate (accepted / drafted over all requests), the probe's
prediction of it and their difference (goal: within 0.05), and the probe's time over the cycles'
(goal: under 0.1). Writes bench/results/agreement-probe-CPU.json and .md.
"""
import argparse
import tempfile
import time
from pathlib import Path

import torch

from bench.common import RESULTS, cpu_tag, machine_info, machine_words, write_results
from engine.cli_diagnose import PROMPT_SET, per_category
from engine.config import SpecSettings
from engine.diagnose.agreement import batched_continuation_logits, simulate_greedy_cycles
from engine.run import load_preset, run_to_trace
from engine.workload.prompts import read_prompts


def one_preset(name: str, n: int, max_new_tokens: int, k: int) -> dict:
    pair = load_preset(name)
    s = SpecSettings(k=k, temperature=0.0, max_new_tokens=max_new_tokens)
    requests = per_category(read_prompts(PROMPT_SET), n)
    out = Path(tempfile.mkdtemp(prefix="speclab-probe-"))
    run_to_trace(pair, requests[0].text, s, out / "warm.jsonl", messages=requests[0].messages)  # one-off costs
    run_s = cycles_s = 0.0
    drafted = accepted = predicted_drafted = predicted_accepted = 0
    prompts, continuations = [], []
    for i, r in enumerate(requests):
        start = time.perf_counter()
        trace = run_to_trace(pair, r.text, s, out / f"{i}.jsonl", messages=r.messages)
        run_s += time.perf_counter() - start
        drafted += sum(len(c["draft_token_ids"]) for c in trace.cycles)
        accepted += sum(c["num_accepted"] for c in trace.cycles)
        cycles_s += sum(c["cycle_time_s"] for c in trace.cycles)
        prompts.append(trace.header["prompt_token_ids"])
        continuations.append(trace.summary["generated_token_ids"])
    start = time.perf_counter()  # the probe as a diagnosis runs it: every request, both models, batched
    target_logits = batched_continuation_logits(pair.target, prompts, continuations)
    draft_logits = batched_continuation_logits(pair.draft, prompts, continuations)
    top1 = [(d.argmax(-1) == t.argmax(-1)).tolist() for t, d in zip(target_logits, draft_logits)]
    probe_s = time.perf_counter() - start
    for agreeing in top1:
        cycles = simulate_greedy_cycles(agreeing, k, max_new_tokens)
        predicted_drafted += k * len(cycles)
        predicted_accepted += sum(cycles)
    measured, predicted = accepted / drafted, predicted_accepted / predicted_drafted
    return {"preset": name, "requests": len(requests), "k": k, "max_new_tokens": max_new_tokens,
            "measured_acceptance_rate": measured, "predicted_acceptance_rate": predicted,
            "difference": predicted - measured, "run_s": run_s, "cycles_s": cycles_s,
            "probe_s": probe_s, "cost_ratio": probe_s / cycles_s, "whole_ratio": probe_s / run_s}


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
        "| cycles s | probe s | probe / cycles (goal < 0.1) | probe / whole runs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *[f"| {r['preset']} | {r['requests']} | {r['measured_acceptance_rate']:.3f} | "
          f"{r['predicted_acceptance_rate']:.3f} | {r['difference']:+.3f} | {r['cycles_s']:.1f} | {r['probe_s']:.2f} | "
          f"{r['cost_ratio']:.3f} | {r['whole_ratio']:.3f} |" for r in rows]])
    write_results(Path(args.out), f"agreement-probe-{cpu_tag(machine)}", {"machine": machine, "rows": rows}, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
