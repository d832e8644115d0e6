"""The batch trace (batch.jsonl in a batched workload's folder, engine/workload/batched.py): reading and checking it.

Each request of a batched run has its own ordinary trace; batch.jsonl says how the rows shared the
cycles: a "batch_header" line, one "batch_cycle" line per batched cycle, a "batch_summary" line. It
is untrusted input like any trace, so `loads_batch_trace` checks what it means, not only its types:
- every cycle lists each row once, in order; a row is idle (nothing drafted, nothing decided) or
  ran one request, which stays in its row from its admission to its last cycle and never runs twice;
- a running row accepted 0..K tokens, committed at most accepted + 1, and its caches follow the
  convention: the target's verify appends K+1 positions, both caches end at its committed length - 1,
  and each cycle starts where the row's previous cycle of the same request ended;
- the time split is finite, non-negative and adds up to the cycle's time;
- the idle count is the number of idle rows;
- no request index reaches the header's request count, and the summary's finished requests are
  the requests that ran.
`check_against_workload` then ties it to the requests' own traces: the same accepted counts, cycle by cycle.
"""
import json
import math

from engine.trace.errors import TraceError
from engine.trace.json_lines import finite
from engine.trace.schema import MAX_K

BATCH_TRACE = "batch.jsonl"
BATCH_FORMAT = "speclab-batch"
BATCH_VERSION = 1
MAX_BATCH = 256  # rows; far beyond what a CPU batch gains from (docs/batching.md)
MAX_BATCH_TRACE_BYTES = 64 * 2**20
TIMES = ("draft_time_s", "verify_time_s", "bookkeeping_time_s")


class BatchTraceError(TraceError):
    """A batch trace that cannot be read, or whose lines contradict each other: one line, naming where."""


def fail(where: str, why: str):
    raise BatchTraceError(f"{where}: {why}")


def _int(v, low: int, high: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


def _seconds(v) -> bool:
    return finite(v) and v >= 0


def parse_lines(data: bytes | str, source: str) -> list[dict]:
    if len(data) > MAX_BATCH_TRACE_BYTES:
        fail(source, f"{len(data):,} bytes; at most {MAX_BATCH_TRACE_BYTES:,} are read")
    text = data.decode("utf-8", errors="strict") if isinstance(data, bytes) else data
    lines = []
    for n, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
        except (ValueError, RecursionError):
            fail(f"{source} line {n}", "not a JSON line")
        if not isinstance(value, dict):
            fail(f"{source} line {n}", "not a JSON object")
        lines.append(value)
    return lines


def check_header(h: dict, source: str) -> tuple[int, int]:
    if h.get("type") != "batch_header" or h.get("format") != BATCH_FORMAT:
        fail(source, f"not a batch trace (its first line is not a {BATCH_FORMAT!r} batch_header)")
    if h.get("version") != BATCH_VERSION:
        fail(source, f"version {h.get('version')!r}; this engine reads version {BATCH_VERSION}")
    k = (h.get("settings") or {}).get("k") if isinstance(h.get("settings"), dict) else None
    if not _int(h.get("rows"), 1, MAX_BATCH) or not _int(k, 1, MAX_K) or not _int(h.get("capacity"), 1, 10**7):
        fail(source, f"the header needs rows (1..{MAX_BATCH}), capacity and settings.k (1..{MAX_K})")
    return h["rows"], k


def check_row(r, i: int, k: int, where: str) -> None:
    if not isinstance(r, dict) or r.get("row") != i:
        fail(where, f"rows[{i}] must be row {i}")
    if not isinstance(r.get("idle"), bool) or (r["idle"] and r.get("num_accepted") is not None):
        fail(where, f"row {i}: idle must be true or false, and an idle row decides nothing")
    if r["idle"]:
        return
    if not _int(r.get("request"), 0, 10**6) or not _int(r.get("num_accepted"), 0, k):
        fail(where, f"row {i}: a running row names its request and accepted 0..{k} tokens")
    if not _int(r.get("committed"), 0, r["num_accepted"] + 1):
        fail(where, f"row {i}: commits at most its accepted tokens and the next one ({r['num_accepted'] + 1})")
    for model in ("target_cache_len", "draft_cache_len"):
        lengths = r.get(model)
        if not isinstance(lengths, dict) or not all(_int(lengths.get(m), 0, 10**7)
                                                    for m in ("before", "after_append", "after_rollback")):
            fail(where, f"row {i}: {model} needs before, after_append and after_rollback")
    t, d = r["target_cache_len"], r["draft_cache_len"]
    if t["after_append"] != t["before"] + k + 1:
        fail(where, f"row {i}: the verify appends K+1 = {k + 1} positions to {t['before']}")
    if t["after_rollback"] != t["before"] + r["committed"] or d["after_rollback"] != t["after_rollback"]:
        fail(where, f"row {i}: both caches end at the committed length - 1 ({t['before'] + r['committed']})")
    if d["before"] != t["before"] or d["after_append"] != d["before"] + k + 1:
        fail(where, f"row {i}: the draft starts where the target does and appends K+1 = {k + 1} positions")


def check_cycle(c: dict, n: int, rows: int, k: int, source: str) -> None:
    where = f"{source} cycle {n}"
    if c.get("type") != "batch_cycle" or c.get("cycle") != n:
        fail(where, f"batch_cycle number {n} expected")
    if not isinstance(c.get("rows"), list) or len(c["rows"]) != rows:
        fail(where, f"must list all {rows} rows")
    for i, r in enumerate(c["rows"]):
        check_row(r, i, k, where)
    if c.get("idle_rows") != sum(r["idle"] for r in c["rows"]):
        fail(where, "idle_rows must count the idle rows")
    if not all(_seconds(c.get(name)) for name in (*TIMES, "cycle_time_s")):
        fail(where, "the time split must be finite seconds, none negative")
    if not math.isclose(sum(c[name] for name in TIMES), c["cycle_time_s"], rel_tol=1e-6, abs_tol=1e-9):
        fail(where, "draft, verify and bookkeeping times must add up to the cycle's time")
    if not isinstance(c.get("admitted"), list) or not all(
            isinstance(a, dict) and _int(a.get("row"), 0, rows - 1) and _int(a.get("request"), 0, 10**6)
            for a in c["admitted"]):
        fail(where, "admitted must list {row, request} of this batch")


def check_rows_over_cycles(cycles: list[dict], source: str) -> dict[int, list[int]]:
    """A request keeps its row from admission to its last cycle, runs once, and its caches continue
    cycle to cycle. Returns each request's accepted counts in order."""
    accepted: dict[int, list[int]] = {}
    holder: dict[int, int] = {}  # row -> the request it runs now
    ended: set[int] = set()
    last_rollback: dict[int, int] = {}
    for n, c in enumerate(cycles):
        where = f"{source} cycle {n}"
        for r in c["rows"]:
            if r["idle"]:
                continue
            req, row = r["request"], r["row"]
            if req in ended:
                fail(where, f"request {req} runs again after its last cycle")
            if holder.get(row, req) != req or any(rw != row and q == req for rw, q in holder.items()):
                fail(where, f"row {row}: request {req} appears while another request holds the row, or in two rows")
            if req in last_rollback and r["target_cache_len"]["before"] != last_rollback[req]:
                fail(where, f"row {row}: request {req} must continue from its previous cycle's length {last_rollback[req]}")
            holder[row], last_rollback[req] = req, r["target_cache_len"]["after_rollback"]
            accepted.setdefault(req, []).append(r["num_accepted"])
        for a in c["admitted"]:  # the row's previous request ended this cycle; the new one starts next cycle
            if a["request"] in accepted:
                fail(where, f"request {a['request']} is admitted after it ran")
            if a["row"] in holder:
                ended.add(holder.pop(a["row"]))
    return accepted


def check_request_counts(header: dict, summary: dict | None, accepted: dict[int, list[int]], source: str) -> None:
    """The header's request count (the manifest's, skipped requests included) bounds every request index;
    the summary is written after the last cycle, so every request that ran has finished by then."""
    total = header.get("requests")
    if total is None:  # older batch traces did not say
        return
    if not _int(total, 0, 10**6):
        fail(source, "the header's requests must be a count")
    if accepted and max(accepted) >= total:
        fail(source, f"request {max(accepted)} ran, but the header says the workload has {total} requests")
    if summary is not None and summary["requests_done"] != len(accepted):
        fail(source, f"the summary says {summary['requests_done']} requests finished; {len(accepted)} ran in its cycles")


def loads_batch_trace(data: bytes | str, source: str = BATCH_TRACE) -> dict:
    """The batch trace as {"header", "cycles", "summary", "accepted"}, checked (the module's list)."""
    try:
        lines = parse_lines(data, source)
    except UnicodeDecodeError:
        fail(source, "not UTF-8 text")
    if not lines:
        fail(source, "empty")
    rows, k = check_header(lines[0], source)
    summary = lines[-1] if len(lines) > 1 and lines[-1].get("type") == "batch_summary" else None
    cycles = lines[1:-1] if summary is not None else lines[1:]
    for n, c in enumerate(cycles):
        check_cycle(c, n, rows, k, source)
    accepted = check_rows_over_cycles(cycles, source)
    if summary is not None and not (_int(summary.get("requests_done"), 0, 10**6) and _seconds(summary.get("wall_time_s"))):
        fail(source, "the summary needs requests_done and wall_time_s")
    check_request_counts(lines[0], summary, accepted, source)
    return {"header": lines[0], "cycles": cycles, "summary": summary, "accepted": accepted}


def check_against_workload(batch: dict, accepted_by_request: dict[int, list[int]], source: str = BATCH_TRACE,
                           requests: int | None = None) -> None:
    """The batch trace and the requests' own traces tell the same story: each request's accepted
    counts, cycle by cycle (`accepted_by_request`: request index -> its trace's num_accepted list), and
    the header's request count is the manifest's (`requests`, skipped requests included)."""
    said = batch["header"].get("requests")
    if requests is not None and said is not None and said != requests:
        fail(source, f"the batch says {said} requests, the manifest lists {requests}")
    for req, counts in accepted_by_request.items():
        if batch["accepted"].get(req) != counts:
            fail(source, f"request {req}'s accepted counts differ from its own trace's")
    extra = set(batch["accepted"]) - set(accepted_by_request)
    if extra:
        fail(source, f"requests {sorted(extra)[:5]} ran in the batch but have no finished trace")
