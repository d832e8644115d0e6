"""Trees from the EAGLE head: its levels read predicted features, its rollback re-feeds true ones.

Positions and features follow engine/drafters/eagle.py: the head's entry at position p reads the
token x_p with the feature f_{p-1} and predicts f_p, from which the target's norm and output layer
give q(x_{p+1}). At a cycle's start the committed sequence has length C, the head's cache holds
L = C - 1 entries built on the target's true features, and the root is x_{C-1}.
- Depth 1 feeds the root at position L with the target's own f_{L-1} (the chain's first step);
  the feature it predicts gives the root's children.
- Depth d+1 feeds, in one batched head forward, the level's expanded nodes (static: the whole
  level; dynamic: the frontier), each with its token and its parent's predicted feature (the
  root's for a child of the root), at position L + depth(node), under the tree mask of
  engine/tree/attention.py: the prefix, the root's entry and its own ancestors' entries. The
  feature it predicts gives its children.
- The target's one verify pass over [root, nodes] also yields its true features there
  (attention.verify_tree_with_features).

Why the head is cropped and re-fed rather than compacted. Every head entry after the root's was
built from a predicted feature: a path node's entry fused its token with its parent's prediction,
where a head filled over the committed sequence fuses it with the target's true feature at that
position. Compacting the path's entries next to the root, as the draft model's cache is compacted,
would keep K/V that no fresh fill holds, and every later query would attend to them: the head was
trained on entries built from true features (the chain keeps none of its predicted entries either).
So the head's cache is cropped to the root's entry (built on the true f_{L-1}) and the committed
tokens after the root are fed again with the target's true features, the verify's rows at the root
and along the path: exactly the chain's catch-up (EagleDrafter.roll_back). Between cycles the head
then holds committed length - 1 entries equal to a fresh fill, and the trace's draft compaction is
{kept_slots: [L], moves: []}.
"""
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import Cache

from engine.config import SpecSettings, TreeSpec
from engine.drafters.eagle import EagleDrafter, EagleState
from engine.kv.layouts import CacheLayout
from engine.kv.ops import cache_len
from engine.trace.schema import ROOT
from engine.tree.attention import check_tree_config, tree_inputs
from engine.tree.compact import Rollback, compact
from engine.tree.draft import TreeDraft, grow_tree, level_tokens, place_level
from engine.tree.shape import DraftTree


@torch.inference_mode()
def head_tree_forward(drafter: EagleDrafter, cache: Cache, token_ids: list[int], prev_features: torch.Tensor,
                      positions: list[int], attends: list[list[int]], prefix_len: int) -> torch.Tensor:
    """Append the head's entries for T tree nodes: token_ids[t] read with prev_features[t] (T, H) at RoPE
    position positions[t], attending to slots 0..prefix_len-1 and attends[t]. Returns predicted features (T, H)."""
    device = drafter.target.device
    position_ids, mask = tree_inputs(cache, positions, attends, prefix_len, drafter.target.dtype, device)
    ids = torch.tensor(token_ids, device=device)
    normed = drafter.parts.normed(prev_features, first_is_start=positions[0] == 0)  # only a root can sit at 0
    return drafter.head(drafter.parts.embed(ids)[None], normed[None], cache, position_ids, attention_mask=mask)[0]


@dataclass
class HeadLevels:
    """The head's LevelFeed (engine/tree/draft.py) for one cycle; it keeps each fed node's predicted
    feature, which that node's children read."""

    drafter: EagleDrafter
    state: EagleState
    root_id: int
    prefix_len: int  # L: the head's entries before the root
    predicted: dict[int, torch.Tensor] = field(default_factory=dict)  # node (ROOT included) -> (H,) its prediction

    def prev_features(self, tree: DraftTree, frontier: list[int]) -> torch.Tensor:
        """(T, H) what each frontier node reads: the target's f_{L-1} for the root, else its parent's prediction."""
        if frontier == [ROOT]:
            return self.drafter.prev_true_features(self.state, self.prefix_len, 1)
        return torch.stack([self.predicted[tree.parents[node]] for node in frontier])

    @torch.inference_mode()
    def __call__(self, tree: DraftTree, frontier: list[int], slots: dict[int, int]) -> torch.Tensor:
        """One head forward over the frontier's nodes: (len(frontier), V_full) logits of their children."""
        positions, attends = place_level(self.state.cache, tree, frontier, slots, self.prefix_len)
        out = head_tree_forward(self.drafter, self.state.cache, level_tokens(tree, frontier, self.root_id),
                                self.prev_features(tree, frontier), positions, attends, self.prefix_len)
        self.predicted.update(zip(frontier, out))
        return self.drafter.parts.logits(out)


@dataclass(frozen=True)
class EagleTreeProposer:
    """Trees from the EAGLE head (a TreeProposer): the target's features in, a tree mask on the head's cache."""

    drafter: EagleDrafter
    reads_target_features: bool = True

    def __post_init__(self) -> None:
        check_tree_config(self.drafter.head.config)  # the head's decoder stack must apply the tree mask as given

    def start(self, prompt_ids: list[int], layout: CacheLayout, features: torch.Tensor | None) -> EagleState:
        return self.drafter.start(prompt_ids, layout, features)

    def draft(self, state: EagleState, root_id: int, spec: TreeSpec, s: SpecSettings) -> TreeDraft:
        prefix_len = cache_len(state.cache)
        state.true_len = prefix_len + 1  # the root's entry reads the target's feature; every later one a prediction
        return grow_tree(HeadLevels(self.drafter, state, root_id, prefix_len), spec, s, self.drafter.target.device)

    def roll_back(self, state: EagleState, draft: TreeDraft, path: list[int], committed: list[int],
                  verify_features: torch.Tensor | None, rollback: Rollback = compact) -> tuple[dict, float]:
        """Crop to the root's entry and feed the committed tokens after it with true features (module docstring).
        The head is never compacted, so `rollback` (the target's, broken in a teaching fault) does not apply."""
        if verify_features is None:
            raise ValueError("the EAGLE head's rollback needs the verify pass's features")
        rows = [0, *(1 + node for node in path)]  # the target's f at the root and along the path: f_L, f_{L+1}, ...
        self.drafter.take_target_features(state, verify_features[rows])
        catch_up = self.drafter.roll_back(state, committed)
        return {"kept_slots": [draft.fed_slots[ROOT]], "moves": []}, catch_up.time_s

    def cache(self, state: EagleState) -> Cache:
        return state.cache
