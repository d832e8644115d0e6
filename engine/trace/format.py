"""The trace format: one JSON object per line.

Line 1 is the header, then one record per cycle, appended as each cycle ends (a killed
run keeps the cycles it finished), then a summary. A file without its summary is
incomplete and is never reported as a finished run.

This module reads a trace (`load_trace`, `loads_trace`): it splits and parses the lines
(json_lines.py), checks each record's field types (field_checks.py) and layout fields
(layout_checks.py), then the invariants of the whole run (checks.py). The record types are in
record_types.py and the writer in writer.py; every name in __all__ stays importable from here.
"""
from pathlib import Path

from engine.trace.checks import check_trace
from engine.trace.errors import BrokenInvariant, TraceError
from engine.trace.field_checks import (
    check_cycle_fields,
    check_fields,
    check_header_fields,
    check_tree_cycle_fields,
    layout_message,
)
from engine.trace.json_lines import MAX_DEPTH, Refused, parse_line, split_records
from engine.trace.layout_checks import LayoutFieldError, check_layout_cycle
from engine.trace.metrics import drafted, trace_acceptance
from engine.trace.record_types import (
    CACHE_LEN_FIELDS,
    CHAIN_ONLY_FIELDS,
    CYCLE_FIELDS,
    HEADER_FIELDS,
    NUM,
    SETTINGS_FIELDS,
    SLOT_COMPACTION_FIELDS,
    SUMMARY_FIELDS,
    TREE_COMPACTION_FIELDS,
    TREE_CYCLE_FIELDS,
    TREE_FIELDS,
    TREE_NODE_FIELDS,
    TREE_TRY_FIELDS,
    CacheLengths,
    CycleRecord,
    DraftTreeRecord,
    SlotCompaction,
    Trace,
    TreeCompaction,
    TreeCycleRecord,
    TreeNode,
    TreeTry,
    drafter_kind,
    fields_of,
    is_tree_trace,
    is_vllm_capture,
    model_name,
)
from engine.trace.writer import PARTIAL_SUFFIX, TraceWriter, make_summary, partial_path

__all__ = [
    # read here
    "MAX_TRACE_BYTES", "load_trace", "loads_trace", "parse_trace",
    # re-exported: importers read them from engine.trace.format
    "TraceError", "MAX_DEPTH", "split_records", "layout_message", "drafted", "trace_acceptance",
    "Trace", "drafter_kind", "is_tree_trace", "model_name", "fields_of", "NUM", "HEADER_FIELDS", "SETTINGS_FIELDS",
    "CacheLengths", "CycleRecord", "TreeNode", "TreeTry", "SlotCompaction", "TreeCompaction", "DraftTreeRecord",
    "TreeCycleRecord", "CYCLE_FIELDS", "CACHE_LEN_FIELDS", "TREE_CYCLE_FIELDS", "TREE_FIELDS", "TREE_NODE_FIELDS",
    "TREE_TRY_FIELDS", "TREE_COMPACTION_FIELDS", "SLOT_COMPACTION_FIELDS", "CHAIN_ONLY_FIELDS", "SUMMARY_FIELDS",
    "PARTIAL_SUFFIX", "TraceWriter", "make_summary", "partial_path",
]

MAX_TRACE_BYTES = 256 * 2**20  # 4096 tokens at K=32 with top-100 lists stay well below this


def parse_trace(lines: list[str], source: str = "trace", allow_incomplete: bool = False) -> Trace:
    """Validate and parse trace lines; raise TraceError naming the line and field at fault."""
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = parse_line(line)
        except ValueError as err:
            last = number == len(lines) or not any(rest.strip() for rest in lines[number:])
            finished = any(r.get("type") == "summary" for _, r in records)
            if last and allow_incomplete and not finished:
                break  # a run killed mid-write: keep the cycles before it
            if isinstance(err, Refused):
                raise TraceError(f"{source} line {number}: {err}") from None
            truncated = " - the file looks truncated" if last else ""
            raise TraceError(f"{source} line {number}: not valid JSON ({err}){truncated}") from None
        if not isinstance(rec, dict):
            raise TraceError(f"{source} line {number}: expected a JSON object")
        records.append((number, rec))
    if not records:
        raise TraceError(f"{source}: the file is empty")
    (n0, header), rest = records[0], records[1:]
    if header.get("type") != "header":
        raise TraceError(f"{source} line {n0}: the first record must be the header")
    check_header_fields(header, f"{source} line {n0}")
    k = header["settings"]["k"]
    kind = drafter_kind(header)
    captured = is_vllm_capture(header)
    tree = is_tree_trace(header)
    cycles, summary = [], None
    cycle_lines, summary_line = [], None
    for number, rec in rest:
        where = f"{source} line {number}"
        if summary is not None:
            raise TraceError(f"{where}: a record after the summary")
        if rec.get("type") == "cycle":
            if tree:
                check_tree_cycle_fields(rec, len(cycles), where, kind)
            else:
                check_cycle_fields(rec, k, len(cycles), where, kind, captured)
            try:
                check_layout_cycle(header, rec)
            except LayoutFieldError as err:
                raise TraceError(layout_message(err, where)) from None
            cycles.append(rec)
            cycle_lines.append(number)
        elif rec.get("type") == "summary":
            check_fields(rec, SUMMARY_FIELDS, where)
            summary, summary_line = rec, number
        else:
            raise TraceError(f"{where}: unknown record type {rec.get('type')!r}")
    if summary is None and not allow_incomplete:
        raise TraceError(f"{source}: no summary after {len(cycles)} cycles - the run did not finish (the file is incomplete)")
    try:
        check_trace(header, cycles, summary, n0, cycle_lines, summary_line)
    except BrokenInvariant as err:
        raise TraceError(f"{source} {err}") from None
    return Trace(header, cycles, summary)


def _too_big(size: int, source: str, max_bytes: int) -> None:
    if size > max_bytes:
        raise TraceError(f"{source}: {size / 2**20:.1f} MiB is larger than the {max_bytes / 2**20:.0f} MiB "
                         "a trace may have")


def load_trace(path: str | Path, allow_incomplete: bool = False, source: str | None = None,
               max_bytes: int = MAX_TRACE_BYTES) -> Trace:
    """Read and check a trace file. `source` names it in messages (default: the path as given)."""
    path = Path(path)
    source = source or str(path)
    if not path.is_file():
        raise TraceError(f"trace file not found: {source}")
    _too_big(path.stat().st_size, source, max_bytes)
    with path.open("rb") as f:
        data = f.read(max_bytes + 1)
    return loads_trace(data, source, allow_incomplete, max_bytes)


def loads_trace(data: bytes | str, source: str = "upload", allow_incomplete: bool = False,
                max_bytes: int = MAX_TRACE_BYTES) -> Trace:
    _too_big(len(data), source, max_bytes)
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise TraceError(f"{source}: not UTF-8 text ({err})") from None
    return parse_trace(split_records(data), source, allow_incomplete)
