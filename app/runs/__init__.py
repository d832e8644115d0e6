"""Runs the app starts or ships.

- live.py: a live run from the app (a pair, settings, the cycles as they arrive).
- diagnose.py: a live diagnosis (`engine diagnose` on a shipped pair, on a worker thread).
- teaching_pair.py: the pair and prompt the live teaching pages run on.
- precomputed.py: the slow teaching runs' results, computed ahead of time for the bundled pairs.
- batch_bench.py: the shipped batch benchmarks (bench/results/batch-*.json).

May import: streamlit, app.ui, app.figures and engine.
"""
