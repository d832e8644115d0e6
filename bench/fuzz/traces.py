"""Traces: the bundled traces and the golden test traces, changed, read by `loads_trace`, `load_trace`
and `python -m engine stats`.

Half the cases come from tests/hostile.py's labelled families (run on the golden chain traces: types,
ranges, invariants, drafters, numbers, depth), the rest from the changes below on every sample
(trees and the large bundled traces included): valid re-encodings, byte damage, cut files,
duplicated or dropped lines, one invariant broken, odd values and odd text.
"""
import json
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from bench.fuzz import mutate
from bench.fuzz.cases import ACCEPT, EITHER, REFUSE, Case, Refused
from bench.fuzz.cli import run_cli
from bench.fuzz.sandbox import Places
from engine.trace import TraceError, load_trace, loads_trace
from tests import hostile

KIND = "traces"
ROOT = Path(__file__).resolve().parents[2]
SAMPLE_FOLDERS = (ROOT / "assets" / "traces", ROOT / "tests" / "golden")
SOURCE = "case.jsonl"
HOSTILE_SEED = 7


@dataclass(frozen=True)
class Sample:
    name: str
    data: bytes

    @property
    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.data.split(b"\n") if line.strip()]


@dataclass
class Change:
    """A changed trace and what a reader must do with it: strictly, and when incomplete runs are allowed."""

    data: bytes
    expect: str
    expect_incomplete: str
    words: str
    max_bytes: int | None = None


def clocked(data: bytes) -> bytes:
    """A golden trace with clock readings again: tests/golden_traces.py stores them as 0, and a forward
    pass takes some time (the reader refuses a verify or a cycle of 0 s)."""
    records = [json.loads(line) for line in data.split(b"\n") if line.strip()]
    for r in records:
        for name, seconds in (("verify_time_s", 0.002), ("cycle_time_s", 0.005)):
            if r.get(name) == 0:
                r[name] = seconds
    return mutate.json_lines(records)


@lru_cache(maxsize=1)
def samples() -> tuple[Sample, ...]:
    paths = sorted(p for folder in SAMPLE_FOLDERS for p in folder.glob("*.jsonl"))
    return tuple(Sample(f"{p.parent.name}/{p.name}", clocked(p.read_bytes()) if p.parent.name == "golden" else p.read_bytes())
                 for p in paths)


@lru_cache(maxsize=1)
def hostile_samples() -> tuple[str, ...]:
    """The golden chain traces of a draft model, prompt lookup, another tokenizer or an EAGLE head:
    the shapes tests/hostile.py edits (it knows no tree records)."""
    return tuple(s.name for s in samples() if s.name.startswith("golden/") and "tree" not in s.name)


@lru_cache(maxsize=16)
def hostile_cases(name: str) -> tuple:
    sample = next(s for s in samples() if s.name == name)
    records = sample.records
    base = hostile.Base(name, records[0], records[1:-1], records[-1])
    return tuple(hostile.generate([base], seed=HOSTILE_SEED))


def from_hostile(rng: random.Random) -> Change:
    made = rng.choice(hostile_cases(rng.choice(hostile_samples())))
    strict = ACCEPT if made.expect == hostile.VALID else REFUSE
    lenient = ACCEPT if made.expect in (hostile.VALID, hostile.PARTIAL) else REFUSE
    return Change(made.data, strict, lenient, f"hostile {made.name}", made.max_bytes)


def valid_variant(rng: random.Random, sample: Sample) -> Change:
    records = sample.records
    style = rng.choice(["crlf", "reordered", "spaced", "ascii", "bom", "blank-lines", "no-final-newline"])
    if style == "crlf":
        data = mutate.json_lines(records, newline="\r\n")
    elif style == "reordered":
        data = mutate.json_lines([mutate.reordered(r, rng) for r in records])
    elif style in ("spaced", "ascii"):
        data = mutate.json_lines(records, style=style)
    elif style == "bom":
        data = b"\xef\xbb\xbf" + sample.data
    elif style == "blank-lines":
        data = b"\n" + sample.data.replace(b"\n", b"\n  \n")
    else:
        data = sample.data.rstrip(b"\n")
    return Change(data, ACCEPT, ACCEPT, f"{sample.name}: valid, {style}")


def byte_damage(rng: random.Random, sample: Sample) -> Change:
    data, words = mutate.flip_bytes(sample.data, rng)
    return Change(data, EITHER, EITHER, f"{sample.name}: {words}")


def cut_file(rng: random.Random, sample: Sample) -> Change:
    data, at = mutate.cut(sample.data, rng)
    whole = at >= len(sample.data.rstrip())  # only trailing whitespace lost
    return Change(data, ACCEPT if whole else REFUSE, ACCEPT if whole else EITHER, f"{sample.name}: cut at byte {at}")


def line_change(rng: random.Random, sample: Sample) -> Change:
    if rng.random() < 0.5:
        data, i = mutate.duplicate_line(sample.data, rng)
        return Change(data, REFUSE, REFUSE, f"{sample.name}: line {i + 1} duplicated")
    data, i = mutate.drop_line(sample.data, rng)
    summary = i == len(sample.records) - 1
    return Change(data, REFUSE, ACCEPT if summary else REFUSE, f"{sample.name}: line {i + 1} dropped")


# An invariant broken in one cycle: (path in the cycle record, new value from the old one and K).
CYCLE_BREAKS = [
    (("num_accepted",), lambda v, k: k + 1),
    (("num_accepted",), lambda v, k: -1),
    (("target_cache_len", "after_rollback"), lambda v, k: v + 1),
    (("target_cache_len", "before"), lambda v, k: v - 1),
    (("draft_cache_len", "after_append"), lambda v, k: v + 1),
    (("p_target", 0), lambda v, k: 1.5),
    (("p_draft", 0), lambda v, k: -0.25),
    (("accept_prob", 0), lambda v, k: 1.5),
    (("u", 0), lambda v, k: float("nan")),
    (("verify_time_s",), lambda v, k: -1.0),
    (("cycle_time_s",), lambda v, k: float("inf")),
    (("cycle",), lambda v, k: v + 1),
    (("committed_len_before",), lambda v, k: v + 1),
    (("committed_token_ids", 0), lambda v, k: -5),
]


def invariant_break(rng: random.Random, sample: Sample) -> Change:
    records = sample.records
    k = records[0]["settings"]["k"]
    for _ in range(20):
        ci = rng.randrange(1, len(records) - 1)
        path, new = rng.choice(CYCLE_BREAKS)
        try:
            old = mutate.get_path(records[ci], path)
        except (KeyError, IndexError, TypeError):
            continue  # this kind of cycle has no such field
        if not isinstance(old, (int, float)) or isinstance(old, bool):
            continue
        mutate.set_path(records[ci], path, new(old, k))
        words = f"{sample.name}: cycle line {ci + 1} {mutate.path_words(path)} {old!r} -> {new(old, k)!r}"
        return Change(mutate.json_lines(records), REFUSE, REFUSE, words)
    summary = records[-1]
    summary["num_generated"] += 1
    return Change(mutate.json_lines(records), REFUSE, REFUSE, f"{sample.name}: summary num_generated + 1")


def value_swap(rng: random.Random, sample: Sample) -> Change:
    records = sample.records
    i = rng.randrange(len(records))
    words = mutate.swap_random_leaf(records[i], rng)
    return Change(mutate.json_lines(records), EITHER, EITHER, f"{sample.name}: line {i + 1} {words}")


def odd_bytes(rng: random.Random, sample: Sample) -> Change:
    """Bytes no trace may hold (not UTF-8, a raw NUL), or odd text whose effect depends on where it lands."""
    what = rng.choice([b"\xed\xa0\x80", b"\xff", b"\x00", "\u202e".encode(), "\u2028".encode()])
    data = mutate.insert_bytes(sample.data, rng, what)
    fatal = what in (b"\xed\xa0\x80", b"\xff", b"\x00")  # never UTF-8 / never inside JSON
    expect = REFUSE if fatal else EITHER
    return Change(data, expect, expect, f"{sample.name}: inserted {what!r}")


FAMILIES = [(from_hostile, 10), (valid_variant, 3), (byte_damage, 2), (cut_file, 1), (line_change, 1),
            (invariant_break, 2), (value_swap, 2), (odd_bytes, 1)]


def trace_change(rng: random.Random) -> Change:
    family = rng.choices([f for f, _ in FAMILIES], weights=[w for _, w in FAMILIES])[0]
    if family is from_hostile:
        return from_hostile(rng)
    return family(rng, rng.choice(samples()))


def make(rng: random.Random, index: int, places: Places) -> Case:
    change = trace_change(rng)
    call = rng.choices(["loads", "load", "cli"], weights=[5, 3, 2])[0]
    if change.max_bytes is not None:
        call = "loads"  # a smaller size limit can only be handed to loads_trace
    expect = change.expect_incomplete if call == "cli" else change.expect
    return Case(KIND, index, change.words, expect, SOURCE, call, files={SOURCE: change.data} if call != "loads" else {},
                data=change.data if call == "loads" else b"", options={"max_bytes": change.max_bytes})


def attempt(case: Case, work: Path) -> str:
    if case.call == "cli":
        return run_cli(["stats", SOURCE])
    try:
        if case.call == "loads":
            limit = case.options.get("max_bytes")
            trace = loads_trace(case.data, SOURCE, **({"max_bytes": limit} if limit else {}))
        else:
            trace = load_trace(SOURCE)
    except TraceError as err:
        raise Refused(str(err)) from None
    return f"{len(trace.cycles)} cycles"
