"""Tree drafting: one batched forward per depth, under a tree mask, and what proposes a run's trees.

Depth 1 is one forward over the root (the last committed token). Depth d+1 is one forward
over the level-d nodes being expanded (all of a static tree's level, a dynamic tree's
frontier), each attending to the prefix, the root and its own ancestors in the drafter's
cache. The deepest level is never fed: its children are not proposed. `grow_tree` is that
loop, whatever runs the forwards; a `TreeProposer` is what does: the draft model here
(`ModelTreeProposer`), the EAGLE head in engine/tree/eagle.py.

Children are chosen by the drafter's confidence: the softmax of its logits at the run's
temperature (1 for greedy runs, where the warped distribution is one-hot and would leave a
single child per node). The acceptance walk treats every child as a deterministic (one-hot)
proposal, so how children are ranked changes how often they are accepted, never what the
output's distribution is.
"""
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import torch
from transformers.cache_utils import Cache

from engine.config import SpecSettings, TreeSpec
from engine.drafters.model import ModelDraftState
from engine.kv.layouts import CacheLayout, new_cache
from engine.kv.ops import cache_len, prefill
from engine.models.device import timed
from engine.models.loading import LoadedModel
from engine.trace.schema import DYNAMIC_TREE, ROOT
from engine.tree.attention import tree_forward
from engine.tree.compact import Rollback, compact, slots_held
from engine.tree.shape import DraftTree, expand_dynamic, expand_static, keep_best, level_width


@dataclass
class TreeDraft:
    tree: DraftTree
    fed_slots: dict[int, int]  # node (ROOT included) -> the draft cache slot holding its K/V
    step_times_s: list[float] = field(default_factory=list)  # one per batched draft forward


def confidence(logits: torch.Tensor, s: SpecSettings) -> torch.Tensor:
    """(T, V) logits -> (T, V) probabilities the children are ranked by (see the module docstring)."""
    temperature = s.temperature if s.temperature > 0 else 1.0
    return torch.softmax(logits.float() / temperature, dim=-1).cpu()


def grow(tree: DraftTree, frontier: list[int], probs: torch.Tensor, spec: TreeSpec, depth: int) -> list[int]:
    """Add the children of `frontier` at `depth`; return the nodes to expand next."""
    if spec.kind == DYNAMIC_TREE:
        return expand_dynamic(tree, frontier, probs, spec.top_k)
    return expand_static(tree, frontier, probs, level_width(spec, depth))


# (tree, frontier, slots) -> (len(frontier), V_full) logits: one forward over the frontier's nodes (ROOT alone
# at depth 1), recording in `slots` the cache slot each of them was written to
LevelFeed = Callable[[DraftTree, list[int], dict[int, int]], torch.Tensor]


def place_level(cache: Cache, tree: DraftTree, frontier: list[int], slots: dict[int, int],
                prefix_len: int) -> tuple[list[int], list[list[int]]]:
    """Give the frontier's nodes the cache's next slots, in order; return their positions (prefix_len + depth,
    the root at prefix_len) and the slots each attends to beyond the prefix (the root, its ancestors, itself)."""
    start = cache_len(cache)
    for j, node in enumerate(frontier):
        slots[node] = start + j
    paths = [[] if node == ROOT else tree.path_to(node) for node in frontier]
    positions = [prefix_len + len(path) for path in paths]
    attends = [[slots[ROOT]] + [slots[a] for a in path] for path in paths]
    return positions, attends


def level_tokens(tree: DraftTree, frontier: list[int], root_id: int) -> list[int]:
    return [root_id if node == ROOT else tree.token_ids[node] for node in frontier]


def feed_level(model: LoadedModel, cache, prefix_len: int, root_id: int, tree: DraftTree, frontier: list[int],
               slots: dict[int, int]) -> torch.Tensor:
    """The draft model's LevelFeed: one forward over the frontier's nodes."""
    positions, attends = place_level(cache, tree, frontier, slots, prefix_len)
    return tree_forward(model, level_tokens(tree, frontier, root_id), positions, attends, prefix_len, cache)


def grow_tree(feed: LevelFeed, spec: TreeSpec, s: SpecSettings, device: torch.device) -> TreeDraft:
    """Grow this cycle's tree one level per `feed` call (timed each); dynamic trees are reranked at the end."""
    tree, slots, times = DraftTree(), {}, []
    frontier = [ROOT]
    for depth in range(1, spec.max_depth + 1):
        logits, elapsed = timed(partial(feed, tree, frontier, slots), device)
        times.append(elapsed)
        frontier = grow(tree, frontier, confidence(logits, s), spec, depth)
        if not frontier:
            break
    if spec.kind == DYNAMIC_TREE:
        tree, order = keep_best(tree, spec.nodes)
        slots = {ROOT: slots[ROOT]} | {new: slots[old] for new, old in enumerate(order) if old in slots}
    return TreeDraft(tree, slots, times)


def draft_tree(model: LoadedModel, cache, root_id: int, spec: TreeSpec, s: SpecSettings) -> TreeDraft:
    """Grow this cycle's tree after `root_id`; the draft cache gains the root and every expanded node."""
    prefix_len = cache_len(cache)  # L: the committed sequence but its last token
    return grow_tree(partial(feed_level, model, cache, prefix_len, root_id), spec, s, model.device)


def roll_back_draft(model: LoadedModel, cache, draft: TreeDraft, path: list[int],
                    committed: list[int], rollback: Rollback = compact) -> tuple[dict, float]:
    """Compact the draft cache to the committed sequence (with `rollback`: `compact` but in a
    teaching fault), then feed what it never saw.
    Returns the compaction record ({kept_slots, moves}) and the catch-up's seconds (0 if none)."""
    prefix_len = draft.fed_slots[ROOT]
    new_len = len(committed) - 1
    kept = [draft.fed_slots[ROOT]]
    for node in path:  # the path's K/V the draft holds: contiguous from the root
        if node not in draft.fed_slots:
            break
        kept.append(draft.fed_slots[node])
    kept = kept[: new_len - prefix_len]
    moves = rollback(cache, prefix_len, kept)
    record = {"kept_slots": slots_held(prefix_len, len(kept), moves), "moves": [list(m) for m in moves]}
    missing = committed[cache_len(cache):new_len]
    if not missing:
        return record, 0.0
    _, elapsed = timed(lambda: model.forward(missing, cache), model.device)
    return record, elapsed


class TreeProposer(Protocol):
    """What drafts a run's trees over the target's tokens, keeping its own cache over the target's positions.

    The tree cycle (engine/tree/cycle.py) calls start once, then per cycle draft, the target's verify,
    and roll_back; the cache it records is `cache(state)`. The draft model's state is the chain
    drafter's ModelDraftState, the EAGLE head's its EagleState: a tree run's RunState holds either."""

    reads_target_features: bool  # the verify pass (and the prefill) must also yield the target's top features

    def start(self, prompt_ids: list[int], layout: CacheLayout, features: torch.Tensor | None) -> Any:
        """Per-run state over prompt_ids[:-1], its cache in `layout`; `features` (len(prompt) - 1, H) are the
        target prefill's top features when reads_target_features (None for a one-token prompt)."""

    def draft(self, state: Any, root_id: int, spec: TreeSpec, s: SpecSettings) -> TreeDraft:
        """This cycle's tree after the root; the cache gains the root and every expanded node."""

    def roll_back(self, state: Any, draft: TreeDraft, path: list[int], committed: list[int],
                  verify_features: torch.Tensor | None, rollback: Rollback = compact) -> tuple[dict, float]:
        """Bring the cache to len(committed) - 1 positions (`committed` already includes this cycle's tokens);
        verify_features (N+1, H) are the verify pass's at [root, nodes] when reads_target_features; `rollback`
        is the compaction the cycle uses (a broken one in a teaching fault only).
        Returns the trace's compaction entry {kept_slots, moves} and the catch-up's seconds (0 if none)."""

    def cache(self, state: Any) -> Cache:
        """The proposer's KV cache (its length and layout state go into the record)."""


@dataclass(frozen=True)
class ModelTreeProposer:
    """Trees from the draft model: its cache is compacted like the target's, then caught up."""

    model: LoadedModel
    reads_target_features: bool = False

    def start(self, prompt_ids: list[int], layout: CacheLayout, features: torch.Tensor | None) -> ModelDraftState:
        return ModelDraftState(prefill(self.model, prompt_ids, new_cache(layout, self.model.model.config)))

    def draft(self, state: ModelDraftState, root_id: int, spec: TreeSpec, s: SpecSettings) -> TreeDraft:
        return draft_tree(self.model, state.cache, root_id, spec, s)

    def roll_back(self, state: ModelDraftState, draft: TreeDraft, path: list[int], committed: list[int],
                  verify_features: torch.Tensor | None, rollback: Rollback = compact) -> tuple[dict, float]:
        return roll_back_draft(self.model, state.cache, draft, path, committed, rollback)

    def cache(self, state: ModelDraftState) -> Cache:
        return state.cache
