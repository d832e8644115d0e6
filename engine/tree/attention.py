"""One forward pass over a draft tree: positions by depth, and a mask that lets each node see its ancestors only.

A chain verify feeds K+1 tokens that each see every slot before them. A tree feeds tokens that
sit side by side in the cache but belong to different continuations: node i must see the
shared prefix, its own ancestors and itself, never a sibling or a cousin. That takes two
things the causal default does not give:
- `position_ids`: a node's RoPE position is its depth below the root, not its slot, so two
  siblings share a position (and each node gets exactly the rotation a chain forward of its
  path would give it);
- a 4D additive float mask (1, 1, T, kv_len): 0 where query t may attend, the dtype's most
  negative finite value elsewhere. transformers returns a 4D mask as given
  (masking_utils._preprocess_mask_arguments) and both sdpa and eager attention add it to the
  scores, so a masked slot gets a softmax weight of exactly 0.

kv_len is the length of the K/V the layout's update hands the attention: for dynamic and
paged the attended positions after the append (cache_len + T), for static the whole
preallocated buffer (slots after the new ones hold stale K/V or zeros and must be masked like
any other). The cache's own `get_mask_sizes` says which, the same figure transformers would
size its causal mask by.
"""
import inspect

import torch
from transformers.cache_utils import Cache

from engine.kv.layouts import ROLL_BACK_LISTENER
from engine.models.loading import LoadedModel, TopFeatureTap
from engine.tree.shape import DraftTree

MASKING_ATTENTION = ("sdpa", "eager")  # implementations that add a float 4D mask to the scores


class TreeUnsupportedError(ValueError):
    """This model or cache cannot run a tree forward (the message says why)."""


def check_tree_capable(model: LoadedModel, cache: Cache) -> None:
    """Refuse, with the reason, what a tree mask would silently get wrong."""
    # A tensor-parallel target shows itself twice: its cache carries the ranks' rollback listener once
    # anything was appended, and its forward (engine/parallel/mirror.py) announces plain appends only.
    takes_mask = "attention_mask" in inspect.signature(model.forward).parameters
    if getattr(cache, ROLL_BACK_LISTENER, None) is not None or not takes_mask:
        raise TreeUnsupportedError("draft trees are not supported on a tensor-parallel target yet "
                                   "(its ranks mirror plain appends and rollbacks, not tree masks and compaction); "
                                   "use a chain drafter")
    check_tree_config(model.model.config)


def check_tree_config(config) -> None:
    """Refuse a model config whose attention would not apply a tree mask to every layer as given
    (the draft model's, the target's, or an EAGLE head's decoder stack)."""
    text = config.get_text_config(decoder=True)
    types = getattr(text, "layer_types", None) or ["full_attention"]
    if any(t != "full_attention" for t in types):
        raise TreeUnsupportedError(f"draft trees need full-attention layers only (this model has {sorted(set(types))}): "
                                   "one tree mask would be applied to every layer, sliding ones included")
    if config._attn_implementation not in MASKING_ATTENTION:
        raise TreeUnsupportedError(f"draft trees need attention that adds a 4D float mask ({', '.join(MASKING_ATTENTION)}); "
                                   f"this model runs {config._attn_implementation!r}")


def check_attends(attends: list[list[int]], prefix_len: int, cache_len: int) -> None:
    """Each query sees its own new slot and nothing written after it in this pass."""
    if not 0 <= prefix_len <= cache_len:
        raise ValueError(f"prefix_len {prefix_len} must lie between 0 and the cache length {cache_len}")
    for t, slots in enumerate(attends):
        own = cache_len + t
        if own not in slots:
            raise ValueError(f"query {t} must attend to its own new slot {own}; it lists {slots}")
        if any(not 0 <= s <= own for s in slots):
            raise ValueError(f"query {t} (slot {own}) may attend to slots 0..{own} only; it lists {slots}")


def tree_mask(attends: list[list[int]], prefix_len: int, kv_len: int, dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:
    """(1, 1, T, kv_len) additive mask: 0 on slots 0..prefix_len-1 and on each row's listed slots."""
    rows = torch.tensor([t for t, slots in enumerate(attends) for _ in slots], dtype=torch.long, device=device)
    cols = torch.tensor([s for slots in attends for s in slots], dtype=torch.long, device=device)
    mask = torch.full((len(attends), kv_len), torch.finfo(dtype).min, dtype=dtype, device=device)
    mask[:, :prefix_len] = 0
    mask[rows, cols] = 0
    return mask[None, None]


def tree_inputs(cache: Cache, positions: list[int], attends: list[list[int]], prefix_len: int,
                dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(position_ids (1, T), 4D additive mask (1, 1, T, kv_len)) for appending T = len(positions) tokens to
    `cache`: query t at RoPE position positions[t], attending to slots 0..prefix_len-1 and attends[t]
    (absolute cache slots, its own new slot included). Any module running over the cache takes them."""
    if not len(positions) == len(attends) > 0:
        raise ValueError(f"a tree forward needs one attends list per position ({len(positions)} positions, "
                         f"{len(attends)} attends)")
    cache_len = int(cache.get_seq_length())
    check_attends(attends, prefix_len, cache_len)
    kv_len, kv_offset = cache.get_mask_sizes(len(positions), 0)  # what the layout's update will hand attention
    assert kv_offset == 0, "full-attention layers read from slot 0"
    mask = tree_mask(attends, prefix_len, int(kv_len), dtype, device)
    return torch.tensor([positions], dtype=torch.long, device=device), mask


def tree_forward(model: LoadedModel, token_ids: list[int], positions: list[int], attends: list[list[int]],
                 prefix_len: int, cache: Cache) -> torch.Tensor:
    """Append K/V for token_ids (T new slots, written at cache slots cache_len..cache_len+T-1) and return
    full-vocabulary float32 logits (T, V_full). Query t sits at RoPE position positions[t] and attends to the
    shared prefix (slots 0..prefix_len-1) plus the absolute cache slots listed in attends[t] (which must include
    its own new slot)."""
    check_tree_capable(model, cache)
    if len(token_ids) != len(positions):
        raise ValueError(f"a tree forward needs one position per token ({len(token_ids)} tokens, "
                         f"{len(positions)} positions)")
    position_ids, mask = tree_inputs(cache, positions, attends, prefix_len, model.dtype, model.device)
    return model.forward(token_ids, cache, position_ids=position_ids, attention_mask=mask)


def verify_layout(tree: DraftTree, cache_len: int) -> tuple[list[int], list[list[int]]]:
    """Positions and attended slots of [root, node0..nodeN-1] appended after cache_len = L slots:
    the root at slot and position L, node i at slot L+1+i and position L+depth(i), seeing the
    root and the slots of its ancestors-or-self."""
    root = cache_len
    positions = [root] + [root + d for d in tree.depths]
    attends = [[root]] + [[root] + [root + 1 + a for a in tree.path_to(i)] for i in range(len(tree))]
    return positions, attends


def verify_tree(model: LoadedModel, root_id: int, tree: DraftTree, cache: Cache) -> torch.Tensor:
    """The target's one verify pass over [root, nodes] (contract: 'Verify'): (N+1, V_full) logits.
    Row 0 is the distribution after the root, row 1+i the one after node i."""
    cache_len = int(cache.get_seq_length())
    positions, attends = verify_layout(tree, cache_len)
    return tree_forward(model, [root_id, *tree.token_ids], positions, attends, cache_len, cache)


def verify_tree_with_features(model: LoadedModel, root_id: int, tree: DraftTree,
                              cache: Cache) -> tuple[torch.Tensor, torch.Tensor]:
    """verify_tree, and the target's top features (N+1, H) at [root, nodes] from the same pass (an EAGLE
    head drafts from them): the tap sits on the module that forward really runs, as forward_with_features'."""
    with TopFeatureTap(model.runner_for(len(tree) + 1)) as tap:
        logits = verify_tree(model, root_id, tree, cache)
    return logits, tap.features
