"""Tree drafting with the draft model: one batched forward per depth, under a tree mask.

Depth 1 is one forward over the root (the last committed token). Depth d+1 is one forward
over the level-d nodes being expanded (all of a static tree's level, a dynamic tree's
frontier), each attending to the prefix, the root and its own ancestors in the draft's
cache. The deepest level is never fed: its children are not proposed.

Children are chosen by the draft's confidence: the softmax of its logits at the run's
temperature (1 for greedy runs, where the warped distribution is one-hot and would leave a
single child per node). The acceptance walk treats every child as a deterministic (one-hot)
proposal, so how children are ranked changes how often they are accepted, never what the
output's distribution is.
"""
from dataclasses import dataclass, field
from functools import partial

import torch

from engine.config import SpecSettings, TreeSpec
from engine.kv.ops import cache_len
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


def feed_level(model: LoadedModel, cache, tree: DraftTree, frontier: list[int], slots: dict[int, int],
               prefix_len: int, root_id: int) -> torch.Tensor:
    """One draft forward over the frontier's nodes (ROOT alone at depth 1): (len(frontier), V) logits."""
    start = cache_len(cache)
    for j, node in enumerate(frontier):
        slots[node] = start + j
    ids = [root_id if node == ROOT else tree.token_ids[node] for node in frontier]
    positions = [prefix_len + (0 if node == ROOT else len(tree.path_to(node))) for node in frontier]
    attends = [[slots[ROOT]] + [slots[a] for a in ([] if node == ROOT else tree.path_to(node))] for node in frontier]
    return tree_forward(model, ids, positions, attends, prefix_len, cache)


def draft_tree(model: LoadedModel, cache, root_id: int, spec: TreeSpec, s: SpecSettings) -> TreeDraft:
    """Grow this cycle's tree after `root_id`; the draft cache gains the root and every expanded node."""
    prefix_len = cache_len(cache)  # L: the committed sequence but its last token
    tree, slots, times = DraftTree(), {}, []
    frontier = [ROOT]
    for depth in range(1, spec.max_depth + 1):
        logits, elapsed = timed(partial(feed_level, model, cache, tree, frontier, slots, prefix_len, root_id),
                                model.device)
        times.append(elapsed)
        frontier = grow(tree, frontier, confidence(logits, s), spec, depth)
        if not frontier:
            break
    if spec.kind == DYNAMIC_TREE:
        tree, order = keep_best(tree, spec.nodes)
        slots = {ROOT: slots[ROOT]} | {new: slots[old] for new, old in enumerate(order) if old in slots}
    return TreeDraft(tree, slots, times)


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
