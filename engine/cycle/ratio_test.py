"""The acceptance test, in one place: the ratio test a chain's cycle and a batch's rows decide by,
and the rule interface through which the teaching code swaps in deliberately broken ones.

A tree's acceptance walk (engine/tree/accept.py) applies the same test node by node.
"""
from dataclasses import dataclass
from typing import Callable, Protocol

import torch
from transformers import DynamicCache

from engine.drafters.base import Drafter
from engine.kv.ops import crop
from engine.models.sampling import residual, sample, uniform


@dataclass
class Decision:
    num_accepted: int
    accept_prob: list[float]  # (n,) min(1, p_target/p_draft) of each draft token
    u: list[float]  # one draw per tested position
    rejected_position: int | None  # 1-based, None when all n passed
    next_token_id: int  # the resampled or bonus token
    residual_probs: torch.Tensor | None  # (V,) at the rejection, None for a bonus


def accept_reject(draft_tokens: list[int], p_draft: torch.Tensor, p_target: torch.Tensor,
                  gen: torch.Generator) -> Decision:
    """Left-to-right ratio test; resample at the first rejection or add the bonus token.

    p_draft (n, V) and p_target (n+1, V); n may be 0 (a plain target step: only the bonus).
    """
    k = len(draft_tokens)
    idx = torch.arange(k)
    p_t = p_target[idx, draft_tokens]  # (n,) target probability of each draft token
    p_d = p_draft[idx, draft_tokens]  # (n,)
    accept_prob = torch.clamp(p_t / p_d, max=1.0).tolist()
    draws: list[float] = []
    for i in range(k):
        draws.append(uniform(gen))
        # Strict '<': a token the target gives probability 0 is never accepted, even at u = 0.
        if not draws[-1] < accept_prob[i]:
            res = residual(p_target[i], p_draft[i])
            return Decision(i, accept_prob, draws, i + 1, sample(res, gen), res)
    return Decision(k, accept_prob, draws, None, sample(p_target[k], gen), None)


class CycleRule(Protocol):
    """How a cycle decides and rolls back, for every cycle kind (the fast path and the batch run RATIO_TEST
    only). The engine runs RATIO_TEST; only the teaching code (engine/teaching/faults.py) passes
    deliberately broken rules, through the run mode (engine/mode.py)."""

    def decide(self, draft_tokens: list[int], p_draft: torch.Tensor, p_target: torch.Tensor,
               gen: torch.Generator) -> Decision: ...

    def roll_back(self, cache: DynamicCache, keep: int) -> None: ...

    def drafter(self, drafter: Drafter) -> Drafter: ...

    # A tree's rollback: (cache, start, kept_slots) -> moves (engine/tree/compact.py's Rollback);
    # None means the correct compaction.
    tree_rollback: Callable | None
    for_chains: bool  # the cycle kinds this rule can run in
    for_trees: bool


class RatioTest:
    """The correct rule: the ratio test, rejected K/V cropped (a tree's compacted), the drafter as it is."""

    tree_rollback = None
    for_chains, for_trees = True, True  # the cycle kinds a rule applies to (engine/mode.py refuses the others)

    def decide(self, draft_tokens, p_draft, p_target, gen) -> Decision:
        return accept_reject(draft_tokens, p_draft, p_target, gen)

    def roll_back(self, cache: DynamicCache, keep: int) -> None:
        crop(cache, keep)

    def drafter(self, drafter: Drafter) -> Drafter:
        return drafter


RATIO_TEST = RatioTest()
