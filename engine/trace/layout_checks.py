"""The checks a trace's KV-cache layout fields must pass.

A trace written before layouts were recorded has no `cache_layout` header: it was a
dynamic cache, and its cache lengths are all there is to report.
"""
import math

from engine.trace.schema import LAYOUTS, MAX_BLOCK_SIZE

MODELS = ("target", "draft")
MOMENTS = ("before", "after_append", "after_rollback")
MAX_SLOTS = 10_000_000  # far beyond any run this engine can make (MAX_NEW_TOKENS * (MAX_K + 1) + a prompt)


class LayoutFieldError(ValueError):
    """A trace's layout fields disagree with its header or its cache lengths."""


def layout_of(header: dict) -> dict:
    """The header's layout entry; traces from before layouts were recorded used a dynamic cache."""
    return header.get("cache_layout") or {"name": "dynamic"}


def _int_in(value, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def check_layout_header(header: dict) -> None:
    if "cache_layout" not in header:
        return
    layout = header["cache_layout"]
    if not isinstance(layout, dict) or layout.get("name") not in LAYOUTS:
        raise LayoutFieldError(f"cache_layout must name one of {', '.join(LAYOUTS)}")
    if layout["name"] == "static" and not _int_in(layout.get("capacity"), 1, MAX_SLOTS):
        raise LayoutFieldError("cache_layout.capacity must be a whole number of positions")
    if layout["name"] == "paged" and not (_int_in(layout.get("block_size"), 1, MAX_BLOCK_SIZE)
                                          and _int_in(layout.get("pool_blocks"), 1, MAX_SLOTS)):
        raise LayoutFieldError(f"cache_layout.block_size must be 1..{MAX_BLOCK_SIZE} and pool_blocks a whole number")


def check_layout_cycle(header: dict, c: dict) -> None:
    """Each moment's layout state agrees with the cache length recorded beside it."""
    if header.get("cache_layout", {}).get("name", "dynamic") == "dynamic":
        return  # a dynamic cache's state is its length; its cycles carry no layout fields
    layout = header["cache_layout"]
    for model in MODELS:
        states, lengths = c.get(f"{model}_cache_layout_state"), c[f"{model}_cache_len"]
        if lengths is None:
            continue  # a drafter without a cache over the target's positions (prompt lookup, other tokenizer)
        if not isinstance(states, dict) or not all(isinstance(states.get(m), dict) for m in MOMENTS):
            raise LayoutFieldError(f"{model}_cache_layout_state needs before, after_append and after_rollback")
        for moment in MOMENTS:
            where = f"{model}_cache_layout_state.{moment}"
            _check_state(layout, states[moment], lengths[moment], where)
        if layout["name"] == "paged":
            _check_block_lists(layout, states, f"{model}_cache_layout_state")


def _check_state(layout: dict, s: dict, cache_len: int, where: str) -> None:
    name = layout["name"]
    if name == "static":
        cap = layout["capacity"]
        if s.get("write_position") != cache_len or not _int_in(s.get("stale_slots"), 0, cap - cache_len):
            raise LayoutFieldError(f"{where}: write_position must equal the cache length {cache_len} "
                                   f"and stale_slots fit in the {cap}-slot buffer after it")
    if name == "paged":
        table, pool = s.get("block_table"), layout["pool_blocks"]
        if (s.get("num_tokens") != cache_len or not isinstance(table, list)
                or not all(_int_in(b, 0, pool - 1) for b in table) or len(set(table)) != len(table)
                or len(table) != math.ceil(cache_len / layout["block_size"])
                or not _int_in(s.get("blocks_used"), len(table), pool) or s.get("blocks_free") != pool - s["blocks_used"]):
            raise LayoutFieldError(f"{where}: the block table must hold ceil({cache_len} / block size) distinct "
                                   f"blocks of a {pool}-block pool, and used + free must equal the pool")


def _check_block_lists(layout: dict, states: dict, where: str) -> None:
    for name in ("blocks_allocated", "blocks_freed"):
        blocks = states.get(name)
        if not isinstance(blocks, list) or not all(_int_in(b, 0, layout["pool_blocks"] - 1) for b in blocks):
            raise LayoutFieldError(f"{where}.{name} must list block ids of the pool")
