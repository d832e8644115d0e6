"""Draft trees: several candidate continuations per cycle, verified in one target pass.

- shape.py: `DraftTree`, the nodes a cycle drafted (parents before children), and the
  two ways of growing one from the draft's distributions (static branching, EAGLE-2's
  dynamic top-k and rerank).
- attention.py: the tree attention mask and the one forward pass over [root, nodes] at
  positions by depth, for every cache layout.
- accept.py: the exact acceptance walk over the tree (one-hot children tried in order,
  rejected siblings removed from the residual).
- compact.py: rollback after a tree: the accepted path's K/V moved next to the committed
  prefix, everything else discarded, for the dynamic, static and paged layouts.
- draft.py: tree drafting, one batched forward per depth; the `TreeProposer` interface and the
  draft model's proposer.
- eagle.py: the EAGLE head's proposer: levels fed with predicted features under a tree mask on the
  head's cache, then cropped to the root and re-fed with the verify's true features.
- cycle.py: the tree's cycle kind (`TreeCycle`) for the one driver (engine/cycle/driver.py): draft,
  verify, accept, compact, and its record's `tree` entry; it picks the proposer from the pair's
  drafter kind.

May import: engine.config, engine.trace, engine.models, engine.kv, engine.drafters, engine.cycle.
"""
