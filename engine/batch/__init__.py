"""Batched speculation (issue #40, first part): one cycle for B requests at once, draft model, chains.

Every row (request) drafts K tokens with the draft model, the target verifies every row's
[last committed, d1..dK] in one forward, and each row runs the engine's own ratio test
(engine.cycle.reference.accept_reject) with its own generator, so rows accept different
counts and are rolled back to different lengths: the cache is ragged.

- cache.py: `RowsKVCache`, a preallocated K/V buffer per layer (B, H_kv, capacity, D) with a
  length per row; a forward writes every row at that row's own offset, and a row's rollback
  lowers its length alone (stale slots stay, hidden by the mask, overwritten later).
- forward.py: one Hugging Face forward over B ragged rows: explicit position_ids per row and
  the 4-D additive mask (B, 1, T, capacity) built from each row's positions.
- records.py: what a batched cycle reports, typed: `RowCycle` per row, `BatchCycle` per cycle,
  and `row_outputs` (each row's generated tokens from the records).
- cycle.py: the cycle as flat steps (`prefill_rows`, `draft_rows`, `verify_rows`, `decide_rows`,
  `commit_rows`, `roll_back_rows`), `run_batch_cycle`, and the generator
  `batched_speculative_generate`.

Not here yet: continuous batching (rows joining mid-run), a paged batched layout, trace files
and their checks, the CLI's --batch, the benchmark.

May import: engine.config, engine.trace, engine.models, engine.kv, engine.drafters, engine.cycle.
"""
