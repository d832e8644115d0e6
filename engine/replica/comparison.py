"""replica.json: the replica's comparison with its server, beside the replica's workload manifest.

Greedy (temperature 0), compared step by step:

    {"format": "speclab-replica", "version": 1, "mode": "greedy", "server_workload": FOLDER NAME,
     "server": {...}, "speculative_config": {...}, "requests": [{"id", "equal", "server_steps",
     "replica_drafting_cycles", "tokens_equal", "first_difference": null | {"step", "server_drafted",
     "server_accepted", "replica_drafted", "replica_accepted", "replica_cycle"}}]}

(a file without "mode", written before sampled replicas, is greedy). Sampled, compared in aggregate
(sampled.py):

    {..., "mode": "sampled", "sampling": {"temperature", "top_p", "seed"},
     "requests": [{"id", "server_steps", "server_draft_tokens", "server_accepted_tokens",
                   "replica_drafting_cycles", "replica_draft_tokens", "replica_accepted_tokens"}],
     "positions": [{"position", "server": SIDE, "replica": SIDE, "intervals_overlap", "z", "p_value", "differ"}],
     "overall": {"server": TOTALS, "replica": TOTALS}}

with SIDE = {"accepted", "reached", "rate", "interval"} and TOTALS = {"requests", "drafts", "draft_tokens",
"accepted_tokens", "acceptance_rate", "acceptance_rate_interval", "mean_acceptance_length",
"mean_acceptance_length_interval"}.

The app reads it as untrusted input (a replica folder may come from anywhere): `loads_comparison`
checks every field's meaning against the workload it lies beside (its request ids, K, its sampling
settings, and each request's number of cycles, so a link never names a cycle its trace does not have).
A sampled file's rates, intervals and tests are computed again from its counts and must be what they
give; its position counts must add up to its requests' counts.
"""
import json
import math
import os
from dataclasses import asdict
from pathlib import Path

from engine.replica.align import Difference, RequestComparison
from engine.replica.sampled import SIDES, SampledComparison, SampledRequest, overall, position_row
from engine.workload.manifest import Entry, WorkloadError

FORMAT = "speclab-replica"
VERSION = 1
REPLICA_FILE = "replica.json"
MAX_BYTES = 4 * 2**20
KEYS = ("id", "equal", "server_steps", "replica_drafting_cycles", "tokens_equal", "first_difference")
DIFFERENCE_KEYS = ("step", "server_drafted", "server_accepted", "replica_drafted", "replica_accepted", "replica_cycle")
MAX_STEPS = 1_000_000
GREEDY, SAMPLED = "greedy", "sampled"
SAMPLING_KEYS = ("temperature", "top_p", "seed")
SAMPLED_KEYS = ("id", "server_steps", "server_draft_tokens", "server_accepted_tokens", "replica_drafting_cycles",
                "replica_draft_tokens", "replica_accepted_tokens")
SAMPLED_FIELDS = ("sampling", "positions", "overall")  # a sampled file's own; a greedy one has none of them


class ReplicaFileError(WorkloadError):
    """A replica.json that cannot be believed: one line, naming the field."""


def as_dict(c: RequestComparison) -> dict:
    return asdict(c)


def write_comparison(folder: Path, head: dict, comparisons: list[RequestComparison]) -> None:
    """A greedy replica's comparison."""
    write_body(folder, {"format": FORMAT, "version": VERSION, "mode": GREEDY} | head
               | {"requests": [as_dict(c) for c in comparisons]})


def write_sampled(folder: Path, head: dict, c: SampledComparison) -> None:
    """A sampled replica's comparison."""
    write_body(folder, {"format": FORMAT, "version": VERSION, "mode": SAMPLED} | head
               | {"sampling": c.sampling, "requests": [asdict(r) for r in c.requests], "positions": c.positions,
                  "overall": c.overall})


def write_body(folder: Path, body: dict) -> None:
    """Replace replica.json in one step (a kill leaves the old one or the new one)."""
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


def cycles_of(entry: Entry) -> int | None:
    """The request's number of cycles, as its manifest entry gives it (None: not given)."""
    summary = entry.summary or {}
    return summary.get("num_cycles") if type(summary.get("num_cycles")) is int else None


def request_object(r, i: int, keys: tuple, source: str, entries: dict[str, Entry]) -> str:
    """requests[i] is an object of exactly `keys` whose id names a request of the workload; returns where it is."""
    where = f"requests[{i}]"
    if not isinstance(r, dict) or set(r) != set(keys):
        fail(source, where, f"must be an object of {', '.join(keys)}")
    if not isinstance(r["id"], str) or r["id"] not in entries:
        fail(source, f"{where}.id", "must name a request of the workload beside it")
    return where


def check_request(r, i: int, source: str, k: int, entries: dict[str, Entry]) -> RequestComparison:
    where = request_object(r, i, KEYS, source, entries)
    for key in ("equal", "tokens_equal"):
        if type(r[key]) is not bool:
            fail(source, f"{where}.{key}", "must be true or false")
    cycles = cycles_of(entries[r["id"]])
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


# ---------------------------------------------------------------- a sampled replica's fields

def same(stored, computed) -> bool:
    """`stored` (read from the file) is what `computed` is: the same shape, types and values, floats to
    within rounding (another machine's libm may differ in the last bits)."""
    if type(stored) is not type(computed):
        return False
    if isinstance(computed, dict):
        return stored.keys() == computed.keys() and all(same(stored[key], computed[key]) for key in computed)
    if isinstance(computed, list):
        return len(stored) == len(computed) and all(same(a, b) for a, b in zip(stored, computed))
    if isinstance(computed, float):
        return math.isclose(stored, computed, rel_tol=1e-9, abs_tol=1e-12)
    return stored == computed


def check_sampling(sampling, source: str, settings: dict | None) -> dict:
    if not isinstance(sampling, dict) or set(sampling) != set(SAMPLING_KEYS):
        fail(source, "sampling", f"must be an object of {', '.join(SAMPLING_KEYS)}")
    t, p, seed = (sampling[key] for key in SAMPLING_KEYS)
    if type(t) not in (int, float) or not 0 < t <= 100:
        fail(source, "sampling.temperature", "must be a number above 0 and at most 100 (a sampled run)")
    if type(p) not in (int, float) or not 0 < p <= 1:
        fail(source, "sampling.top_p", "must be a number above 0 and at most 1")
    if type(seed) is not int or not 0 <= seed < 2**63:
        fail(source, "sampling.seed", "must be an integer from 0 to 2**63 - 1")
    if settings is not None:
        for key in SAMPLING_KEYS:
            if sampling[key] != settings.get(key):
                fail(source, f"sampling.{key}", "must be the setting the workload beside it ran with")
    return sampling


def check_sampled_request(r, i: int, source: str, k: int, entries: dict[str, Entry]) -> SampledRequest:
    where = request_object(r, i, SAMPLED_KEYS, source, entries)
    cycles = cycles_of(entries[r["id"]])
    for side, steps_key in (("server", "server_steps"), ("replica", "replica_drafting_cycles")):
        high = MAX_STEPS if side == "server" or cycles is None else cycles
        steps = count(r[steps_key], source, f"{where}.{steps_key}", high)
        drafted = count(r[f"{side}_draft_tokens"], source, f"{where}.{side}_draft_tokens", MAX_STEPS * k)
        accepted = count(r[f"{side}_accepted_tokens"], source, f"{where}.{side}_accepted_tokens", MAX_STEPS * k)
        if not steps <= drafted <= k * steps:
            fail(source, f"{where}.{side}_draft_tokens", f"must be from 1 to K={k} per drafting step")
        if accepted > drafted:
            fail(source, f"{where}.{side}_accepted_tokens", "must be at most the drafted tokens")
    return SampledRequest(**{key: r[key] for key in SAMPLED_KEYS})


def position_counts(row, i: int, source: str) -> dict[str, tuple[int, int]]:
    """A position row's (accepted, reached) per side, each checked as counts; the rest is computed from them."""
    where = f"positions[{i}]"
    if not isinstance(row, dict) or not all(isinstance(row.get(side), dict) for side in SIDES):
        fail(source, where, "must be an object with a server and a replica object")
    counts = {}
    for side in SIDES:
        accepted = count(row[side].get("accepted"), source, f"{where}.{side}.accepted", MAX_STEPS)
        reached = count(row[side].get("reached"), source, f"{where}.{side}.reached", MAX_STEPS)
        if accepted > reached:
            fail(source, f"{where}.{side}", "has more steps accepting the position than reaching it")
        counts[side] = (accepted, reached)
    return counts


def check_positions(positions, source: str, k: int, requests: list[SampledRequest]) -> list[dict]:
    """Each row what its counts give, and the counts what the requests' give: position 1 is reached by
    every drafting step, position i + 1 only by steps that accepted i, and the accepted counts add up to
    the accepted tokens (a step accepting a tokens counts once at each of positions 1..a)."""
    if not isinstance(positions, list) or len(positions) != k:
        fail(source, "positions", f"must list K={k} positions")
    counts = [position_counts(row, i, source) for i, row in enumerate(positions)]
    for i, (row, c) in enumerate(zip(positions, counts)):
        if not same(row, position_row(i + 1, c["server"], c["replica"])):
            fail(source, f"positions[{i}]", "must be what its counts give (position, rates, intervals, test)")
    for side in SIDES:
        drafts, _, accepted = (sum(r.counts(side)[j] for r in requests) for j in range(3))
        if counts[0][side][1] != drafts:
            fail(source, f"positions[0].{side}.reached", "must be the side's drafting steps in all")
        if any(counts[i + 1][side][1] > counts[i][side][0] for i in range(k - 1)):
            fail(source, f"positions[].{side}.reached", "must be at most the steps accepting the position before")
        if sum(c[side][0] for c in counts) != accepted:
            fail(source, f"positions[].{side}.accepted", "must add up to the side's accepted tokens")
    return positions


def check_sampled(body: dict, source: str, k: int, entries: list[Entry], settings: dict | None) -> SampledComparison:
    sampling = check_sampling(body.get("sampling"), source, settings)
    by_id = {e.id: e for e in entries}
    requests = [check_sampled_request(r, i, source, k, by_id) for i, r in enumerate(body["requests"])]
    if len({r.id for r in requests}) != len(requests):
        fail(source, "requests[].id", "must be unique")
    positions = check_positions(body.get("positions"), source, k, requests)
    if not same(body.get("overall"), overall(requests)):
        fail(source, "overall", "must be what the requests' counts give (totals, rates, bootstrap intervals)")
    return SampledComparison(sampling, requests, positions, body["overall"])


def check_mode(body: dict, source: str, settings: dict | None) -> str:
    mode = body.get("mode", GREEDY)  # a file written before sampled replicas is greedy
    if mode not in (GREEDY, SAMPLED):
        fail(source, "mode", f"must be {GREEDY!r} or {SAMPLED!r}")
    if settings is not None and (mode == SAMPLED) != (settings.get("temperature") != 0):
        fail(source, "mode", "must say how the workload beside it ran (greedy at temperature 0, else sampled)")
    if mode == GREEDY and (extra := [f for f in SAMPLED_FIELDS if f in body]):
        fail(source, extra[0], "belongs to a sampled comparison, not a greedy one")
    return mode


def loads_comparison(data: bytes, source: str, k: int, entries: list[Entry],
                     settings: dict | None = None) -> list[RequestComparison] | SampledComparison:
    """replica.json, checked against the workload beside it (K, its requests and their cycles, and where
    `settings` (its manifest's) is given, its temperature, top_p and seed): a greedy file's requests, or a
    sampled file's comparison."""
    if len(data) > MAX_BYTES:
        raise ReplicaFileError(f"{source}: {REPLICA_FILE} has {len(data):,} bytes; at most {MAX_BYTES:,} are read")
    try:
        body = json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise ReplicaFileError(f"{source}: {REPLICA_FILE} is not JSON ({type(err).__name__})") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT or body.get("version") != VERSION:
        raise ReplicaFileError(f"{source}: {REPLICA_FILE} is not a replica comparison ({FORMAT!r}, version {VERSION})")
    mode = check_mode(body, source, settings)
    requests = body.get("requests")
    if not isinstance(requests, list) or not 1 <= len(requests) <= len(entries):
        fail(source, "requests", f"must list 1 to {len(entries)} requests (those of the workload beside it)")
    if mode == SAMPLED:
        return check_sampled(body, source, k, entries, settings)
    by_id = {e.id: e for e in entries}
    checked = [check_request(r, i, source, k, by_id) for i, r in enumerate(requests)]
    if len({c.id for c in checked}) != len(checked):
        fail(source, "requests[].id", "must be unique")
    return checked


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def read_comparison(folder: Path, k: int, entries: list[Entry],
                    settings: dict | None = None) -> list[RequestComparison] | SampledComparison | None:
    """The comparison beside a workload folder's manifest, checked; None when the folder is no replica."""
    path = folder / REPLICA_FILE
    if not path.is_file() or path.is_symlink():
        return None
    if path.stat().st_size > MAX_BYTES:
        raise ReplicaFileError(f"{folder.name}: {REPLICA_FILE} has {path.stat().st_size:,} bytes; at most {MAX_BYTES:,} are read")
    return loads_comparison(path.read_bytes(), folder.name, k, entries, settings)
