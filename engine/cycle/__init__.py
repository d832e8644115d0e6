"""The speculative cycle: draft, verify in one target pass, the ratio test, commit and roll back.

- driver.py: the one loop every cycle kind runs in (start, cycles until EOS or the budget,
  commit, record), and the `CycleKind` interface a kind plugs into it.
- step.py: what a kind hands the driver: its decision (`CycleStep`) and its caches (`Settled`).
- record.py: the one builder of a cycle's trace record, for every kind.
- pair.py: the target and what drafts for it (`Pair`), and decoded token texts.
- reference.py: the chain's cycle as the design notes lay it out (`ChainCycle`); the ratio
  test (`accept_reject`, `RATIO_TEST`) lives here and nowhere else.
- fast.py: the same chain kept on the device over static caches (`FastChainCycle`, `--fast`),
  checked against reference.py token for token; its sampling in fast_sampling.py, its
  fixed-shape forwards and clock in fast_forward.py; capture_choice.py measures whether
  compiling them pays on this CPU (--capture auto).
The tree's cycle kind is engine/tree/cycle.py; the run mode that picks a kind is engine/mode.py.

May import: engine.config, engine.trace, engine.models, engine.kv, engine.drafters.
"""
