"""What the pages draw and say, computed from a trace: plain functions, no Streamlit.

- derive.py: token classes and texts read off a trace; explain.py: the stage captions.
- cycle.py: the stepper's figures and the shared styles; layouts.py, stats.py and
  teaching.py: the cache-layout, statistics and teaching pages' figures; tree.py: a tree
  cycle's token tree, attention mask and cache compaction (draft trees); tree_stats.py: a tree
  trace's statistics and a chain and a tree of one pair side by side; tree_rollback.py: the
  rollback page's tree section (cache mismatch per cycle, the two outputs as escaped HTML).

May import: engine (never streamlit), so tests call every figure directly.
"""
