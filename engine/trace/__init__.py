"""The trace format: what a run writes, and what `load_trace` checks before anyone reads it.

- schema.py: the constants that traces, settings and the checks share (imports nothing).
- format.py: the record types, the reader (`load_trace`, `loads_trace`) and the writer.
- checks.py: what a trace's numbers must mean (the invariants), after the field types.
- tree_checks.py: the same for a tree trace's cycles (the tree, the walk, the compaction).
- commit.py: the commit rule (cut at EOS and at the budget), shared with engine/cycle/.
- layout_checks.py: the same for a cache layout's fields.
- metrics.py: the acceptance counts a summary carries, under vLLM's names.

May import: engine.config and the standard library. Never torch, so the app can read
a trace without loading the engine's models. Read a trace with
`from engine.trace import load_trace, TraceError`.
"""
from engine.trace.format import Trace, TraceError, load_trace, loads_trace, model_name

__all__ = ["Trace", "TraceError", "load_trace", "loads_trace", "model_name"]
