"""A trace's text as JSON lines: split where the writer ends a record (on '\\n' only), and parse
one line, refusing valid JSON a trace may not hold (NaN and Infinity, a number too large to be
finite, an integer too large for a float, records nested deeper than MAX_DEPTH) with a `Refused`
that says what. `finite` is the same rule for a value other readers parsed themselves.
"""
import json
import math
import sys

# A chain record nests 4 deep; a tree record 6 (cycle > tree > compaction > target > moves > one move).
# The rest is room for layout and drafter fields.
MAX_DEPTH = 16


class Refused(ValueError):
    """Valid JSON that a trace may still not hold (the message says what)."""


def _reject_constant(name: str):
    raise Refused(f"{name} is not a number a trace may hold")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise Refused(f"the number {text[:40]} is too large to be a finite number")
    return value


def _finite_int(text: str) -> int:
    value = int(text)
    if len(text) > 300 and not finite(value):  # only a long integer can be beyond the largest float
        raise Refused(f"the number {text[:40]} is too large to be a finite number")
    return value


def finite(value) -> bool:
    """A JSON number a float holds: not true or false, not NaN or infinite, and not an integer beyond
    the largest float (math.isfinite raises OverflowError on one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, int):
        return abs(value) <= sys.float_info.max
    return math.isfinite(value)


def _too_deep(value) -> bool:
    """Whether containers nest deeper than MAX_DEPTH (the record itself is level 1).

    json.loads itself stops at the interpreter's recursion limit (a RecursionError, caught
    below); this walk, without recursion, holds records to a much smaller limit.
    """
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        children = v.values() if isinstance(v, dict) else v
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def split_records(text: str) -> list[str]:
    """Lines as the writer ends them: on '\\n' only. U+2028, U+2029, U+0085 and the like are
    legal inside a JSON string and stay in their token text; a UTF-8 BOM is skipped."""
    return text.removeprefix("\ufeff").split("\n")


def parse_line(line: str) -> object:
    try:
        value = json.loads(line, parse_constant=_reject_constant, parse_float=_finite_float, parse_int=_finite_int)
    except RecursionError:
        raise Refused(f"the record nests more than {MAX_DEPTH} levels deep") from None
    if isinstance(value, (dict, list)) and _too_deep(value):
        raise Refused(f"the record nests more than {MAX_DEPTH} levels deep")
    return value
