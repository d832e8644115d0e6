"""The runner: every kind's cases made in this process, each run in a forked child, judged, tallied.

A case is judged by its outcome against its oracle (cases.py), by its refusal's shape (one line,
naming where it looked: a refusal that is not is counted as a crash) and by what it left outside
the folder it may write in.
"""
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.fuzz import answers, batch, diagnoses, prompts, scrapes, traces, uploads, workloads
from bench.fuzz.cases import (
    ACCEPTED,
    CRASH,
    FILES_OUTSIDE,
    HANG,
    MEMORY,
    REFUSED,
    VALID_REFUSED,
    WRONG_ACCEPT,
    Case,
    case_rng,
    failures_of,
    known_class,
)
from bench.fuzz.sandbox import Limits, Places, Result, fresh_work, run_forked, snapshot

KINDS = {m.KIND: m for m in (traces, prompts, workloads, batch, diagnoses, answers, scrapes, uploads)}
EXAMPLES = 5  # failing cases kept per kind and class


@dataclass
class Record:
    kind: str
    index: int
    change: str
    expect: str
    outcome: str
    failures: list[str]
    known: list[str]  # the KNOWN defect explaining each failure, "" where none does
    message: str
    tag: str | None
    seconds: float


def judge(case: Case, result: Result) -> Result:
    """A refusal must be one line that says where: otherwise it counts as a crash."""
    if result.outcome != REFUSED:
        return result
    message = result.message.strip()
    if not message:
        return Result(CRASH, "refused with an empty message")
    if "\n" in message or "\r" in message:
        return Result(CRASH, f"refused in {message.count(chr(10)) + 1} lines: {message[:300]!r}")
    if not case.names_its_source(message):
        return Result(CRASH, f"the refusal names no source: {message[:300]!r}")
    return result


def changes(before: dict, after: dict) -> list[str]:
    return sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))


def run_case(module, case: Case, places: Places, limits: Limits) -> Record:
    fresh_work(places, case.files)
    allowed = case.options.get("allowed")
    before = snapshot(places, allowed)
    start = time.monotonic()
    result = judge(case, run_forked(module.attempt, case, places, limits))
    seconds = time.monotonic() - start
    outside = changes(before, snapshot(places, allowed))
    failures = failures_of(case.expect, result.outcome, bool(outside))
    message = result.message if not outside else f"{result.message} [written outside: {', '.join(outside[:5])}]"
    return Record(case.kind, case.index, case.change, case.expect, result.outcome, failures,
                  [known_class(case.tag, f) or "" for f in failures], message[:600], case.tag, round(seconds, 3))


def run_kind(kind: str, indexes: list[int], seed: int, limits: Limits, progress=print) -> list[Record]:
    module = KINDS[kind]
    records = []
    with tempfile.TemporaryDirectory(prefix=f"speclab-fuzz-{kind}-") as root:
        places = Places.make(Path(root))
        for n, index in enumerate(indexes, start=1):
            case = module.make(case_rng(seed, kind, index), index, places)
            records.append(run_case(module, case, places, limits))
            if n % 100 == 0:
                progress(f"  {kind}: {n}/{len(indexes)} cases, {sum(bool(r.failures) for r in records)} failing")
    return records


def tally(records: list[Record]) -> dict:
    """Counts for one kind: outcomes, failure classes, and the failures no known defect explains."""
    outcomes = Counter(r.outcome for r in records)
    classes = Counter(f for r in records for f in r.failures)
    known = Counter(k for r in records for k in r.known if k)
    unknown = Counter(f for r in records for f, k in zip(r.failures, r.known) if not k)
    return {"cases": len(records), "accepted": outcomes[ACCEPTED], "refused": outcomes[REFUSED],
            "crashes": classes[CRASH], "hangs": classes[HANG], "memory": classes[MEMORY],
            "wrong_accepts": classes[WRONG_ACCEPT], "valid_refused": classes[VALID_REFUSED],
            "files_outside": classes[FILES_OUTSIDE], "known": dict(sorted(known.items())),
            "unknown": dict(sorted(unknown.items())), "expected": dict(sorted(Counter(r.expect for r in records).items()))}


def examples(records: list[Record], seed: int) -> dict[str, list[dict]]:
    """The first few failing cases of each class, those no known defect explains first, each with the
    command that runs it again."""
    kept: dict[str, list[dict]] = {}
    for want_known in (False, True):
        for r in records:
            for f, k in zip(r.failures, r.known):
                rows = kept.setdefault(f, [])
                if bool(k) == want_known and sum(bool(e["known"]) == want_known for e in rows) < EXAMPLES:
                    rows.append({"index": r.index, "change": r.change, "expect": r.expect, "outcome": r.outcome,
                                 "message": r.message, "known": k or None,
                                 "reproduce": f"python -m bench.fuzz --kinds {r.kind} --seed {seed} --only {r.index}"})
    return kept


def as_rows(records: list[Record]) -> list[dict]:
    return [asdict(r) for r in records]

