"""Rollback after a tree: the accepted path's K/V moved next to the committed prefix, the rest discarded.

After a verify the cache holds the prefix, the root and every drafted node, side by side in
slots L, L+1, ...; only the root and the accepted path are part of the committed sequence.
Compaction keeps slots 0..start-1 as they are, moves the kept slots down to start,
start+1, ... in order, and then rolls the cache back to start + len(kept_slots) with the
layout's own rollback (engine/kv/layouts.py), so what a layout does with the tail stays
its own:
- dynamic: the kept slots are copied down inside each layer's (B, H, T, D) tensors, then
  the tail is sliced off (`crop`).
- static: the same copy inside the preallocated (B, H, capacity, D) buffer, then the write
  position moves back; the high-water mark stays, so everything from the new write position
  up to it counts as stale (the discarded nodes and the old copies of moved slots). Those
  slots lie after every later query's position, so the causal mask hides them, and the next
  append overwrites them.
- paged: a slot lives at (block_table[slot // block_size], slot % block_size) in the pool's
  per-layer (num_blocks, H, block_size, D) tensors; the copy goes through the table, then
  the token count drops and blocks wholly past it return to the free list.

Why copying in place is safe: kept slots are increasing and none is below `start`, so the
j-th kept slot is at least start + j; every move goes down (dst <= src). Each layer's moves
are one batched indexed copy, and an indexed read (`t[..., src, :]`) materialises a new
tensor before the write, so a destination that is also a later move's source is read
before it is overwritten. A path that moves nothing (a chain-shaped path through first
children, or the empty path) is a plain rollback.
"""
from collections.abc import Callable

import torch
from transformers.cache_utils import Cache

from engine.kv.layouts import ROLL_BACK_LISTENER, PagedKVCache, roll_back_cache
from engine.tree.attention import TreeUnsupportedError

# A rollback after a tree: (cache, start, kept_slots) -> the moves (src, dst) it made. Runs use
# `compact` below; only the teaching code passes another (engine/teaching/faults.py TreeFaults).
Rollback = Callable[[Cache, int, list[int]], list[tuple[int, int]]]


def plan_moves(start: int, kept_slots: list[int], cache_len: int) -> list[tuple[int, int]]:
    """(src, dst) for each kept slot that changes place; raises on kept slots compaction cannot keep."""
    if not 0 <= start <= cache_len:
        raise ValueError(f"compaction start {start} must lie between 0 and the cache length {cache_len}")
    if any(b <= a for a, b in zip(kept_slots, kept_slots[1:])):
        raise ValueError(f"kept slots must be strictly increasing, got {kept_slots}")
    if kept_slots and not start <= kept_slots[0] <= kept_slots[-1] < cache_len:
        raise ValueError(f"kept slots must lie in {start}..{cache_len - 1}, got {kept_slots}")
    return [(src, start + j) for j, src in enumerate(kept_slots) if src != start + j]


def slot_index(cache: Cache, slots: list[int], device: torch.device) -> tuple:
    """The index that picks these absolute slots out of one layer's K (or V) tensor."""
    where = torch.tensor(slots, dtype=torch.long, device=device)  # (M,)
    if isinstance(cache, PagedKVCache):  # pool tensors (num_blocks, H, block_size, D): picks (M, H, D)
        table = torch.tensor(cache.block_table, dtype=torch.long, device=device)
        return table[where // cache.block_size], slice(None), where % cache.block_size
    return slice(None), slice(None), where  # (B, H, T, D): picks (B, H, M, D)


@torch.inference_mode()  # the caches' tensors were made in inference mode; writing them needs it too
def move_slots(cache: Cache, moves: list[tuple[int, int]]) -> None:
    """Copy every move's K/V from src to dst in every layer, as one indexed copy per tensor."""
    srcs, dsts = [s for s, _ in moves], [d for _, d in moves]
    for layer in cache.layers:
        if not layer.is_initialized or layer.keys.numel() == 0:
            continue
        src, dst = slot_index(cache, srcs, layer.keys.device), slot_index(cache, dsts, layer.keys.device)
        for tensor in (layer.keys, layer.values):
            tensor[dst] = tensor[src]  # the read is a copy: overlapping moves are safe


def compact(cache: Cache, start: int, kept_slots: list[int]) -> list[tuple[int, int]]:
    """Keep the cache's slots 0..start-1 untouched, then put kept_slots (increasing absolute slots, each >= start)
    at start, start+1, ...; discard every other slot from `start` on. Returns the moves (src, dst) with src != dst."""
    if getattr(cache, ROLL_BACK_LISTENER, None) is not None:
        raise TreeUnsupportedError("tree compaction is not supported on a tensor-parallel cache yet "
                                   "(its ranks mirror plain rollbacks only)")
    if any(getattr(layer, "is_sliding", False) for layer in cache.layers):
        raise TreeUnsupportedError("tree compaction needs full-attention cache layers (a sliding layer drops old slots)")
    moves = plan_moves(start, kept_slots, int(cache.get_seq_length()))
    if moves:
        move_slots(cache, moves)
    roll_back_cache(cache, start + len(kept_slots))
    return moves


def slots_held(start: int, count: int, moves: list[tuple[int, int]]) -> list[int]:
    """After a rollback that made `moves`, the slot whose K/V each of start..start+count-1 now holds:
    the kept slots themselves after `compact`, start..start+count-1 after a rollback that moved nothing."""
    came_from = {dst: src for src, dst in moves}
    return [came_from.get(start + j, start + j) for j in range(count)]
