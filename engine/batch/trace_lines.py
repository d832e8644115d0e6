"""The batch trace's cycle line (batch.jsonl, read back by engine/trace/batch_reader.py): per row the request
it ran, its accepted count and cache lengths; the idle rows; the time split; the requests admitted.

Each running row's own cycle record, in its request's ordinary trace, is the driver's
(engine/cycle/trace_record.py), as for every cycle kind.
"""
from engine.batch.report import BatchCycle


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
