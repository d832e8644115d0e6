"""The trace format: what a run writes, and what `load_trace` checks before anyone reads it.

- schema.py: the constants that traces, settings and the checks share (imports nothing).
- format.py: the reader (`load_trace`, `loads_trace`); it re-exports the names below that its
  importers have always read from it (Trace, TraceError, CycleRecord, TraceWriter, ...).
- record_types.py: `Trace`, the record types (TypedDicts) and the field tables derived from them.
- errors.py: TraceError and BrokenInvariant (imports nothing).
- json_lines.py: splitting a trace into lines and parsing one, refusing what a trace may not hold.
- field_checks.py: each record's fields present with the right JSON type.
- writer.py: `TraceWriter` (streams into a .partial file) and `make_summary`.
- checks.py: what a trace's numbers must mean (the invariants), after the field types; its
  parts: check_basics.py (fail, tolerances, the replayed run), shared_checks.py,
  header_checks.py, chain_checks.py (one chain cycle) and drafter_checks.py.
- tree_checks.py: the same for a tree trace's cycles; its parts: tree_shape_checks.py (the
  tree), tree_walk_checks.py (the walk) and tree_cache_checks.py (the commit, the compaction).
- commit.py: the commit rule (cut at EOS and at the budget), shared with engine/cycle/.
- layout_checks.py: the same for a cache layout's fields.
- batch_reader.py: the batch trace (batch.jsonl of a batched workload), read and checked (`loads_batch_trace`).
- metrics.py: the acceptance counts a summary carries, under vLLM's names.

May import: engine.config and the standard library. Never torch, so the app can read
a trace without loading the engine's models. Read a trace with
`from engine.trace import load_trace, TraceError`.

This __init__ imports nothing when it runs: the names in __all__ come from format.py on first use
(a PEP 562 module `__getattr__`). So importing schema.py, as engine/config.py does, no longer loads
the checks, which import engine.config themselves.
"""
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.trace.format import Trace, TraceError, load_trace, loads_trace, model_name

__all__ = ["Trace", "TraceError", "load_trace", "loads_trace", "model_name"]


def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from engine.trace import format as reader
    value = getattr(reader, name)
    globals()[name] = value  # later look-ups find it without calling this again
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
