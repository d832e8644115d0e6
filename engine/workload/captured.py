"""A folder the vLLM capture plugin wrote (vllm_capture/), read as a workload.

The plugin's manifest.json lists one trace per request the server speculated on, in the order they ended:

    {"format": "speclab-vllm-capture", "version": 1, "cache_convention": ...,
     "traces": [{"file", "request_id", "complete", "ended", ...}]}

Here that list becomes an ordinary workload manifest in memory, so `engine stats`, the Workload page and
the stepper's request links open a captured folder as they open the lab's own. Request i's file is
request-NNNN.jsonl as in every workload; behind it, the captured file the plugin listed (a bare name,
checked here, so a manifest never names a file outside its folder). Every trace is checked by load_trace
under vLLM's cache convention, as any trace is.

A workload has one set of settings; one server may have served greedy and sampled requests side by side.
The most common set (the first request's on a tie) is the workload's; a request with another set, or one
that did not finish (aborted, or ended by a step that was no ratio test), is listed as skipped, with why.
Seeds are the exception: each request keeps the one its client sent, so the manifest's seed is null.
"""
import hashlib
import json
import re
from collections import Counter
from typing import Callable

from engine.trace.format import loads_trace
from engine.trace.record_types import Trace
from engine.workload import manifest as mf
from engine.workload.prompts import MAX_NAME_CHARS, MAX_REQUESTS

CAPTURE_FORMAT = "speclab-vllm-capture"
CAPTURE_VERSION = 1
CATEGORY = "vllm"  # the plugin's category for every request (the server knows none)
# What the plugin names a trace: the request id with other characters made "_", then .jsonl (".incomplete" after
# it when the request did not finish). Bare: no folder, no leading dot.
CAPTURED_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,159}\.jsonl(\.incomplete)?")

Read = Callable[[str], bytes]


def is_capture(manifest) -> bool:
    return isinstance(manifest, dict) and manifest.get("format") == CAPTURE_FORMAT


def captured_entries(m: dict, source: str) -> list[dict]:
    """The plugin's list of traces, checked: bare, unique names; `complete` agrees with the name."""
    if m.get("version") != CAPTURE_VERSION:
        mf.fail(source, "version", f"is {m.get('version')!r}; this engine reads capture version {CAPTURE_VERSION}")
    traces = m.get("traces")
    if not isinstance(traces, list) or not 1 <= len(traces) <= MAX_REQUESTS:
        mf.fail(source, "traces", f"must list 1 to {MAX_REQUESTS} captured traces")
    for i, t in enumerate(traces):
        if not isinstance(t, dict) or not isinstance(t.get("file"), str) or not CAPTURED_FILE.fullmatch(t["file"]):
            mf.fail(source, f"traces[{i}].file", "must be a bare file name ending in .jsonl or .jsonl.incomplete")
        if t.get("complete") is not (not t["file"].endswith(".incomplete")):
            mf.fail(source, f"traces[{i}].complete", "must be true for a .jsonl file and false for .incomplete")
    files = [t["file"] for t in traces]
    if len(set(files)) != len(files):
        mf.fail(source, "traces[].file", "must be unique")
    return traces


def request_id(trace: Trace) -> str | None:
    """The id the trace's header gives its request, if it gives one a manifest can hold (with its category)."""
    r = trace.header.get("request")
    ok = isinstance(r, dict) and all(isinstance(r.get(k), str) and 0 < len(r[k]) <= MAX_NAME_CHARS
                                     for k in ("id", "category"))
    return r["id"] if ok else None


def settings_key(trace: Trace) -> str:
    """A trace's settings less its seed, as one comparable value."""
    return json.dumps({k: v for k, v in trace.header["settings"].items() if k != "seed"}, sort_keys=True)


def other_settings(trace: Trace, workload_settings: dict) -> str:
    differ = [f"{k} {v}" for k, v in trace.header["settings"].items()
              if k != "seed" and workload_settings.get(k) != v]
    return "ran with " + ", ".join(differ) + " (the workload's are the most common settings)"


def skipped(i: int, rid: str, why: str) -> mf.Entry:
    return mf.Entry(i, i + 1, rid, CATEGORY, "-", mf.request_file(i), mf.SKIPPED, None, why)


def unique_id(wanted: str, taken: set[str]) -> str:
    rid, n = wanted[:MAX_NAME_CHARS], 2
    while rid in taken:
        suffix = f"#{n}"
        rid, n = wanted[: MAX_NAME_CHARS - len(suffix)] + suffix, n + 1
    return rid


def capture_workload(m: dict, read: Read, source: str) -> tuple[dict, list[mf.Entry], Read]:
    """The workload manifest a capture folder stands for, its requests, and a reader of request-NNNN.jsonl."""
    listed = captured_entries(m, source)
    traces = {t["file"]: loads_trace(read(t["file"]), source=f"{source}/{t['file']}")
              for t in listed if t["complete"]}
    if not traces:
        raise mf.WorkloadError(f"{source}: no captured request finished, so there is nothing to read as a workload")
    keys = Counter(settings_key(t) for t in traces.values())
    first = next(t for t in traces.values() if keys[settings_key(t)] == max(keys.values()))
    settings = dict(first.header["settings"], seed=None)
    entries, behind, taken = [], {}, set()
    for i, t in enumerate(listed):
        trace = traces.get(t["file"])
        if trace is None:
            why = f"did not finish: {str(t.get('ended', 'no reason given'))[:200]}"
            entries.append(skipped(i, unique_id(t["file"], taken), why))
        elif request_id(trace) is None or request_id(trace) in taken:
            entries.append(skipped(i, unique_id(t["file"], taken), "its header names no request, or one named before"))
        elif settings_key(trace) != settings_key(first):
            entries.append(skipped(i, unique_id(request_id(trace), taken), other_settings(trace, settings)))
        else:
            entries.append(done_entry(i, trace))
            behind[entries[-1].file] = t["file"]
        taken.add(entries[-1].id)
    manifest = workload_manifest(m, first, settings, entries, source)
    return manifest, mf.check_manifest(manifest, source), lambda name: read(behind.get(name, name))


def done_entry(i: int, trace: Trace) -> mf.Entry:
    request = trace.header["request"]
    prompt_ids = trace.header["prompt_token_ids"]
    fingerprint = hashlib.sha256(json.dumps(prompt_ids).encode()).hexdigest()[:16]
    return mf.Entry(i, i + 1, request["id"], request["category"], fingerprint, mf.request_file(i), mf.DONE,
                    mf.summary_of(trace.summary, len(prompt_ids)), None)


def workload_manifest(m: dict, first: Trace, settings: dict, entries: list[mf.Entry], source: str) -> dict:
    h = first.header
    return {"type": "manifest", "format": mf.FORMAT, "version": mf.VERSION, "created": h.get("created", ""),
            "prompts": {"file": f"the requests a vLLM served ({source})", "requests": len(entries)},
            "settings": settings, "seed_stride": mf.SEED_STRIDE, "chat_template": None,
            "pair": {"preset": None, "target": h["target"], "draft": h["draft"], "drafter": h["drafter"]},
            "machine": {"cpu": "a vLLM server (captured)", "features": [], "threads": None,
                        "device": h.get("device", "?"), "dtype": h.get("dtype", "?")},
            "captured": {"format": CAPTURE_FORMAT, "cache_convention": str(m.get("cache_convention", ""))[:100]},
            "requests": [mf.as_dict(e) for e in entries]}

