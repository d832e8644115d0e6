"""The speculative cycle: draft, verify in one target pass, the ratio test, commit and roll back.

- driver.py: the one loop every cycle kind runs in, row-shaped (B rows; a one-row kind runs as
  B = 1): each row's generator, the commit, idle rows, admission and the records; the `CycleKind`
  and `RowsKind` interfaces a kind plugs into it.
- step.py: what a kind hands the driver: its decision (`CycleStep`) and its caches (`Settled`).
- trace_record.py: the one builder of a cycle's trace record, for every kind.
- pair.py: the target and what drafts for it (`Pair`), and decoded token texts.
- ratio_test.py: the acceptance test (`accept_reject`, `RATIO_TEST`), here and nowhere else, and
  the `CycleRule` interface the teaching faults plug into.
- reference.py: the chain's cycle as the design notes lay it out (`ChainCycle`).
- fast.py: the same chain kept on the device over static caches (`FastChainCycle`, `--fast`),
  checked against reference.py token for token; its sampling in fast_sampling.py, its
  fixed-shape forwards and clock in fast_forward.py; capture_choice.py measures whether
  compiling them pays on this CPU (--capture auto).
- plain.py: plain decoding, what speculation is measured against: one loop for one request,
  a batch of rows and the fast path.
The tree's cycle kind is engine/tree/cycle.py, the batch's engine/batch/cycle.py; the run mode that
picks a kind is engine/mode.py.

May import: engine.config, engine.trace, engine.models, engine.kv, engine.drafters.
"""
