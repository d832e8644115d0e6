"""Goodput against batch size, measured: plain batched decoding and batched speculation at each K, with the
K advisor's choice per batch size (engine/stats/batch_plan.py). The results are engine/stats/batch_results.py's.

`batch_sweep` runs a set of requests at each batch size B, in batches of B one after another, greedy, so
every method commits the same tokens (checked). Goodput is committed tokens over all rows per second of
**decoding**: each request's prompt is read alone before either method starts (engine/batch/cycle.py
prefill_rows), at the same cost for both, and that time is left out, as the K sweep of one prompt does
(engine/stats/sweep.py). It is kept beside as `prefill_s`. The cost model predicts decoding too.
"""
from collections.abc import Callable
from dataclasses import replace
from statistics import median

from engine.batch.cycle import batched_generate
from engine.batch.report import RowCycle
from engine.config import SettingsError, SpecSettings
from engine.cycle.pair import Pair
from engine.cycle.plain import batched_plain_generate
from engine.models import linear_paths
from engine.stats.batch_plan import BatchLoad, advise_batch_k, measure_batch_costs
from engine.stats.batch_results import MAX_SWEEP_BATCH, BatchSize, BatchSweep
from engine.trace.schema import MAX_K

Progress = Callable[[float, str], None]  # (fraction done, what is running)


def chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def plain_run(pair: Pair, prompts: list[list[int]], s: SpecSettings, b: int) -> tuple[list[list[int]], float, float]:
    """Each request's tokens, the decoding seconds and the prefill seconds, B requests at a time."""
    outputs, decode_s, prefill_s = [], 0.0, 0.0
    for rows in chunks(prompts, b):
        run = batched_plain_generate(pair.target, rows, s, list(range(len(rows))), pair.eos_ids)
        outputs += run.outputs
        decode_s += run.decode_s
        prefill_s += run.prefill_s
    return outputs, decode_s, prefill_s


def speculative_run(pair: Pair, prompts: list[list[int]], s: SpecSettings, b: int) -> dict:
    """Each request's tokens, the decoding seconds (the cycles' own times) and the acceptance, B requests at a time."""
    outputs, cycles = [], []
    for rows in chunks(prompts, b):
        out, batch_cycles = batched_generate(pair, rows, s, list(range(len(rows))))
        outputs += out
        cycles += batch_cycles
    tested = [r for c in cycles for r in c.rows if not r.idle]
    return {"outputs": outputs, "decode_s": sum(c.cycle_s for c in cycles),
            "acceptance_rate": sum(r.num_accepted for r in tested) / (s.k * len(tested)),
            "alpha": alpha_of(tested, s.k), "other_s": median(c.bookkeeping_s for c in cycles),
            "idle_share": sum(c.idle_rows for c in cycles) / sum(len(c.rows) for c in cycles)}


def alpha_of(rows: list[RowCycle], k: int) -> float:
    """Accepted drafts over accepted drafts and rejections: each draft's chance to pass (a row that accepted
    all K was never rejected)."""
    accepted = sum(r.num_accepted for r in rows)
    rejections = sum(r.num_accepted < k for r in rows)
    return accepted / (accepted + rejections) if accepted + rejections else 0.0


def pilot(pair: Pair, prompts: list[list[int]], s: SpecSettings) -> tuple[list[float], float]:
    """Each request run alone (B = 1): its own alpha (the cost model draws static batches' rows from them),
    and alpha over all of them."""
    per_request = []
    for prompt in prompts:
        _, cycles = batched_generate(pair, [prompt], s, [0])
        per_request.append([r for c in cycles for r in c.rows if not r.idle])
    return [alpha_of(rows, s.k) for rows in per_request], alpha_of([r for rows in per_request for r in rows], s.k)


def one_batch_size(pair: Pair, prompts: list[list[int]], max_new_tokens: int, b: int, ks: list[int],
                   alphas: list[float]) -> BatchSize:
    """Plain batched decoding, speculation at every K, then the advisor's K from this machine's forwards at B."""
    greedy = SpecSettings(k=1, temperature=0.0, max_new_tokens=max_new_tokens)
    plain_outputs, plain_s, prefill_s = plain_run(pair, prompts, greedy, b)
    tokens = sum(len(o) for o in plain_outputs)
    speculative, acceptance, idle, other = {}, {}, {}, []
    for k in ks:
        spec = speculative_run(pair, prompts, replace(greedy, k=k), b)
        if spec["outputs"] != plain_outputs:
            raise AssertionError(f"B={b} K={k}: speculation's rows differ from plain greedy decoding")
        speculative[k] = tokens / spec["decode_s"]
        acceptance[k] = spec["acceptance_rate"]
        idle[k] = spec["idle_share"]
        other.append(spec["other_s"])
    costs = replace(measure_batch_costs(pair, prompts[:b], [k + 1 for k in ks]), other_s=median(other))
    load = BatchLoad(tuple(alphas), max_new_tokens)  # static batches of B, as this sweep runs them
    return BatchSize(b, tokens / plain_s, speculative, acceptance, advise_batch_k(load, costs),
                     {"plain": costs.plain_goodput()} | {str(k): costs.goodput(load, k) for k in ks},
                     prefill_s=prefill_s, idle_share=idle)


def check_sweep_settings(prompts: list[list[int]], batches: list[int], ks: list[int], max_new_tokens: int) -> None:
    if not prompts or not batches or not ks:
        raise SettingsError("a batch sweep needs requests, batch sizes and K values")
    if any(not 1 <= b <= MAX_SWEEP_BATCH for b in batches) or any(not 1 <= k <= MAX_K for k in ks):
        raise SettingsError(f"batch sizes 1 to {MAX_SWEEP_BATCH} and K from 1 to {MAX_K}, got {batches} and {ks}")
    if not 1 <= max_new_tokens <= 512:
        raise SettingsError(f"max new tokens between 1 and 512, got {max_new_tokens}")


def batch_sweep(pair: Pair, prompts: list[list[int]], batches: list[int], ks: list[int], max_new_tokens: int,
                preset: str = "", machine: str = "", pilot_k: int = 4,
                on_progress: Progress | None = None) -> BatchSweep:
    """A warm-up, a pilot at B = 1 for alpha, then every batch size in increasing order."""
    check_sweep_settings(prompts, batches, ks, max_new_tokens)
    report = on_progress or (lambda fraction, text: None)
    batches = sorted(set(batches))
    report(0.0, "this machine's linear path per width, the warm-up, and the pilot at B = 1 (alpha)")
    # A batched forward of B rows x T positions multiplies B*T rows: it runs on the path measured faster at
    # that width (as an advised single run does). Unsettled, the packed path ran chat's two-row step in
    # 47 ms on this Xeon against 35 ms as loaded.
    for model in (pair.target, pair.draft):
        linear_paths.settle(model)
    pilot_settings = SpecSettings(k=pilot_k, temperature=0.0, max_new_tokens=max_new_tokens)
    speculative_run(pair, prompts[:2], pilot_settings, 2)  # one-off costs (kernels for these shapes) before timing
    alphas, pooled = pilot(pair, prompts, pilot_settings)
    sizes = []
    for i, b in enumerate(batches):
        report((i + 1) / (len(batches) + 1), f"batch size {b}: plain decoding, then K = {', '.join(map(str, ks))}")
        sizes.append(one_batch_size(pair, prompts, max_new_tokens, b, ks, alphas))
    report(1.0, "done")
    return BatchSweep(preset, len(prompts), max_new_tokens, pooled, sizes, machine)



