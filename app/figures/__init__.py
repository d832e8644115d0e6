"""What the pages draw and say, computed from a trace: plain functions, no Streamlit.

- derive.py: token classes and texts read off a trace; explain.py: the stage captions; slower.py: why a
  run was slower than plain decoding (every "Why?" beside a speedup below 1).
- style.py: the palette, styles, escaping, sizes and plain-dict building blocks every figure shares.
- The stepper's figures: cycle.py (the text so far, the cycle at a glance), acceptance.py (the
  test per position as a chart and as a table, the resample or bonus), caches.py (both KV caches),
  overview.py (all cycles, a cycle's time).
- layouts.py, stats.py and teaching.py: the cache-layout, statistics and teaching pages' figures.
- workload.py and diagnose.py: the Workload and Diagnose pages' charts.
- Batching: batch.py (a batched cycle as lanes, one per row), batch_goodput.py (goodput against batch
  size, the crossover, acceptance beside speedup, the advisor's table).
- Draft trees: tree_record.py (what a tree trace and a tree cycle say), tree.py (the token tree and
  the figures a page shows for a tree cycle), tree_mask.py (the attention mask), tree_compaction.py
  (the cache compaction), tree_captions.py (the words); tree_stats.py: a tree trace's statistics
  and a chain and a tree of one pair side by side; tree_rollback.py: the rollback page's tree
  section (cache mismatch per cycle, the two outputs as escaped HTML).

May import: engine (never streamlit), so tests call every figure directly.
"""
