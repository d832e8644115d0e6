"""What a trace says about its KV-cache layout: the checks its layout fields must pass and their statistics.

A trace written before layouts were recorded has no `cache_layout` header: it was a
dynamic cache, and its cache lengths are all there is to report.
"""
import math
from dataclasses import dataclass, field

from .config import LAYOUTS, MAX_BLOCK_SIZE

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


# ---------------------------------------------------------------- statistics

@dataclass
class ModelLayoutStats:
    peak_slots_attended: int  # the most positions the model attended to (after a verify's append)
    peak_slots_held: int  # the most K/V slots memory held for this sequence at once
    stale_slots_max: int = 0  # static: rejected K/V left in the buffer after a rollback
    stale_slots_mean: float = 0.0
    blocks_allocated: int = 0  # paged, over the run
    blocks_freed: int = 0
    peak_pool_occupancy: float = 0.0
    unused_slots_mean: float = 0.0  # paged: slots of held blocks past the committed length (internal fragmentation)
    per_cycle_held: list[int] = field(default_factory=list)  # slots held after each append
    per_cycle_unused: list[int] = field(default_factory=list)  # paged: unused slots after each rollback


@dataclass
class LayoutStats:
    name: str
    block_size: int | None
    target: ModelLayoutStats
    draft: ModelLayoutStats | None  # None for a drafter without a cache over the target's positions


def layout_stats(trace) -> LayoutStats:
    layout = layout_of(trace.header)
    per_model = {m: _model_stats(layout, trace.cycles, m) for m in MODELS
                 if all(c[f"{m}_cache_len"] is not None for c in trace.cycles)}
    return LayoutStats(layout["name"], layout.get("block_size"), per_model["target"], per_model.get("draft"))


def _model_stats(layout: dict, cycles: list[dict], model: str) -> ModelLayoutStats:
    attended = [c[f"{model}_cache_len"]["after_append"] for c in cycles] or [0]
    if layout["name"] == "static" and cycles:
        stale = [c[f"{model}_cache_layout_state"]["after_rollback"]["stale_slots"] for c in cycles]
        return ModelLayoutStats(max(attended), layout["capacity"], max(stale), sum(stale) / len(stale),
                                per_cycle_held=[layout["capacity"]] * len(cycles))
    if layout["name"] == "paged" and cycles:
        states = [c[f"{model}_cache_layout_state"] for c in cycles]
        size = layout["block_size"]
        held = [len(s["after_append"]["block_table"]) * size for s in states]
        unused = [len(s["after_rollback"]["block_table"]) * size - s["after_rollback"]["num_tokens"] for s in states]
        return ModelLayoutStats(
            max(attended), max(held), blocks_allocated=sum(len(s["blocks_allocated"]) for s in states),
            blocks_freed=sum(len(s["blocks_freed"]) for s in states),
            peak_pool_occupancy=max(s["after_append"]["blocks_used"] for s in states) / layout["pool_blocks"],
            unused_slots_mean=sum(unused) / len(unused), per_cycle_held=held, per_cycle_unused=unused)
    return ModelLayoutStats(max(attended), max(attended), per_cycle_held=attended if cycles else [])


def layout_lines(ls: LayoutStats) -> list[str]:
    """The layout section of `python -m engine stats`."""
    head = f"KV-CACHE LAYOUT: {ls.name}" + (f" (blocks of {ls.block_size} slots)" if ls.block_size else "")
    lines = [head, "  model   peak attended  peak slots held  stale slots max/mean  blocks alloc/freed  "
                   "peak pool use  unused slots mean"]
    for model in MODELS:
        m: ModelLayoutStats | None = getattr(ls, model)
        if m is None:
            continue  # prompt lookup / other tokenizer: no draft cache over the target's positions
        stale = f"{m.stale_slots_max}/{m.stale_slots_mean:.1f}" if ls.name == "static" else "-"
        blocks = f"{m.blocks_allocated}/{m.blocks_freed}" if ls.name == "paged" else "-"
        occupancy = f"{m.peak_pool_occupancy:.0%}" if ls.name == "paged" else "-"
        unused = f"{m.unused_slots_mean:.1f}" if ls.name == "paged" else "-"
        lines.append(f"  {model:<6}  {m.peak_slots_attended:>13}  {m.peak_slots_held:>15}  {stale:>20}  "
                     f"{blocks:>18}  {occupancy:>13}  {unused:>17}")
    return lines
