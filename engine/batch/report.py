"""What one batched cycle reports: a `RowCycle` per row, a `BatchCycle` per cycle, read off the driver's
`RowsCycle` (`batch_cycle`) for the benchmarks, the goodput sweep and the batch trace (batch.jsonl).

Plain data, no tensors. An idle row (one that finished in an earlier cycle: its token budget or
an EOS) still has its `RowCycle`, with `idle` set and nothing drafted: it still occupies its
slot in every batched forward, so the cycle counts it (`BatchCycle.idle_rows`) rather than
leaving it out. Each running row's ordinary trace record is the driver's (engine/cycle/trace_record.py).
"""
from dataclasses import dataclass, field

import torch

from engine.cycle.driver import RowsCycle
from engine.trace.format import CacheLengths


@dataclass
class RowCycle:
    row: int
    idle: bool  # finished before this cycle: fed a filler token, appended nothing, decided nothing
    draft_token_ids: list[int] = field(default_factory=list)  # (K,) d1..dK
    p_draft: list[float] = field(default_factory=list)  # (K,) p_draft(d_i), the draft's warped distribution
    p_target: list[float] = field(default_factory=list)  # (K,) p_target(d_i) from the verify pass
    accept_prob: list[float] = field(default_factory=list)  # (K,) min(1, p_target/p_draft)
    u: list[float] = field(default_factory=list)  # one draw per tested position
    num_accepted: int = 0
    next_token_id: int | None = None  # the resampled (at a rejection) or bonus token; None when idle
    committed: list[int] = field(default_factory=list)  # what this cycle made final (cut at EOS / budget)
    finished: bool = False  # this row is done after this cycle
    target_cache_len: CacheLengths | None = None  # before, after the verify's append, after rollback
    draft_cache_len: CacheLengths | None = None  # before, after the K+1 draft forwards, after rollback
    committed_len_before: int = 0  # the row's prompt and committed tokens when the cycle began
    record: dict | None = None  # the row's trace record, as its request's single run writes it


@dataclass
class BatchCycle:
    cycle: int
    rows: list[RowCycle]
    draft_s: float  # the K+1 batched draft forwards and each row's draws
    verify_s: float  # the one batched target forward and its warping
    bookkeeping_s: float  # the rest of the cycle: ratio tests, commits, rollbacks, these records
    draft_step_s: list[float] = field(default_factory=list)  # (K,) each batched draft step (part of draft_s)
    draft_feed_s: float = 0.0  # the d_K forward (part of draft_s)

    @property
    def idle_rows(self) -> int:
        return sum(r.idle for r in self.rows)

    @property
    def active_rows(self) -> int:
        return len(self.rows) - self.idle_rows

    @property
    def cycle_s(self) -> float:
        return self.draft_s + self.verify_s + self.bookkeeping_s


def row_outputs(cycles: list[BatchCycle]) -> list[list[int]]:
    """Each row's generated tokens: its committed tokens, cycle after cycle."""
    if not cycles:
        return []
    outputs: list[list[int]] = [[] for _ in cycles[0].rows]
    for c in cycles:
        for r in c.rows:
            outputs[r.row] += r.committed
    return outputs


def row_cycle(r: int, done: RowsCycle) -> RowCycle:
    """Row r of one driver cycle. The draft cache's lengths are the cache's own: after the append it holds
    the K steps and the d_K forward (the row's trace record counts the d_K forward as the catch-up)."""
    step, settled = done.steps[r], done.settled[r]
    if step is None:
        return RowCycle(r, True, target_cache_len=settled.target_cache_len, draft_cache_len=settled.draft_cache_len,
                        finished=True, committed_len_before=settled.target_cache_len["before"] + 1)
    d = step.detail
    idx, tokens = torch.arange(len(step.draft_token_ids)), step.draft_token_ids
    draft = CacheLengths(before=d.draft_before, after_append=d.draft_appended,
                         after_rollback=settled.draft_cache_len["after_rollback"])
    record = done.records[r]
    return RowCycle(r, False, list(tokens), d.p_draft[idx, tokens].tolist(), d.p_target[idx, tokens].tolist(),
                    d.decision.accept_prob, d.decision.u, d.decision.num_accepted, d.decision.next_token_id,
                    done.committed[r], record["finished"], settled.target_cache_len, draft,
                    record["committed_len_before"], record)


def batch_cycle(done: RowsCycle) -> BatchCycle:
    """One driver cycle of a batch as its report; its time split is every running row's shared one."""
    times = next(step.detail.times for step in done.steps if step is not None)
    other_s = max(0.0, done.cycle_s - times.draft_s - times.verify_s)
    return BatchCycle(done.cycle, [row_cycle(r, done) for r in range(len(done.steps))], times.draft_s,
                      times.verify_s, other_s, list(times.draft_step_s), times.draft_feed_s)
