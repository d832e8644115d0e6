"""A batched row's cycle as the record a single run of its request writes, and the batch's own record.

A row of a batched cycle is an ordinary chain cycle of one request: its drafts, both models'
probabilities, its draws, its accepted count and its caches' lengths. `row_trace_record` writes
it through the engine's one record builder (engine/cycle/record.py `cycle_record`), so a batched
request's trace reads, checks and steps like any other. Two things are the batch's:
- the layout: each row is a static buffer of the batch's capacity (engine/batch/cache.py), whose
  stale slots are the row's own rejected K/V, or an earlier request's in that row;
- the times: every row of a cycle shares its draft steps, its verify and its d_K forward, so each
  row's record gives the batch's times (the trace header's "batch" says so).
The draft is fed d_K in every cycle, as on the fast path (engine/cycle/fast.py): the record counts
K draft steps and, after a full accept, the d_K forward as the catch-up, as a single run does.

`batch_cycle_record` is one line of the batch trace (batch.jsonl): which request each row ran,
what it accepted, the idle rows and the time split.
"""
from dataclasses import dataclass, field

from engine.batch.records import BatchCycle, RowCycle
from engine.cycle.record import cycle_record
from engine.cycle.step import CycleStep, Settled
from engine.trace.format import CacheLengths


@dataclass
class RowSlots:
    """One row's buffer in one model's cache: the highest slot written so far (any request of the row)."""

    high_water: int = 0

    def state(self, length: int, capacity: int) -> dict:
        """The static layout's state (engine/kv/layouts.py layout_state) at a moment the row holds `length`."""
        self.high_water = max(self.high_water, length)
        return {"write_position": length, "stale_slots": self.high_water - length, "capacity": capacity}


@dataclass
class RowLayout:
    """Both caches' buffers of one row."""

    target: RowSlots = field(default_factory=RowSlots)
    draft: RowSlots = field(default_factory=RowSlots)


def layout_fields(row: RowCycle, draft_appended: int, slots: RowLayout, capacity: int) -> dict:
    """The record's static layout states: before, after the append (the verify's K+1; the draft's K
    steps) and after the rollback. The draft's d_K forward has written one slot more by then."""
    t, d = row.target_cache_len, row.draft_cache_len
    target = {moment: slots.target.state(t[moment], capacity) for moment in ("before", "after_append", "after_rollback")}
    draft = {"before": slots.draft.state(d["before"], capacity),
             "after_append": slots.draft.state(draft_appended, capacity)}
    slots.draft.high_water = max(slots.draft.high_water, d["after_append"])  # the d_K forward's slot
    draft["after_rollback"] = slots.draft.state(d["after_rollback"], capacity)
    return {"target_cache_layout_state": target, "draft_cache_layout_state": draft}


def row_trace_record(c: BatchCycle, row: RowCycle, cycle: int, k: int, slots: RowLayout, capacity: int) -> dict:
    """Row `row` of batched cycle `c` as its request's cycle number `cycle` (engine/cycle/record.py)."""
    t, d = row.target_cache_len, row.draft_cache_len
    keep = t["after_rollback"]  # committed - 1, by the convention
    draft_appended = d["before"] + k  # the K draft steps; d_K's forward is the catch-up when all K pass
    step = CycleStep(row.draft_token_ids[:row.num_accepted], row.next_token_id, list(row.draft_token_ids), k + 1,
                     list(c.draft_step_s), c.verify_s)
    settled = Settled(t, CacheLengths(before=d["before"], after_append=draft_appended,
                                      after_rollback=d["after_rollback"]),
                      layout_fields(row, draft_appended, slots, capacity), min(draft_appended, keep) < keep,
                      c.draft_feed_s)
    return cycle_record(cycle, row.committed_len_before, step, row.committed, row.finished, settled, c.cycle_s,
                        row.description)


def batch_cycle_record(c: BatchCycle, requests: list[int | None], admitted: list[dict]) -> dict:
    """One line of the batch trace: per row the request it ran this cycle (its index in the workload;
    None for an idle row with nothing left to take), its accepted count and its cache lengths; the idle
    rows; the time split; and the requests admitted into finished rows before the next cycle."""
    rows = [{"row": r.row, "request": requests[r.row], "idle": r.idle,
             "num_accepted": None if r.idle else r.num_accepted, "committed": len(r.committed),
             "target_cache_len": r.target_cache_len, "draft_cache_len": r.draft_cache_len} for r in c.rows]
    return {"type": "batch_cycle", "cycle": c.cycle, "rows": rows, "idle_rows": c.idle_rows,
            "draft_time_s": c.draft_s, "verify_time_s": c.verify_s, "bookkeeping_time_s": c.bookkeeping_s,
            "cycle_time_s": c.cycle_s, "admitted": admitted}
