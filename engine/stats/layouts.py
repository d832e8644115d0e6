"""What a trace says about its KV-cache layout: slots attended, held, stale, and blocks moved.

The fields were checked when the trace was loaded (engine/trace/layout_checks.py).
"""
from dataclasses import dataclass, field

from engine.trace.layout_checks import MODELS, layout_of


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
