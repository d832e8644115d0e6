"""The draft's agreement with the target on a workload's requests, without speculating (agreement.py),
per category, with the greedy acceptance it predicts and what it cost against the speculative run."""
import time
from collections import defaultdict

from engine.config import SpecSettings
from engine.cycle.pair import Pair
from engine.cycle.plain import target_generate
from engine.diagnose.agreement import Agreement, agreements, simulate_greedy_cycles
from engine.workload.requests import RequestRun


def continuation(pair: Pair, run: RequestRun, s: SpecSettings, greedy: RequestRun | None) -> list[int]:
    """The target's greedy continuation of the request's prompt: a greedy run's output where there is
    one, else generated here (a plain decoding, K tokens past the budget: the last cycle drafts that far)."""
    if greedy is not None:
        return greedy.trace.summary["generated_token_ids"]
    longer = SpecSettings(k=s.k, temperature=0.0, max_new_tokens=s.max_new_tokens + s.k)
    return target_generate(pair.target, run.trace.header["prompt_token_ids"], longer, pair.eos_ids)


def request_row(run: RequestRun, probe: Agreement, s: SpecSettings) -> dict:
    """One request's counts: positions, agreeing top-1s, summed overlap (after the run's warping) and
    the greedy cycles the agreements imply."""
    cycles = simulate_greedy_cycles(probe.top1, s.k, s.max_new_tokens)
    return {"id": run.id, "category": run.category, "positions": len(probe.top1),
            "agreeing": sum(probe.top1), "overlap": sum(probe.overlap), "cycles": len(cycles), "accepted": sum(cycles)}


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
    `greedy_runs` (a greedy run of the same requests) their outputs are the continuations. The
    requests go through the models in batches (agreement.agreements): top-1 agreement is read at
    temperature 0 and the overlap after the run's own warping, both from the same logits."""
    greedy = {r.id: r for r in greedy_runs or []}
    started = time.perf_counter()
    continuations = [continuation(pair, r, s, greedy.get(r.id)) for r in runs]
    found = agreements(pair.target, pair.draft, [r.trace.header["prompt_token_ids"] for r in runs], continuations, s)
    rows = [request_row(r, probe, s) for r, probe in zip(runs, found)]
    seconds = time.perf_counter() - started
    by_category = defaultdict(list)
    for r in rows:
        by_category[r["category"]].append(r)
    return {"overall": group(rows, s.k), "categories": {c: group(rs, s.k) for c, rs in sorted(by_category.items())},
            "seconds": seconds}
