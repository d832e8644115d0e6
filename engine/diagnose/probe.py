"""The draft's agreement with the target on a workload's requests, without speculating (agreement.py),
per category, with the greedy acceptance it predicts and what it cost against the speculative run.
Both models read every request's prompt and continuation in batched forwards (agreement.py)."""
import time
from collections import defaultdict
from dataclasses import replace

import torch

from engine.config import SpecSettings
from engine.cycle.pair import Pair
from engine.cycle.reference import target_generate
from engine.diagnose.agreement import agreement_of, batched_continuation_logits, simulate_greedy_cycles
from engine.workload.requests import RequestRun


def continuation_of(pair: Pair, run: RequestRun, s: SpecSettings, greedy: RequestRun | None) -> list[int]:
    """The target's greedy continuation of the request's prompt: a greedy run's output if there is one,
    else generated here (a plain decoding), K tokens past the budget (the last cycle drafts that far)."""
    if greedy is not None:
        return greedy.trace.summary["generated_token_ids"]
    longer = SpecSettings(k=s.k, temperature=0.0, max_new_tokens=s.max_new_tokens + s.k)
    return target_generate(pair.target, run.trace.header["prompt_token_ids"], longer, pair.eos_ids)


def request_probe(run: RequestRun, s: SpecSettings, target_logits: torch.Tensor, draft_logits: torch.Tensor,
                  continuation: list[int]) -> dict:
    """One request: the draft's agreement along the target's greedy continuation, and the greedy cycles
    that agreement implies; sum min(p, q) under the run's own warping."""
    at_zero = agreement_of(target_logits, draft_logits, continuation, replace(s, temperature=0.0))
    overlap = at_zero.overlap if s.temperature == 0 else agreement_of(target_logits, draft_logits, continuation,
                                                                      s).overlap
    cycles = simulate_greedy_cycles(at_zero.top1, s.k, s.max_new_tokens)
    return {"id": run.id, "category": run.category, "positions": len(at_zero.top1),
            "agreeing": sum(at_zero.top1), "overlap": sum(overlap), "cycles": len(cycles), "accepted": sum(cycles)}


def group(rows: list[dict], k: int) -> dict:
    positions = sum(r["positions"] for r in rows)
    cycles = sum(r["cycles"] for r in rows)
    return {"requests": len(rows),
            "top1_agreement": sum(r["agreeing"] for r in rows) / positions if positions else None,
            "mean_overlap": sum(r["overlap"] for r in rows) / positions if positions else None,
            "predicted_greedy_acceptance_rate": sum(r["accepted"] for r in rows) / (cycles * k) if cycles else None}


def workload_probe(pair: Pair, runs: list[RequestRun], s: SpecSettings,
                   greedy_runs: list[RequestRun] | None = None) -> dict:
    """Per category and overall; `seconds`: the probe's own time, to set against the run's. With
    `greedy_runs` (a greedy run of the same requests) their outputs are the continuations."""
    greedy = {r.id: r for r in greedy_runs or []}
    started = time.perf_counter()
    continuations = [continuation_of(pair, r, s, greedy.get(r.id)) for r in runs]
    prompts = [r.trace.header["prompt_token_ids"] for r in runs]
    target_logits = batched_continuation_logits(pair.target, prompts, continuations)
    draft_logits = batched_continuation_logits(pair.draft, prompts, continuations)
    rows = [request_probe(r, s, t, d, c) for r, t, d, c in zip(runs, target_logits, draft_logits, continuations)]
    seconds = time.perf_counter() - started
    by_category = defaultdict(list)
    for r in rows:
        by_category[r["category"]].append(r)
    return {"overall": group(rows, s.k), "categories": {c: group(rs, s.k) for c, rs in sorted(by_category.items())},
            "seconds": seconds}
