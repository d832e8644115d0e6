"""The draft's agreement with the target on a workload's requests, without speculating (agreement.py),
per category, with the greedy acceptance it predicts and what it cost against the speculative run."""
import time
from collections import defaultdict

from engine.config import SpecSettings
from engine.cycle.pair import Pair
from engine.diagnose.agreement import agreement, greedy_agreement, simulate_greedy_cycles
from engine.workload.requests import RequestRun


def request_probe(pair: Pair, run: RequestRun, s: SpecSettings, greedy: RequestRun | None = None) -> dict:
    """One request: the draft's agreement along the target's greedy continuation of its prompt, and the
    greedy cycles that agreement implies. `greedy`: a greedy run of the same request, whose output is
    that continuation (else the target generates it here, which costs a plain decoding)."""
    prompt = run.trace.header["prompt_token_ids"]
    at_zero = SpecSettings(k=s.k, temperature=0.0, max_new_tokens=s.max_new_tokens)
    if greedy is not None:
        probe = agreement(pair.target, pair.draft, prompt, greedy.trace.summary["generated_token_ids"], at_zero)
    else:
        probe = greedy_agreement(pair.target, pair.draft, prompt, at_zero, pair.eos_ids)
    overlap = probe.overlap if s.temperature == 0 else agreement(pair.target, pair.draft, prompt,
                                                                 probe.continuation, s).overlap
    cycles = simulate_greedy_cycles(probe.top1, s.k, s.max_new_tokens)
    return {"id": run.id, "category": run.category, "positions": len(probe.top1),
            "agreeing": sum(probe.top1), "overlap": sum(overlap), "cycles": len(cycles), "accepted": sum(cycles)}


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
    rows = [request_probe(pair, r, s, greedy.get(r.id)) for r in runs]
    seconds = time.perf_counter() - started
    by_category = defaultdict(list)
    for r in rows:
        by_category[r["category"]].append(r)
    return {"overall": group(rows, s.k), "categories": {c: group(rs, s.k) for c, rs in sorted(by_category.items())},
            "seconds": seconds}
