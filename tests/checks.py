"""Checks shared by the tests that read traces.

The invariants themselves live in one place, engine/trace/checks.py, which `load_trace`
runs on every file; the tests call the same code on records they hold in memory.
"""
from engine.trace import Trace
from engine.trace.checks import check_records


def assert_self_consistent(trace: Trace) -> None:
    """Every recorded number agrees with the others and with the rules of a cycle.

    A draft model and an EAGLE head propose K tokens every cycle and keep a cache over the
    target's positions; prompt lookup and the other-tokenizer draft propose n <= K tokens.
    """
    assert trace.complete
    check_records(trace.header, trace.cycles, trace.summary)  # raises BrokenInvariant naming the rule
