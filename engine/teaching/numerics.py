"""Greedy text and floating point, for the interview page's question on greedy output.

In exact arithmetic speculative greedy decoding writes plain greedy decoding's text; in floating
point a batched verify pass and one-token steps can round differently, and where the target's two
most likely tokens are nearly tied that flips the argmax. Here: the closest such near-tie a trace
recorded, and the batched-against-stepwise checks to run on a pair (engine/teaching/runs.py runs
one check).
"""
from engine.models.loading import LoadedModel
from engine.teaching.runs import NumericsCheck, batched_vs_stepwise, low_precision_copy
from engine.trace import Trace

LOW_PRECISION_MAX_PARAMS = 50_000_000  # copy the target to bfloat16 only when that is quick


def closest_tie(trace: Trace) -> tuple[float, int] | None:
    """Smallest gap between the target's two most likely tokens anywhere in the trace, and its cycle;
    None when no recorded top list has two entries."""
    gaps = [(row[0]["p"] - row[1]["p"], c["cycle"]) for c in trace.cycles for row in c["target_top"] if len(row) > 1]
    return min(gaps) if gaps else None


def numerics_checks(target: LoadedModel, ids: list[int], positions: int) -> list[NumericsCheck]:
    """The target's logits over the last `positions` tokens of `ids`, batched against stepwise: as loaded,
    and in bfloat16 too when the target is small enough to copy quickly (LOW_PRECISION_MAX_PARAMS)."""
    checks = [batched_vs_stepwise(target, ids, positions)]
    if sum(p.numel() for p in target.model.parameters()) <= LOW_PRECISION_MAX_PARAMS:
        checks.append(batched_vs_stepwise(low_precision_copy(target), ids, positions))
    return checks
