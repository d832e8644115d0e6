"""One request of a workload, as statistics read it."""
from dataclasses import dataclass

from engine.trace.record_types import Trace

UNCATEGORISED = "uncategorised"  # the category of a request whose line names none


@dataclass(frozen=True)
class RequestRun:
    """A finished request: its id and category from the prompt file, the trace file's name
    inside the workload folder, and the trace itself."""

    id: str
    category: str
    file: str
    trace: Trace
