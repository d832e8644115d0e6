"""The teacher-forced agreement probe against greedy speculative runs of the same requests.

    python -m bench.agreement_probe [--presets tiny-shakespeare,chat] [--per-category 2] [--max-new-tokens 32]

Per request: a greedy speculative run (engine.run.run_to_trace) and the probe over that run's own
output (engine/diagnose/agreement.py). Both read the prompt once per model first (the same prefill),
so the cost of the generated tokens is compared without it: the run's cycles (the sum of its
records' cycle_time_s) against the probe's one forward of each model over the continuation, given
the prompt's cache. The whole times, prefills and the trace included, are reported beside. Reported
per preset: the measured acceptance rate (accepted / drafted over all requests), the probe's
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
from engine.diagnose.agreement import continuation_logits, simulate_greedy_cycles
from engine.kv.ops import prefill
from engine.run import load_preset, run_to_trace
from engine.workload.prompts import read_prompts


def one_preset(name: str, n: int, max_new_tokens: int, k: int) -> dict:
    pair = load_preset(name)
    s = SpecSettings(k=k, temperature=0.0, max_new_tokens=max_new_tokens)
    requests = per_category(read_prompts(PROMPT_SET), n)
    out = Path(tempfile.mkdtemp(prefix="speclab-probe-"))
    run_to_trace(pair, requests[0].text, s, out / "warm.jsonl", messages=requests[0].messages)  # one-off costs
    run_s = probe_s = cycles_s = prefill_s = 0.0
    drafted = accepted = predicted_drafted = predicted_accepted = 0
    for i, r in enumerate(requests):
        start = time.perf_counter()
        trace = run_to_trace(pair, r.text, s, out / f"{i}.jsonl", messages=r.messages)
        run_s += time.perf_counter() - start
        drafted += sum(len(c["draft_token_ids"]) for c in trace.cycles)
        accepted += sum(c["num_accepted"] for c in trace.cycles)
        cycles_s += sum(c["cycle_time_s"] for c in trace.cycles)
        prompt, generated = trace.header["prompt_token_ids"], trace.summary["generated_token_ids"]
        start = time.perf_counter()
        caches = [prefill(m, prompt) for m in (pair.target, pair.draft)]  # what the run also paid
        prefill_s += time.perf_counter() - start
        start = time.perf_counter()
        target_logits, draft_logits = (continuation_logits(m, prompt, generated, c)
                                       for m, c in zip((pair.target, pair.draft), caches))
        top1 = (draft_logits.argmax(-1) == target_logits.argmax(-1)).tolist()
        probe_s += time.perf_counter() - start
        cycles = simulate_greedy_cycles(top1, k, max_new_tokens)
        predicted_drafted += k * len(cycles)
        predicted_accepted += sum(cycles)
    measured, predicted = accepted / drafted, predicted_accepted / predicted_drafted
    return {"preset": name, "requests": len(requests), "k": k, "max_new_tokens": max_new_tokens,
            "measured_acceptance_rate": measured, "predicted_acceptance_rate": predicted,
            "difference": predicted - measured, "run_s": run_s, "cycles_s": cycles_s, "prefill_s": prefill_s,
            "probe_s": probe_s, "cost_ratio": probe_s / cycles_s, "whole_ratio": (prefill_s + probe_s) / run_s}


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
        "| cycles s | probe s (continuation) | probe / cycles (goal < 0.1) | whole: prefill + probe / run |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *[f"| {r['preset']} | {r['requests']} | {r['measured_acceptance_rate']:.3f} | "
          f"{r['predicted_acceptance_rate']:.3f} | {r['difference']:+.3f} | {r['cycles_s']:.1f} | {r['probe_s']:.2f} | "
          f"{r['cost_ratio']:.3f} | {r['whole_ratio']:.3f} |" for r in rows]])
    write_results(Path(args.out), f"agreement-probe-{cpu_tag(machine)}", {"machine": machine, "rows": rows}, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
