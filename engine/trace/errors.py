"""The two errors a trace is refused with, in a leaf module: the reader, the field-type checks
and the invariant checks all raise them without importing one another.

TraceError is what a caller of `load_trace` catches: the file cannot be read, and the message
says where and what is wrong. BrokenInvariant is what the invariant checks raise (the numbers
break a rule of a cycle); the loader turns it into a TraceError naming the file.
"""


class TraceError(ValueError):
    """A trace file that cannot be read; the message says where and what is wrong."""


class BrokenInvariant(ValueError):
    """One invariant a trace breaks; the message names where, the field and the rule."""
