"""One Hugging Face forward over B ragged rows of a `RowsKVCache`.

transformers 5.x (Llama-family code, 5.24 here) takes what a ragged batch needs as plain
arguments, as the tree forward (engine/tree/attention.py) uses them for one row:
- `position_ids` (B, T): RoPE positions per row; given, the model never asks the cache for
  a length (there is no cache_position argument in 5.x's decoder forward);
- a 4-D additive float `attention_mask` (B, 1, T, attended): returned as given by
  masking_utils._preprocess_mask_arguments and added to the scores by sdpa and eager
  attention, so a masked slot gets a softmax weight of exactly 0.
Query t of row r sits at position p = lengths[r] + t and sees slots 0..p: the row's valid
slots (< lengths[r]) and what this forward writes up to itself. Every slot after p, stale or
another row's padding, is masked.
"""
import torch

from engine.batch.cache import RowsKVCache
from engine.models.loading import LoadedModel

MASKING_ATTENTION = ("sdpa", "eager")  # attention implementations that add a 4-D float mask


def check_batchable(model: LoadedModel) -> None:
    """Refuse a model whose attention would not apply the 4-D mask as given."""
    implementation = model.model.config._attn_implementation
    if implementation not in MASKING_ATTENTION:
        raise ValueError(f"batched speculation needs attention that adds a 4-D float mask "
                         f"({', '.join(MASKING_ATTENTION)}); {model.name} runs {implementation!r}")


def rows_mask(positions: torch.Tensor, slots_read: int, dtype: torch.dtype) -> torch.Tensor:
    """(B, 1, T, slots_read) additive mask: 0 on slots <= each query's position, the dtype's minimum elsewhere."""
    slots = torch.arange(slots_read, device=positions.device)  # (slots_read,)
    allowed = slots[None, None, :] <= positions[:, :, None]  # (B, T, slots_read)
    mask = torch.full(allowed.shape, torch.finfo(dtype).min, dtype=dtype, device=positions.device)
    return mask.masked_fill(allowed, 0.0)[:, None]


def model_ids(model: LoadedModel, ids: list[list[int]]) -> torch.Tensor:
    """(B, T) ids as the model numbers them (a pruned draft's own rows)."""
    tokens = torch.tensor(ids, dtype=torch.long, device=model.device)
    return tokens if model.full_to_row is None else model.full_to_row[tokens]


@torch.inference_mode()
def forward_rows(model: LoadedModel, cache: RowsKVCache, ids: list[list[int]], appended: list[int],
                 logits: bool = True) -> torch.Tensor | None:
    """Write K/V for `ids` (B rows of T tokens) at each row's own offset, then advance row r by
    `appended[r]` (<= T: the rest is padding, left as stale slots). Returns full-vocabulary float32
    logits (B, T, V_full) on the model's device, or None when `logits` is False (a prefill)."""
    b, t = len(ids), len(ids[0])
    positions = cache.positions(t, model.device)  # (B, T)
    mask = rows_mask(positions, max(cache.lengths) + t, model.dtype)  # the slots cache.attended will return
    extra = {"logits_to_keep": 1} if not logits and model.can_skip_logits else {}
    cache.begin_append(positions)
    try:
        out = model.runner_for(b * t)(input_ids=model_ids(model, ids), position_ids=positions, attention_mask=mask,
                                      use_cache=True, **{model.cache_arg: cache}, **extra)
    finally:
        cache.pending_slots = None
    cache.end_append(appended)
    if not logits:
        return None
    v = out.logits.shape[-1]
    return model.full_vocab_logits(out.logits.reshape(b * t, v)).reshape(b, t, -1)
