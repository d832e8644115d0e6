"""replica.json: the replica's comparison with its server, beside the replica's workload manifest.

    {"format": "speclab-replica", "version": 1, "server_workload": FOLDER NAME, "server": {...},
     "speculative_config": {...}, "requests": [{"id", "equal", "server_steps", "replica_drafting_cycles",
     "tokens_equal", "first_difference": null | {"step", "server_drafted", "server_accepted",
     "replica_drafted", "replica_accepted", "replica_cycle"}}]}

The app reads it as untrusted input (a replica folder may come from anywhere): `loads_comparison`
checks every field's meaning against the workload it lies beside (its request ids, K, and each
request's number of cycles, so a link never names a cycle its trace does not have).
"""
import json
import os
from dataclasses import asdict
from pathlib import Path

from engine.replica.align import Difference, RequestComparison
from engine.workload.manifest import Entry, WorkloadError

FORMAT = "speclab-replica"
VERSION = 1
REPLICA_FILE = "replica.json"
MAX_BYTES = 4 * 2**20
KEYS = ("id", "equal", "server_steps", "replica_drafting_cycles", "tokens_equal", "first_difference")
DIFFERENCE_KEYS = ("step", "server_drafted", "server_accepted", "replica_drafted", "replica_accepted", "replica_cycle")
MAX_STEPS = 1_000_000


class ReplicaFileError(WorkloadError):
    """A replica.json that cannot be believed: one line, naming the field."""


def as_dict(c: RequestComparison) -> dict:
    return asdict(c)


def write_comparison(folder: Path, head: dict, comparisons: list[RequestComparison]) -> None:
    """Replace replica.json in one step (a kill leaves the old one or the new one)."""
    body = {"format": FORMAT, "version": VERSION} | head | {"requests": [as_dict(c) for c in comparisons]}
    tmp = folder / (REPLICA_FILE + ".tmp")
    tmp.write_text(json.dumps(body, ensure_ascii=False, indent=1), encoding="utf-8")
    os.replace(tmp, folder / REPLICA_FILE)


def fail(source: str, field: str, why: str):
    raise ReplicaFileError(f"{source}: {REPLICA_FILE} field {field!r} {why}")


def count(value, source: str, field: str, high: int) -> int:
    if type(value) is not int or not 0 <= value <= high:
        fail(source, field, f"must be an integer from 0 to {high}")
    return value


def maybe_count(value, source: str, field: str, high: int) -> int | None:
    return None if value is None else count(value, source, field, high)


def check_difference(d, where: str, source: str, k: int, cycles: int | None) -> Difference | None:
    if d is None:
        return None
    if not isinstance(d, dict) or set(d) != set(DIFFERENCE_KEYS):
        fail(source, where, f"must be null or an object of {', '.join(DIFFERENCE_KEYS)}")
    step = count(d["step"], source, f"{where}.step", MAX_STEPS)
    sd, sa = (maybe_count(d[key], source, f"{where}.{key}", k) for key in ("server_drafted", "server_accepted"))
    rd, ra = (maybe_count(d[key], source, f"{where}.{key}", k) for key in ("replica_drafted", "replica_accepted"))
    last_cycle = MAX_STEPS if cycles is None else max(cycles - 1, 0)
    cycle = maybe_count(d["replica_cycle"], source, f"{where}.replica_cycle", last_cycle)
    if (sd is None) != (sa is None) or (rd is None) != (ra is None) or (rd is None) != (cycle is None):
        fail(source, where, "gives a side's drafted, accepted (and the replica's cycle) together or not at all")
    if sd is None and rd is None:
        fail(source, where, "names neither side's step")
    if (sd is not None and sa > sd) or (rd is not None and ra > rd):
        fail(source, where, "has more accepted than drafted tokens")
    return Difference(step, sd, sa, rd, ra, cycle)


def check_request(r, i: int, source: str, k: int, entries: dict[str, Entry]) -> RequestComparison:
    where = f"requests[{i}]"
    if not isinstance(r, dict) or set(r) != set(KEYS):
        fail(source, where, f"must be an object of {', '.join(KEYS)}")
    if r["id"] not in entries:
        fail(source, f"{where}.id", "must name a request of the workload beside it")
    for key in ("equal", "tokens_equal"):
        if type(r[key]) is not bool:
            fail(source, f"{where}.{key}", "must be true or false")
    summary = entries[r["id"]].summary or {}
    cycles = summary.get("num_cycles") if type(summary.get("num_cycles")) is int else None
    steps = count(r["server_steps"], source, f"{where}.server_steps", MAX_STEPS)
    drafting = count(r["replica_drafting_cycles"], source, f"{where}.replica_drafting_cycles",
                     MAX_STEPS if cycles is None else cycles)
    diff = check_difference(r["first_difference"], f"{where}.first_difference", source, k, cycles)
    if r["equal"] != (diff is None and r["tokens_equal"]):
        fail(source, f"{where}.equal", "must be true exactly when no step differs and the tokens are equal")
    if diff is not None and diff.step >= max(steps, drafting):
        fail(source, f"{where}.first_difference.step", "must be a step one side took")
    if diff is None and steps != drafting:
        fail(source, where, "with no difference, server_steps must equal replica_drafting_cycles")
    return RequestComparison(r["id"], r["equal"], steps, drafting, r["tokens_equal"], diff)


def loads_comparison(data: bytes, source: str, k: int, entries: list[Entry]) -> list[RequestComparison]:
    """replica.json's requests, checked against the workload beside it (K, its requests and their cycles)."""
    if len(data) > MAX_BYTES:
        raise ReplicaFileError(f"{source}: {REPLICA_FILE} has {len(data):,} bytes; at most {MAX_BYTES:,} are read")
    try:
        body = json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise ReplicaFileError(f"{source}: {REPLICA_FILE} is not JSON ({type(err).__name__})") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT or body.get("version") != VERSION:
        raise ReplicaFileError(f"{source}: {REPLICA_FILE} is not a replica comparison ({FORMAT!r}, version {VERSION})")
    requests = body.get("requests")
    if not isinstance(requests, list) or not 1 <= len(requests) <= len(entries):
        fail(source, "requests", f"must list 1 to {len(entries)} requests (those of the workload beside it)")
    by_id = {e.id: e for e in entries}
    checked = [check_request(r, i, source, k, by_id) for i, r in enumerate(requests)]
    if len({c.id for c in checked}) != len(checked):
        fail(source, "requests[].id", "must be unique")
    return checked


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def read_comparison(folder: Path, k: int, entries: list[Entry]) -> list[RequestComparison] | None:
    """The comparison beside a workload folder's manifest, checked; None when the folder is no replica."""
    path = folder / REPLICA_FILE
    if not path.is_file() or path.is_symlink():
        return None
    if path.stat().st_size > MAX_BYTES:
        raise ReplicaFileError(f"{folder.name}: {REPLICA_FILE} has {path.stat().st_size:,} bytes; at most {MAX_BYTES:,} are read")
    return loads_comparison(path.read_bytes(), folder.name, k, entries)
