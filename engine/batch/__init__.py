"""Batched speculation: one cycle for B requests at once, chains, a drafter that proposes for several rows.

Every row (request) drafts K tokens, the target verifies every row's [last committed, d1..dK] in one
forward, and each row runs the engine's one ratio test (engine/cycle/ratio_test.py) with its own
generator, so rows accept different counts and are rolled back to different lengths: the cache is
ragged (engine/kv/rows.py holds the ragged cache and the one forward over it). The batch is a cycle
kind of the one driver (engine/cycle/driver.py): the loop, the commit, idle rows, admission
(continuous batching) and the records are the driver's, as for every other kind.

- cycle.py: `BatchedChainCycle`, the kind (draft through the drafter's row interface, verify,
  decide, settle each row's caches and its static layout state), and running a batch through the
  driver (`start_batch`, `run_batch`, `batched_generate`).
- report.py: what a batched cycle reports, typed: `RowCycle` per row, `BatchCycle` per cycle,
  read off the driver's `RowsCycle` (the benchmarks, the goodput sweep and the batch trace use it),
  and `row_outputs`.
- trace_lines.py: the batch trace's cycle line (batch.jsonl; engine/trace/batch_reader.py reads it).
Plain batched decoding, what the batch is measured against, is engine/cycle/plain.py's; the batched
workload folder is engine/workload/batched.py's.

May import: engine.config, engine.trace, engine.models, engine.kv, engine.drafters, engine.cycle.
"""
