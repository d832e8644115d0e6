"""Three KV-cache layouts the model writes into, each rolled back the way its engine does.

- dynamic: Hugging Face `DynamicCache`, contiguous tensors that grow by concatenation.
  Rollback slices the tail off (`crop`).
- static: a buffer preallocated to the run's maximum length (gpt-fast, HF `StaticCache`).
  Rollback moves the write position back; the rejected K/V stay in their slots, hidden
  by the causal mask (a query at position p never attends to a slot after p), and the
  next append overwrites them.
- paged: fixed-size blocks drawn from a pool (vLLM PagedAttention). The pool owns each
  layer's (num_blocks, heads, block_size, head_dim) K/V tensors, shared by every sequence
  (cache) drawing from it; a sequence's block table maps the
  sequence's logical blocks to physical block ids, and attention reads K/V gathered
  through that table. Rollback lowers the token count (vLLM's `num_computed_tokens`)
  and returns blocks that lie wholly past it to the free list; a partly filled block
  stays, and its stale slots are overwritten by the next append.

For every layout `get_seq_length()` is the number of positions the model attends to,
so `target_cache_len`/`draft_cache_len` in a trace mean the same thing whatever the
layout. What is particular to a layout (write position, stale slots, block table) is
described by `layout_state` and recorded beside them.
"""
import math
from collections import deque
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, CacheLayerMixin, StaticLayer

from engine.config import SpecSettings
from engine.trace.schema import LAYOUTS

DEFAULT_BLOCK_SIZE = 16

LAYOUT_TEXT = {
    "dynamic": "Contiguous tensors that grow by concatenation (Hugging Face DynamicCache); "
               "rollback slices the rejected tail off.",
    "static": "One buffer preallocated to the run's maximum length (gpt-fast, HF StaticCache); "
              "rollback moves the write position back, rejected K/V stay in place, masked, until overwritten.",
    "paged": "Fixed-size blocks from a pool with a block table (vLLM PagedAttention); rollback lowers the "
             "token count and returns blocks wholly past it to the free list, keeping the partial block.",
}


class CacheFullError(RuntimeError):
    """A static buffer or a block pool has no room for the positions a forward pass appends."""


@dataclass(frozen=True)
class CacheLayout:
    """Which layout to build and how big: `capacity` positions, blocks of `block_size`."""

    name: str = "dynamic"
    capacity: int = 0  # static and paged: the most positions the run can ever hold
    block_size: int = DEFAULT_BLOCK_SIZE  # paged only

    @property
    def num_blocks(self) -> int:
        return math.ceil(self.capacity / self.block_size)

    def describe(self) -> dict:
        """The header entry: what the reader needs to redraw this layout."""
        out = {"name": self.name, "text": LAYOUT_TEXT[self.name]}
        if self.name == "static":
            out["capacity"] = self.capacity
        if self.name == "paged":
            out.update(block_size=self.block_size, pool_blocks=self.num_blocks)
        return out


def check_layout_name(name: str) -> None:
    if name not in LAYOUTS:
        raise ValueError(f"unknown cache layout {name!r}; choose one of {', '.join(LAYOUTS)}")


def run_capacity(prompt_len: int, k: int, max_new_tokens: int, keeps_rejected: bool = False) -> int:
    """Positions a run can hold at its peak: the prompt, every generated token, one verify's K+1.

    A run that deliberately never rolls back (a teaching fault) keeps K+1 per cycle, and a
    run has at most max_new_tokens cycles.
    """
    if keeps_rejected:
        return prompt_len + max_new_tokens * (k + 1) + k + 1
    return prompt_len + max_new_tokens + k + 1


def layout_for_run(s: SpecSettings, prompt_len: int, keeps_rejected: bool = False) -> CacheLayout:
    """The layout `s` asks for, sized for this prompt and these settings."""
    return CacheLayout(s.cache_layout, run_capacity(prompt_len, s.k, s.max_new_tokens, keeps_rejected), s.block_size)


def full_attention_layers(config, what: str = "the static and paged layouts", advice: str = "; use --cache dynamic") -> int:
    """Decoder layers of a model whose every layer attends to the full sequence: the layouts that index
    slots by position (static, paged, a batch's rows) hold nothing else. `what` names who refuses."""
    text = config.get_text_config(decoder=True)
    types = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
    if any(t != "full_attention" for t in types):
        raise ValueError(f"{what} support full-attention models only "
                         f"(this model has layer types {sorted(set(types))}){advice}")
    return len(types)


def new_cache(layout: CacheLayout, config) -> Cache:
    """An empty cache of `layout` for a model with this config."""
    check_layout_name(layout.name)
    if layout.name == "dynamic":
        return DynamicCache(config=config)
    if layout.capacity < 1:
        raise ValueError(f"the {layout.name} layout needs a capacity of at least 1 position")
    num_layers = full_attention_layers(config)
    if layout.name == "static":
        return StaticKVCache(num_layers, layout.capacity)
    return PagedKVCache(num_layers, BlockPool(layout.num_blocks, layout.block_size))


# ---------------------------------------------------------------- static: move the write position

class StaticKVLayer(StaticLayer):
    """HF's static layer, plus the highest slot written before the last rollback (to count stale slots).

    The forward pass stays free of Python bookkeeping (a CUDA graph can capture it): the
    high-water mark is read at rollback time, the only moment the position moves back.
    """

    def __init__(self, max_cache_len: int) -> None:
        super().__init__(max_cache_len=max_cache_len)
        self.high_water = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not torch.compiler.is_compiling():  # eager only: a clear error instead of an index assert
            end = int(self.cumulative_length) + key_states.shape[-2]
            if end > self.max_cache_len:
                raise CacheFullError(f"static cache full: {end} positions needed, {self.max_cache_len} preallocated")
        return super().update(key_states, value_states, *args, **kwargs)  # (B, H, capacity, D) each


class StaticKVCache(Cache):
    """A preallocated buffer per layer; attention sees all of it, the causal mask hides slots after the query."""

    layout = "static"

    def __init__(self, num_layers: int, capacity: int) -> None:
        super().__init__(layers=[StaticKVLayer(capacity) for _ in range(num_layers)])
        self.capacity = capacity

    def write_position(self) -> int:
        return int(self.layers[0].get_seq_length())

    def high_water(self) -> int:
        """One past the highest slot ever written."""
        return max(self.layers[0].high_water, self.write_position())

    def stale_slots(self) -> int:
        """Slots at or after the write position that still hold K/V of rejected tokens."""
        return self.high_water() - self.write_position()


def roll_back_static(cache: StaticKVCache, keep: int) -> None:
    """gpt-fast style: the next append starts at `keep`; nothing is erased.

    Never moves forward: a slot the model has not written must not become attended.
    """
    for layer in cache.layers:
        if layer.is_initialized:
            position = int(layer.cumulative_length)
            layer.high_water = max(layer.high_water, position)
            layer.cumulative_length.fill_(min(position, keep))


# ---------------------------------------------------------------- paged: a block table over a pool

class BlockPool:
    """Blocks of K/V storage and their free list (vLLM's free block queue: allocate from the front, free to the back).

    Every sequence of one model that shares the pool writes into the same per-layer
    tensors (num_blocks, H, block_size, D); a block id means the same slots in every layer.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free: deque[int] = deque(range(num_blocks))
        self.used: set[int] = set()
        self.storage: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # layer index -> (keys, values)

    def layer_storage(self, layer_idx: int, key_states: torch.Tensor,
                      value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's K/V block tensors, allocated at the first write (shape, dtype and device from it)."""
        if layer_idx not in self.storage:
            heads, k_dim, v_dim = key_states.shape[1], key_states.shape[-1], value_states.shape[-1]
            self.storage[layer_idx] = (key_states.new_zeros(self.num_blocks, heads, self.block_size, k_dim),
                                       value_states.new_zeros(self.num_blocks, heads, self.block_size, v_dim))
        return self.storage[layer_idx]

    def allocate(self) -> int:
        if not self.free:
            raise CacheFullError(f"block pool exhausted: all {self.num_blocks} blocks of {self.block_size} slots in use")
        block = self.free.popleft()
        self.used.add(block)
        return block

    def release(self, blocks: list[int]) -> None:
        for block in blocks:
            self.used.remove(block)  # KeyError on a double free: a bug, never silent
            self.free.append(block)


class PagedLayer(CacheLayerMixin):
    """One layer of one sequence: its view of the pool's block tensors; the block table belongs to the cache."""

    is_compileable = False
    is_croppable = True

    def __init__(self, cache: "PagedKVCache", layer_idx: int) -> None:
        super().__init__()
        self.cache, self.layer_idx = cache, layer_idx
        self.num_tokens = 0  # positions the model attends to (vLLM: num_computed_tokens)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        if key_states.shape[0] != 1:
            raise ValueError("the paged layout here holds one sequence per cache (batch size 1)")
        self.device = key_states.device
        self.keys, self.values = self.cache.pool.layer_storage(self.layer_idx, key_states, value_states)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write the new K/V into their slots, then return every attended position in order."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n_new = key_states.shape[-2]
        blocks, offsets = self.cache.slots(self.num_tokens, n_new)  # (T,), (T,)
        self.keys[blocks, :, offsets] = key_states[0].transpose(0, 1)  # (T, H, D)
        self.values[blocks, :, offsets] = value_states[0].transpose(0, 1)
        self.num_tokens += n_new
        return self.gather()

    def gather(self) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V of positions 0..num_tokens-1 read through the block table: (1, H, T, D) each."""
        table = self.cache.table_tensor(self.num_tokens, self.device)  # (blocks,)
        return _read_blocks(self.keys, table, self.num_tokens), _read_blocks(self.values, table, self.num_tokens)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.num_tokens + query_length, 0

    def get_seq_length(self) -> int:
        return self.num_tokens

    def get_max_length(self) -> int:
        return -1


def _read_blocks(pool: torch.Tensor, table: torch.Tensor, num_tokens: int) -> torch.Tensor:
    heads, dim = pool.shape[1], pool.shape[3]
    blocks = pool[table]  # (blocks, H, block_size, D)
    return blocks.transpose(0, 1).reshape(heads, -1, dim)[:, :num_tokens].unsqueeze(0)  # (1, H, T, D)


class PagedKVCache(Cache):
    """One sequence's block table over a pool; every layer uses the same block ids (as in vLLM)."""

    layout = "paged"

    def __init__(self, num_layers: int, pool: BlockPool) -> None:
        self.pool = pool
        self.block_table: list[int] = []  # logical block i -> physical block id
        self.events: list[tuple[str, int]] = []  # ("alloc" | "free", block id), in order
        super().__init__(layers=[PagedLayer(self, i) for i in range(num_layers)])

    @property
    def block_size(self) -> int:
        return self.pool.block_size

    def slots(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Physical (block, offset) of positions start..start+count-1, allocating blocks as needed."""
        while len(self.block_table) * self.block_size < start + count:
            block = self.pool.allocate()
            self.block_table.append(block)
            self.events.append(("alloc", block))
        positions = torch.arange(start, start + count)
        table = torch.tensor(self.block_table)
        device = self.layers[0].device if self.layers[0].is_initialized else None
        return table[positions // self.block_size].to(device), (positions % self.block_size).to(device)

    def table_tensor(self, num_tokens: int, device) -> torch.Tensor:
        return torch.tensor(self.block_table[: math.ceil(num_tokens / self.block_size)], device=device)


def roll_back_paged(cache: PagedKVCache, keep: int) -> None:
    """vLLM style: num_computed_tokens = keep; blocks wholly past it go back to the free list."""
    for layer in cache.layers:
        layer.num_tokens = min(layer.num_tokens, keep)
    needed = math.ceil(keep / cache.block_size)
    freed = cache.block_table[needed:]
    del cache.block_table[needed:]
    cache.pool.release(freed)
    cache.events += [("free", b) for b in freed]


# ---------------------------------------------------------------- one rollback entry point

def roll_back_dynamic(cache: DynamicCache, keep: int) -> None:
    """Slice off every position at or after `keep` (portable across transformers 4.x and 5.x)."""
    extra = int(cache.get_seq_length()) - keep
    if extra > 0:
        cache.crop(-extra)


ROLL_BACK_LISTENER = "on_roll_back"  # the attribute a cache shared by tensor-parallel ranks carries


def roll_back_cache(cache: Cache, keep: int) -> None:
    """Bring `cache` to `keep` attended positions the way its layout does it.

    A tensor-parallel target's cache on rank 0 carries a listener (engine/parallel/mirror.py)
    that tells the other ranks to roll their shard of the K/V heads back to the same length."""
    if isinstance(cache, StaticKVCache):
        roll_back_static(cache, keep)
    elif isinstance(cache, PagedKVCache):
        roll_back_paged(cache, keep)
    else:
        roll_back_dynamic(cache, keep)
    listener = getattr(cache, ROLL_BACK_LISTENER, None)
    if listener is not None:
        listener(keep)


def layout_name(cache: Cache) -> str:
    return getattr(cache, "layout", "dynamic")


# ---------------------------------------------------------------- what the trace records

def static_layout_state(write_position: int, high_water: int, capacity: int) -> dict:
    """A static buffer's facts at one moment: where the next append writes, the slots past it that an
    earlier append filled (stale, masked, overwritten later) and its size. `high_water` is one past the
    highest slot written so far."""
    return {"write_position": write_position, "stale_slots": max(high_water, write_position) - write_position,
            "capacity": capacity}


def layout_state(cache: Cache) -> dict:
    """The layout's own facts at one moment, as plain data for the trace."""
    name = layout_name(cache)
    if name == "static":
        return static_layout_state(cache.write_position(), cache.high_water(), cache.capacity)
    if name == "paged":
        return {"block_table": list(cache.block_table), "num_tokens": int(cache.get_seq_length()),
                "blocks_used": len(cache.pool.used), "blocks_free": len(cache.pool.free),
                "pool_blocks": cache.pool.num_blocks, "events": len(cache.events)}
    return {"slots_allocated": int(cache.get_seq_length())}


def cycle_layout_state(cache: Cache, before: dict, after_append: dict) -> dict:
    """Before / after append / after rollback of one cycle; for paged, the blocks it allocated and freed."""
    after = layout_state(cache)
    out = {"before": before, "after_append": after_append, "after_rollback": after}
    if layout_name(cache) == "paged":
        events = cache.events[before.pop("events"):after.pop("events")]
        after_append.pop("events")
        out["blocks_allocated"] = [b for kind, b in events if kind == "alloc"]
        out["blocks_freed"] = [b for kind, b in events if kind == "free"]
        out["pool_occupancy"] = after["blocks_used"] / after["pool_blocks"]
    return out


def layout_states(target_cache, draft_cache) -> tuple[dict | None, dict | None]:
    """The layout facts of the target's and (if the drafter keeps one) the draft's cache."""
    return (None if target_cache is None else layout_state(target_cache),
            None if draft_cache is None else layout_state(draft_cache))


def cycle_layout_fields(target_cache, draft_cache, before: tuple, after_append: tuple) -> dict:
    """Layout state of one cycle; none for a dynamic cache (its state is its length), and none
    for the draft when the drafter keeps no cache over the target's positions."""
    if layout_name(target_cache) == "dynamic":
        return {}
    fields = {"target_cache_layout_state": cycle_layout_state(target_cache, before[0], after_append[0])}
    if draft_cache is not None:
        fields["draft_cache_layout_state"] = cycle_layout_state(draft_cache, before[1], after_append[1])
    return fields


def attended_kv(cache: Cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the K/V of the positions the model attends to, in order: (1, H, T, D) each."""
    n = int(cache.get_seq_length())
    if layout_name(cache) == "paged":
        return [layer.gather() for layer in cache.layers]
    return [(layer.keys[:, :, :n], layer.values[:, :, :n]) for layer in cache.layers if layer.is_initialized]


def kv_bytes_held(cache: Cache) -> int:
    """Bytes of K/V memory this sequence holds now: tensors (dynamic), the whole buffer (static), its blocks (paged)."""
    layers = [layer for layer in cache.layers if layer.is_initialized]
    if layout_name(cache) == "paged":
        per_block = sum((layer.keys[0].numel() + layer.values[0].numel()) * layer.keys.element_size() for layer in layers)
        return per_block * len(cache.block_table)
    return sum((layer.keys.numel() + layer.values.numel()) * layer.keys.element_size() for layer in layers)


def kv_bytes_reserved(cache: Cache) -> int:
    """Bytes of K/V tensors allocated behind this cache: for paged, the whole pool (shared by every sequence it serves)."""
    if layout_name(cache) == "paged":
        return sum((k.numel() + v.numel()) * k.element_size() for k, v in cache.pool.storage.values())
    return sum((layer.keys.numel() + layer.values.numel()) * layer.keys.element_size()
               for layer in cache.layers if layer.is_initialized)


def check_invariants(cache: Cache) -> None:
    """Raise AssertionError if the layout's bookkeeping disagrees with itself."""
    lengths = {int(layer.get_seq_length()) for layer in cache.layers if layer.is_initialized}
    assert len(lengths) <= 1, f"layers disagree on the cache length: {lengths}"
    name = layout_name(cache)
    if name == "static":
        assert 0 <= cache.write_position() <= cache.high_water() <= cache.capacity
    if name == "paged":
        pool, table = cache.pool, cache.block_table
        assert len(pool.free) + len(pool.used) == pool.num_blocks, "a block leaked or was counted twice"
        assert len(set(pool.free)) == len(pool.free) and not set(pool.free) & pool.used
        assert len(set(table)) == len(table) and set(table) <= pool.used
        n = int(cache.get_seq_length())
        assert len(table) == math.ceil(n / cache.block_size), f"{len(table)} blocks for {n} positions"
