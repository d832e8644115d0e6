"""Deliberately broken acceptance rules and rollbacks, for the teaching pages only.

Every cycle kind runs one rule, the ratio test (engine/cycle/reference.py RATIO_TEST); it takes
a `CycleRule`, through the run mode (engine/mode.py), so the teaching code can pass in a
broken one and show what goes wrong. A `Faults` breaks the chain's test, rollback or draft; a
`TreeFaults` breaks a tree's compaction (its `tree_rollback`) and is the ratio test otherwise.
Nothing on the command line reaches either, and a run made with faults is marked in its
trace header.
"""
from dataclasses import dataclass, replace

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache

from engine.cycle.ratio_test import Decision, RatioTest
from engine.drafters.base import Drafter
from engine.drafters.model import ModelDrafter
from engine.kv.layouts import roll_back_cache
from engine.kv.ops import crop
from engine.models.sampling import residual, sample, uniform
from engine.trace.schema import ACCEPTANCE_RULES
from engine.tree.compact import Rollback, compact


@dataclass(frozen=True)
class Faults:
    """Deliberate bugs for the teaching pages only; normal runs never set them."""

    keep_rejected_kv: bool = False  # skip the rollback of both caches
    skip_draft_catch_up: bool = False  # after a full accept, never feed d_K to the draft
    acceptance_rule: str = "ratio"  # see ACCEPTANCE_RULES
    greedy_draft: bool = False  # draft proposes its argmax but is judged by its sampling distribution

    def __post_init__(self) -> None:
        if self.acceptance_rule not in ACCEPTANCE_RULES:
            raise ValueError(f"unknown acceptance rule {self.acceptance_rule!r}; known: {', '.join(ACCEPTANCE_RULES)}")

    # ---------------------------------------------------------------- CycleRule

    def decide(self, draft_tokens: list[int], p_draft: torch.Tensor, p_target: torch.Tensor,
               gen: torch.Generator) -> Decision:
        """The left-to-right test with this fault's acceptance rule (the ratio test when "ratio")."""
        rule = self.acceptance_rule
        k = len(draft_tokens)
        idx = torch.arange(k)
        p_t = p_target[idx, draft_tokens]  # (n,)
        p_d = p_draft[idx, draft_tokens]  # (n,)
        accept_prob = torch.clamp(p_t / p_d, max=1.0).tolist()
        draws: list[float] = []
        for i in range(k):
            draws.append(uniform(gen))
            if not passes(rule, draws[-1], accept_prob[i], float(p_t[i]), p_target[i], draft_tokens[i], gen):
                res = p_target[i] if rule == "no_residual" else residual(p_target[i], p_draft[i])
                return Decision(i, accept_prob, draws, i + 1, sample(res, gen), res)
        return Decision(k, accept_prob, draws, None, sample(p_target[k], gen), None)

    def roll_back(self, cache: DynamicCache, keep: int) -> None:
        if not self.keep_rejected_kv:
            crop(cache, keep)

    tree_rollback = None
    for_chains, for_trees = True, False  # chain faults only: a tree run refuses them (engine/mode.py)

    def drafter(self, drafter: Drafter) -> Drafter:
        """The model drafter with this fault's draft-side bugs; other drafters as they are."""
        if not isinstance(drafter, ModelDrafter):
            return drafter
        return replace(drafter, greedy_proposals=self.greedy_draft, crop_rejected=not self.keep_rejected_kv,
                       catch_up=not self.skip_draft_catch_up)


def passes(rule: str, u: float, accept_prob: float, p_t: float, target_probs: torch.Tensor,
           token: int, gen: torch.Generator) -> bool:
    if rule in ("ratio", "no_residual"):
        return u < accept_prob
    if rule == "p_target_only":
        return u < p_t
    if rule == "token_match":
        return sample(target_probs, gen) == token
    raise ValueError(f"unknown acceptance rule {rule!r}; known: {', '.join(ACCEPTANCE_RULES)}")


NO_FAULTS = Faults()


@dataclass(frozen=True)
class TreeFaults(RatioTest):
    """Deliberate bugs of a tree run's rollback, for the teaching pages only; normal runs never set them.
    The ratio test decides as in a correct run; only the compaction is broken."""

    crop_instead_of_compact: bool = False  # roll both caches back the chain's way, keeping the wrong slots
    for_chains, for_trees = False, True  # (class attributes, not fields) a chain run refuses them

    @property
    def tree_rollback(self) -> Rollback:
        """What the tree cycle rolls its caches back with (engine/tree/compact.py's compact when correct)."""
        return crop_to_length if self.crop_instead_of_compact else compact


def crop_to_length(cache: Cache, start: int, kept_slots: list[int]) -> list[tuple[int, int]]:
    """The chain's rollback after a tree: cut the cache to its new length, start + len(kept_slots), and
    move nothing. Slots start+1.. keep whatever the verify (or, in the draft's cache, its level-by-level
    forwards) wrote there: the first nodes of the tree, level by level. Unless the accepted path ran
    through those nodes in order, some committed positions hold the K/V of a rejected sibling or a cousin."""
    roll_back_cache(cache, start + len(kept_slots))
    return []


NO_TREE_FAULTS = TreeFaults()
