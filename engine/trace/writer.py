"""Writing a trace: `TraceWriter` streams each record into `<path>.partial` as the run goes
and renames it to `path` only when the run ends without an error; `make_summary` builds the
closing record from the cycles.
"""
import json
import os
from pathlib import Path
from typing import IO

from engine.trace.metrics import trace_acceptance

PARTIAL_SUFFIX = ".partial"  # the file a run streams into until it finishes


def partial_path(path: str | Path) -> Path:
    """Where a run streams its trace until it finishes: `out.jsonl.partial` beside `out.jsonl`."""
    path = Path(path)
    return path.with_name(path.name + PARTIAL_SUFFIX)


class TraceWriter:
    """Streams records into `<path>.partial`, flushing each so a killed run keeps its cycles, and
    renames it to `path` only when the run ends without an error: a failed run never
    destroys an earlier trace at `path`.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.partial = partial_path(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file: IO[str] = self.partial.open("w", encoding="utf-8", newline="\n")

    def write(self, record: dict) -> None:
        # ensure_ascii=False keeps token texts readable; the reader splits on '\n' only, so
        # U+2028 and friends inside a string round-trip.
        self.file.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()

    def finish(self) -> None:
        self.file.close()
        os.replace(self.partial, self.path)

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.finish()
        else:
            self.close()  # the partial file keeps the finished cycles under its own name


def make_summary(cycles: list[dict], k: int, generated_text: str, stop_reason: str,
                 wall_time_s: float) -> dict:
    """The closing record, for chain and tree cycles alike (a tree's k is its max depth;
    metrics.trace_acceptance says what the numbers mean for a tree)."""
    generated = [t for c in cycles for t in c["committed_token_ids"]]
    return {
        "type": "summary", "generated_token_ids": generated, "generated_text": generated_text,
        **trace_acceptance(cycles, k),
        "num_generated": len(generated), "stop_reason": stop_reason, "wall_time_s": wall_time_s,
        "tokens_per_s": len(generated) / wall_time_s if wall_time_s > 0 else 0.0,
    }
