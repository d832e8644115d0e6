"""Batch traces (batch.jsonl of a batched workload): the golden one and the bundled ones, changed, read by
`loads_batch_trace` and tied to their requests' own traces by `check_against_workload`, as
`Workload.batch_trace()` does.
"""
import json
import random
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from bench.fuzz import mutate
from bench.fuzz.cases import ACCEPT, EITHER, REFUSE, Case, Refused
from bench.fuzz.sandbox import Places
from engine.trace.batch_reader import BATCH_TRACE, check_against_workload, loads_batch_trace
from engine.trace.errors import TraceError

KIND = "batch"
ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "batched_workload"


@dataclass(frozen=True)
class Sample:
    name: str
    data: bytes
    counts: dict  # request index -> its own trace's accepted counts, cycle by cycle
    requests: int  # the manifest's request count, skipped requests included

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.data.split(b"\n") if line.strip()]


def accepted_counts(files: dict[str, bytes]) -> dict[int, list[int]]:
    manifest = json.loads(files["manifest.json"])
    counts = {}
    for e in manifest["requests"]:
        if e["status"] == "done":
            lines = [json.loads(x) for x in files[e["file"]].split(b"\n") if x.strip()]
            counts[e["index"]] = [r["num_accepted"] for r in lines if r.get("type") == "cycle"]
    return counts


def request_count(files: dict[str, bytes]) -> int:
    return len(json.loads(files["manifest.json"])["requests"])


@lru_cache(maxsize=1)
def samples() -> tuple[Sample, ...]:
    golden = {p.name: p.read_bytes() for p in GOLDEN.iterdir()}
    found = [Sample("golden/batched_workload", golden[BATCH_TRACE], accepted_counts(golden), request_count(golden))]
    for path in sorted((ROOT / "assets" / "workloads").glob("*batch*.zip")):
        with zipfile.ZipFile(path) as z:
            files = {name.rsplit("/", 1)[-1]: z.read(name) for name in z.namelist() if not name.endswith("/")}
        found.append(Sample(path.name, files[BATCH_TRACE], accepted_counts(files), request_count(files)))
    return tuple(found)


def running_rows(cycles: list[dict]) -> list[tuple[int, int]]:
    return [(n, i) for n, c in enumerate(cycles) for i, r in enumerate(c["rows"]) if not r["idle"]]


def breaks(records: list[dict], rng: random.Random) -> tuple[str, str | None]:
    """Break one rule of the batch trace in place; the words, and the known defect it hits."""
    header, cycles = records[0], [r for r in records if r.get("type") == "batch_cycle"]
    summary = records[-1] if records[-1].get("type") == "batch_summary" else None
    k = header["settings"]["k"]
    n, i = rng.choice(running_rows(cycles))
    c, row = cycles[n], cycles[n]["rows"][i]
    idle = [(m, j) for m, cc in enumerate(cycles) for j, r in enumerate(cc["rows"]) if r["idle"]]
    edits = [
        ("num_accepted = K + 1", lambda: row.update(num_accepted=k + 1), None),
        ("committed = accepted + 2", lambda: row.update(committed=row["num_accepted"] + 2), None),
        ("target after_append + 1", lambda: row["target_cache_len"].update(
            after_append=row["target_cache_len"]["after_append"] + 1), None),
        ("draft after_rollback + 1", lambda: row["draft_cache_len"].update(
            after_rollback=row["draft_cache_len"]["after_rollback"] + 1), None),
        ("idle_rows + 1", lambda: c.update(idle_rows=c["idle_rows"] + 1), None),
        ("draft time + 1 s", lambda: c.update(draft_time_s=c["draft_time_s"] + 1.0), None),
        ("cycle time NaN", lambda: c.update(cycle_time_s=float("nan")), None),
        ("verify time negative", lambda: c.update(verify_time_s=-0.5, cycle_time_s=c["cycle_time_s"] - 0.5), None),
        ("cycle number + 1", lambda: c.update(cycle=c["cycle"] + 1), None),
        ("a request in two rows", lambda: [r.update(request=row["request"]) for r in c["rows"] if not r["idle"]]
         if sum(not r["idle"] for r in c["rows"]) > 1 else row.update(request=row["request"] + 1000), None),
        ("header k + 1", lambda: header["settings"].update(k=k + 1), None),
        ("header rows + 1", lambda: header.update(rows=header["rows"] + 1), None),
        ("header version 2", lambda: header.update(version=2), None),
        ("admitted into a row outside the batch", lambda: c["admitted"].append({"row": header["rows"], "request": 0}), None),
        ("num_accepted - 1 with its commit", lambda: row.update(num_accepted=row["num_accepted"] - 1,
                                                                committed=row["committed"] - 1)
         if row["num_accepted"] > 0 else row.update(num_accepted=row["num_accepted"] + 1), None),
        ("header requests + 1", lambda: header.update(requests=header.get("requests", 0) + 1), "batch-rows"),
    ]
    if any(not r["idle"] and r["request"] == row["request"] for later in cycles[n + 1:] for r in later["rows"]):
        edits.append(("both caches moved back by one", lambda: [
            row[m].update({key: value - 1 for key, value in row[m].items()})
            for m in ("target_cache_len", "draft_cache_len")], None))  # the request's next cycle no longer follows
    if len(c["rows"]) > 1:
        edits.append(("row number of another row", lambda: row.update(row=(i + 1) % len(c["rows"])), None))
    if idle:
        m, j = rng.choice(idle)
        edits.append(("an idle row accepts", lambda: cycles[m]["rows"][j].update(num_accepted=1), None))
    if summary is not None:
        edits.append(("summary requests_done + 1", lambda: summary.update(requests_done=summary["requests_done"] + 1),
                      "batch-rows"))
    words, edit, tag = rng.choice(edits)
    edit()
    return f"cycle {n} row {i}: {words}", tag


def line_edit(data: bytes, rng: random.Random) -> tuple[bytes, str, str]:
    """A cycle line dropped or duplicated (refused), or the summary dropped (a killed run: either)."""
    lines = data.rstrip(b"\n").split(b"\n")
    how = rng.choice(["drop", "duplicate", "no-summary"])
    if how == "no-summary":
        return b"\n".join(lines[:-1]) + b"\n", "the summary line dropped", EITHER
    i = rng.randrange(1, len(lines) - 1)
    kept = lines[:i] + lines[i + 1:] if how == "drop" else lines[:i + 1] + lines[i:]
    return b"\n".join(kept) + b"\n", f"cycle line {i + 1} {how}d", REFUSE


def valid_variant(records: list[dict], rng: random.Random) -> tuple[bytes, str]:
    style = rng.choice(["crlf", "reordered", "spaced", "ascii", "blank-lines"])
    if style == "reordered":
        return mutate.json_lines([mutate.reordered(r, rng) for r in records]), style
    data = mutate.json_lines(records, newline="\r\n" if style == "crlf" else "\n",
                             style=style if style in ("spaced", "ascii") else "plain")
    return (data.replace(b"\n", b"\n\n") if style == "blank-lines" else data), style


def damaged(sample: Sample, rng: random.Random) -> tuple[bytes, str]:
    how = rng.choice(["flip", "cut", "swap"])
    if how == "flip":
        return mutate.flip_bytes(sample.data, rng)
    if how == "cut":
        data, at = mutate.cut(sample.data, rng)
        return data, f"cut at byte {at}"
    records = sample.records()
    n = rng.randrange(len(records))
    return mutate.json_lines(records), f"line {n + 1} {mutate.swap_random_leaf(records[n], rng)}"


def batch_change(rng: random.Random, sample: Sample) -> tuple[bytes, str, str, str | None]:
    """A changed batch trace: its bytes, what a reader must do, the words, the known defect it hits."""
    family = rng.choices(["valid", "break", "lines", "damage"], weights=[2, 5, 1, 2])[0]
    if family == "valid":
        data, words = valid_variant(sample.records(), rng)
        return data, ACCEPT, f"valid, {words}", None
    if family == "break":
        records = sample.records()
        words, tag = breaks(records, rng)
        return mutate.json_lines(records), REFUSE, words, tag
    if family == "lines":
        data, words, expect = line_edit(sample.data, rng)
        return data, expect, words, None
    data, words = damaged(sample, rng)
    return data, EITHER, words, None


def make(rng: random.Random, index: int, places: Places) -> Case:
    sample = rng.choice(samples())
    data, expect, words, tag = batch_change(rng, sample)
    return Case(KIND, index, f"{sample.name}: {words}", expect, BATCH_TRACE, "loads_batch_trace", data=data, tag=tag,
                options={"counts": sample.counts, "requests": sample.requests})


def attempt(case: Case, work: Path) -> str:
    try:
        batch = loads_batch_trace(case.data, BATCH_TRACE)
        check_against_workload(batch, case.options["counts"], BATCH_TRACE, requests=case.options["requests"])
    except TraceError as err:
        raise Refused(str(err)) from None
    return f"{len(batch['cycles'])} batched cycles"
