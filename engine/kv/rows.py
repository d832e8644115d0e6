"""A KV cache for B ragged rows, one preallocated buffer per layer and one length per row, and the one
Hugging Face forward over it (`forward_rows`).

The engine's static layout (engine/kv/layouts.py, `StaticKVCache`) for one row, widened to B:
each layer holds K and V as (B, H_kv, capacity, D). Row r's valid K/V are slots
0..lengths[r]-1. A forward over T new positions per row writes row r at slots
lengths[r]..lengths[r]+T-1 (its own offset, set by `begin_append` from the forward's
position_ids) and `end_append` then advances each row by the positions it really appended
(a padded prefill row or an idle row appends fewer than T, or none). A row's rollback lowers
its length only: the rejected K/V stay in their slots, hidden by the mask (a query at
position p sees slots 0..p only) and overwritten by that row's next append.

`update` returns the buffers up to the forward's furthest slot (`attended`: the longest row's
length plus the forward's width), not the whole capacity: a batch's capacity is sized for its
longest request, and a short batch would otherwise attend over every empty slot of it in every
forward. `get_mask_sizes` says so. Position == slot in this layout: a row's token at position p is
cached in slot p.
"""
import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from engine.kv.layouts import CacheFullError, attended_kv, full_attention_layers
from engine.kv.ops import prefill
from engine.models.loading import LoadedModel


class RowsKVLayer(CacheLayerMixin):
    """One layer's (B, H_kv, capacity, D) keys and values; where to write comes from the cache."""

    is_compileable = False
    is_croppable = False
    is_sliding = False

    def __init__(self, cache: "RowsKVCache") -> None:
        super().__init__()
        self.cache = cache

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, heads = key_states.shape[:2]
        if b != self.cache.num_rows:
            raise ValueError(f"a forward of {b} rows over a cache of {self.cache.num_rows} rows")
        self.device = key_states.device
        self.keys = key_states.new_zeros(b, heads, self.cache.capacity, key_states.shape[-1])
        self.values = value_states.new_zeros(b, heads, self.cache.capacity, value_states.shape[-1])
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write (B, H, T, D) at each row's slots (B, T); return the buffers up to the furthest slot (B, H, attended, D)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        slots = self.cache.pending_slots  # (B, T)
        rows = torch.arange(slots.shape[0], device=slots.device)[:, None]  # (B, 1)
        self.keys[rows, :, slots] = key_states.transpose(1, 2)  # indexed view is (B, T, H, D)
        self.values[rows, :, slots] = value_states.transpose(1, 2)
        end = self.cache.attended
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cache.attended, 0

    def get_seq_length(self) -> int:
        return max(self.cache.lengths)  # the longest row; the cycle reads each row's own length

    def get_max_length(self) -> int:
        return self.cache.capacity


class RowsKVCache(Cache):
    """B rows over preallocated per-layer buffers; `lengths[r]` is the positions row r attends to."""

    layout = "rows"

    def __init__(self, num_layers: int, batch_size: int, capacity: int) -> None:
        super().__init__(layers=[RowsKVLayer(self) for _ in range(num_layers)])
        self.num_rows, self.capacity = batch_size, capacity
        self.lengths = [0] * batch_size  # host-side: the cycle's bookkeeping reads them every cycle
        self.pending_slots: torch.Tensor | None = None  # (B, T) slots the running forward writes
        self.attended = capacity  # slots the running forward's attention reads: its furthest slot + 1

    def positions(self, width: int, device: torch.device) -> torch.Tensor:
        """(B, width) positions (= slots) of the next forward's inputs: each row from its own length."""
        end = max(self.lengths) + width
        if end > self.capacity:
            raise CacheFullError(f"batched cache full: {end} positions needed, {self.capacity} preallocated")
        start = torch.tensor(self.lengths, dtype=torch.long, device=device)[:, None]
        return start + torch.arange(width, device=device)[None, :]

    def begin_append(self, slots: torch.Tensor) -> None:
        self.pending_slots = slots
        self.attended = max(self.lengths) + slots.shape[1]  # positions() starts each row at its length

    def end_append(self, appended: list[int]) -> None:
        """Each row now attends to `appended[r]` more positions (0 for an idle row)."""
        self.pending_slots = None
        self.lengths = [n + a for n, a in zip(self.lengths, appended, strict=True)]


def num_layers_of(config) -> int:
    """Decoder layers of a model that the batched cache can serve: full attention in every layer."""
    return full_attention_layers(config, "batched speculation and batched plain decoding", "")


def new_rows_cache(config, batch_size: int, capacity: int) -> RowsKVCache:
    return RowsKVCache(num_layers_of(config), batch_size, capacity)


def roll_back_row(cache: RowsKVCache, row: int, keep: int) -> None:
    """Row `row` attends to its first `keep` positions from now on; never moves forward
    (a slot the model has not written for this row must not become attended)."""
    if not 0 <= keep <= cache.lengths[row]:
        raise ValueError(f"row {row}: rollback to {keep} positions, but it holds {cache.lengths[row]}")
    cache.lengths[row] = keep


def row_kv(cache: RowsKVCache, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, row `row`'s valid K/V in order: (1, H, lengths[row], D) each."""
    n = cache.lengths[row]
    return [(layer.keys[row:row + 1, :, :n], layer.values[row:row + 1, :, :n])
            for layer in cache.layers if layer.is_initialized]


@torch.inference_mode()  # the buffers were made by inference-mode forwards
def write_row(cache: RowsKVCache, row: int, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Row `row` now holds `kv` (per layer (1, H, T, D) keys and values: another cache's prefill) in
    slots 0..T-1 and attends to those T positions: how a request joins a batch already running
    (continuous batching), its prompt read alone. The row's older slots past T stay stale."""
    if len(kv) != len(cache.layers):
        raise ValueError(f"{len(kv)} layers of K/V for a cache of {len(cache.layers)} layers")
    n = kv[0][0].shape[2] if kv else 0
    if n > cache.capacity:
        raise CacheFullError(f"a {n}-position row in a batched cache of {cache.capacity} slots")
    for layer, (k, v) in zip(cache.layers, kv):
        if not layer.is_initialized:
            layer.lazy_initialization(k.expand(cache.num_rows, -1, -1, -1), v.expand(cache.num_rows, -1, -1, -1))
        layer.keys[row, :, :n] = k[0]
        layer.values[row, :, :n] = v[0]
    cache.lengths[row] = n


# ---------------------------------------------------------------- one forward over every row
# One Hugging Face forward over B ragged rows of a `RowsKVCache`.
#
# transformers 5.x (Llama-family code, 5.24 here) takes what a ragged batch needs as plain
# arguments, as the tree forward (engine/tree/attention.py) uses them for one row:
# - `position_ids` (B, T): RoPE positions per row; given, the model never asks the cache for
#   a length (there is no cache_position argument in 5.x's decoder forward);
# - a 4-D additive float `attention_mask` (B, 1, T, attended): returned as given by
#   masking_utils._preprocess_mask_arguments and added to the scores by sdpa and eager
#   attention, so a masked slot gets a softmax weight of exactly 0.
# Query t of row r sits at position p = lengths[r] + t and sees slots 0..p: the row's valid
# slots (< lengths[r]) and what this forward writes up to itself. Every slot after p, stale or
# another row's padding, is masked.

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


def prefill_row(model: LoadedModel, cache: RowsKVCache, row: int, prompt_ids: list[int]) -> None:
    """Row `row` caches every prompt token but the last (it opens the first cycle): the prompt is read alone,
    by the engine's prefill of one sequence, and copied into the row's slots."""
    if len(prompt_ids) > 1:
        write_row(cache, row, attended_kv(prefill(model, prompt_ids)))
    else:
        cache.lengths[row] = 0  # nothing to read: the one prompt token opens the first cycle


def prefill_rows(model: LoadedModel, cache: RowsKVCache, prompts_ids: list[list[int]]) -> None:
    """Every row's prompt, each read alone (`prefill_row`). A prefill is compute-bound, so one forward over
    prompts padded to the longest would only add work: with prompts of 35 to 250 positions, a padded batch
    of 16 reads half as many positions again as the prompts hold."""
    for row, prompt_ids in enumerate(prompts_ids):
        prefill_row(model, cache, row, prompt_ids)
