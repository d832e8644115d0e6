"""The manifest of a workload folder (`manifest.json`): what ran, on what, and each request's state.

    {"type": "manifest", "format": "speclab-workload", "version": 1, "created": ...,
     "prompts": {"file": NAME, "requests": N}, "settings": {...}, "chat_template": bool,
     "pair": {"preset", "target", "draft", "drafter"}, "machine": {"cpu", "features", "threads", "device", "dtype"},
     "requests": [{"index", "line", "id", "category", "fingerprint", "file", "status", "summary"?, "reason"?}]}

A request is "pending", "done" (its trace file is finished and its summary copied here) or
"skipped" (too long for the models, with the reason). A manifest may come from a stranger's
upload: `check_manifest` checks its meaning, and a request's file is always named
request-NNNN.jsonl, so a manifest never names a file outside its folder.
"""
import json
import re
from dataclasses import dataclass

from engine.trace.batch_reader import MAX_BATCH
from engine.trace.errors import TraceError
from engine.trace.json_lines import finite
from engine.trace.schema import MAX_K
from engine.workload.prompts import MAX_NAME_CHARS, MAX_REQUESTS

FORMAT = "speclab-workload"
VERSION = 1
# Request i (from 0, in the prompt file's order) runs with seed * SEED_STRIDE + i: each request its own
# random stream, so the requests of a workload are independent samples (with one seed for all, every
# request would draw the same uniforms, and a lucky stream would lift all of them at once), the same
# stream in every arm of a diagnosis, and no stream shared between two seeds (a file holds at most
# MAX_REQUESTS requests). A manifest without "seed_stride" (written before) ran every request on the seed.
SEED_STRIDE = 100_000
SEED_LIMIT = 2**63  # the engine's seeds are below this
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 8 * 2**20  # 2000 requests of a few hundred bytes each
PENDING, DONE, SKIPPED = "pending", "done", "skipped"
STATUSES = (PENDING, DONE, SKIPPED)
REQUEST_FILE = re.compile(r"request-\d{4,6}\.jsonl")
SUMMARY_KEYS = ("prompt_tokens", "num_cycles", "num_generated", "acceptance_rate", "mean_acceptance_length",
                "tokens_per_s", "wall_time_s", "stop_reason")


class WorkloadError(TraceError):
    """A workload folder, zip or manifest that cannot be read: one line, naming the field."""


def request_file(index: int) -> str:
    return f"request-{index + 1:04d}.jsonl"


@dataclass(frozen=True)
class Entry:
    """One request as the manifest lists it."""

    index: int
    line: int
    id: str
    category: str
    fingerprint: str
    file: str
    status: str
    summary: dict | None
    reason: str | None


def entry_of(d: dict) -> Entry:
    return Entry(d["index"], d["line"], d["id"], d["category"], d["fingerprint"], d["file"], d["status"],
                 d.get("summary"), d.get("reason"))


def as_dict(e: Entry) -> dict:
    d = {"index": e.index, "line": e.line, "id": e.id, "category": e.category, "fingerprint": e.fingerprint,
         "file": e.file, "status": e.status}
    if e.summary is not None:
        d["summary"] = e.summary
    if e.reason is not None:
        d["reason"] = e.reason
    return d


def summary_of(trace_summary: dict, prompt_tokens: int) -> dict:
    """What the manifest copies from a finished trace's summary line."""
    return {"prompt_tokens": prompt_tokens} | {k: trace_summary[k] for k in SUMMARY_KEYS if k != "prompt_tokens"}


def loads_manifest(data: bytes, source: str, other_formats: tuple[str, ...] = ()) -> tuple[dict, list[Entry]]:
    """The manifest and its requests, checked; one of `other_formats` is returned parsed only, with no requests
    (its reader checks it)."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise WorkloadError(f"{source}: the manifest has {len(data):,} bytes; at most {MAX_MANIFEST_BYTES:,} are read")
    try:
        manifest = json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise WorkloadError(f"{source}: the manifest is not JSON ({type(err).__name__})") from None
    if isinstance(manifest, dict) and manifest.get("format") in other_formats:
        return manifest, []
    return manifest, check_manifest(manifest, source)


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def batch_rows(manifest: dict) -> int | None:
    """The rows of a batched workload's batch (its manifest's "batch"), None for one run a request at a time."""
    return manifest["batch"]["rows"] if "batch" in manifest else None


def request_seed(seed: int, index: int, stride: int | None = SEED_STRIDE) -> int:
    """The seed request `index` runs with (SEED_STRIDE); stride None: a manifest from before, one seed for all."""
    return seed if stride is None else (seed * stride + index) % SEED_LIMIT


def fail(source: str, field: str, why: str):
    raise WorkloadError(f"{source}: manifest field {field!r} {why}")


def check_manifest(m, source: str) -> list[Entry]:
    """The manifest's requests, after checking what the statistics and the app rely on."""
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise WorkloadError(f"{source}: not a workload manifest (format is not {FORMAT!r})")
    if m.get("version") != VERSION:
        fail(source, "version", f"is {m.get('version')!r}; this engine reads version {VERSION}")
    for key, kind in (("settings", dict), ("pair", dict), ("machine", dict), ("requests", list)):
        if not isinstance(m.get(key), kind):
            fail(source, key, f"must be a {'list' if kind is list else 'JSON object'}")
    k = m["settings"].get("k")
    if not _is_int(k) or not 1 <= k <= MAX_K:
        fail(source, "settings.k", f"must be an integer from 1 to {MAX_K}")
    if m.get("seed_stride", SEED_STRIDE) != SEED_STRIDE:
        fail(source, "seed_stride", f"must be {SEED_STRIDE} (request i runs with seed * {SEED_STRIDE} + i)")
    if "batch" in m and not (isinstance(m["batch"], dict) and set(m["batch"]) == {"rows"}
                             and _is_int(m["batch"]["rows"]) and 1 <= m["batch"]["rows"] <= MAX_BATCH):
        fail(source, "batch", f"must be {{\"rows\": B}} with B from 1 to {MAX_BATCH}")
    if not 1 <= len(m["requests"]) <= MAX_REQUESTS:
        fail(source, "requests", f"must list 1 to {MAX_REQUESTS} requests")
    entries = [check_entry(d, i, k, source) for i, d in enumerate(m["requests"])]
    for field in ("id", "file"):
        values = [getattr(e, field) for e in entries]
        if len(set(values)) != len(values):
            fail(source, f"requests[].{field}", "must be unique")
    return entries


def check_entry(d, i: int, k: int, source: str) -> Entry:
    where = f"requests[{i}]"
    if not isinstance(d, dict):
        fail(source, where, "must be a JSON object")
    if d.get("index") != i or not _is_int(d.get("line")) or d["line"] < 1:
        fail(source, f"{where}.index", f"must be {i}, with a positive line")
    for key in ("id", "category", "fingerprint"):
        if not isinstance(d.get(key), str) or not 0 < len(d[key]) <= MAX_NAME_CHARS:
            fail(source, f"{where}.{key}", f"must be text of 1 to {MAX_NAME_CHARS} characters")
    if d.get("file") != request_file(i):
        fail(source, f"{where}.file", f"must be {request_file(i)}")
    if d.get("status") not in STATUSES:
        fail(source, f"{where}.status", f"must be one of {', '.join(STATUSES)}")
    if d["status"] == DONE:
        check_summary(d.get("summary"), k, source, f"{where}.summary")
    if d["status"] == SKIPPED and not isinstance(d.get("reason"), str):
        fail(source, f"{where}.reason", "must say why the request was skipped")
    return entry_of(d)


def check_summary(s, k: int, source: str, where: str) -> None:
    if not isinstance(s, dict) or set(s) != set(SUMMARY_KEYS):
        fail(source, where, f"must hold {', '.join(SUMMARY_KEYS)}")
    for key in ("prompt_tokens", "num_cycles", "num_generated"):
        if not _is_int(s[key]) or s[key] < 0:
            fail(source, f"{where}.{key}", "must be a non-negative integer")
    if not _is_number(s["acceptance_rate"]) or not 0 <= s["acceptance_rate"] <= 1:
        fail(source, f"{where}.acceptance_rate", "must be between 0 and 1")
    length = s["mean_acceptance_length"]
    if not _is_number(length) or not (length == 0 or 1 <= length <= k + 1 + 1e-9):
        fail(source, f"{where}.mean_acceptance_length", f"must be between 1 and K + 1 = {k + 1}")
    for key in ("tokens_per_s", "wall_time_s"):
        if not _is_number(s[key]) or s[key] < 0:
            fail(source, f"{where}.{key}", "must be a non-negative number")
    if not isinstance(s["stop_reason"], str):
        fail(source, f"{where}.stop_reason", "must be text")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return finite(v)
