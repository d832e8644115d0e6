"""Correct and deliberately broken runs, for the teaching pages only.

- faults.py: the broken acceptance rules and rollbacks (the engine's cycle runs the ratio test), and a
  tree run's broken rollback.
- runs.py: correct and broken runs side by side, cache views, numerics checks.
- exactness.py: is speculative sampling distributed like the target? Count and test. power.py: how many
  samples catch a broken rule, and the lab's verdict on a result (its distance from the target, the chance
  its test catches it).
- numerics.py: greedy text and floating point (a trace's closest near-tie, the checks to run on a pair).
- rollback_facts.py: what the rollback page reads off its runs (largest drift, the cycle to show, wrong caches).
- stale_slots.py: stale K/V that corrupts and stale K/V that does not.
- tree_rollback.py: after a tree, compaction against a chain's crop (the K/V of a rejected sibling).

May import: the rest of the engine. Nothing in the engine imports this package but
the top-level cli/run modules.
"""
