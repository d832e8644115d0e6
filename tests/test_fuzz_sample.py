"""A fast sample of the fuzz harness (bench/fuzz/, `python -m bench.fuzz`): a dozen cases of every kind of
input, each in its own forked process, must end as its oracle says: no crash, no hang, no running out
of memory, no wrong accept, no valid input refused, no file written outside.

Failures of the defect classes the harness was written to find (bench/fuzz/cases.py KNOWN, fixed
since) are counted apart, each class in its own test, so a class that comes back is named by its test.
The harness's own checks come first: a case that crashes, hangs, runs out of memory, writes outside
or refuses in two lines must be seen as such, or the sample could pass by seeing nothing.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.fuzz.cases import CRASH, HANG, KNOWN, MEMORY, REFUSE, REFUSED, Case, Refused
from bench.fuzz.run import KINDS, changes, judge
from bench.fuzz.sandbox import Limits, Places, Result, fresh_work, run_forked, snapshot

ROOT = Path(__file__).resolve().parent.parent
CASES = 12  # per kind: about 100 cases, a few seconds once the engine is imported
SEED = 0
CASE_SECONDS = 300  # far above any case's cost on a busy machine: reaching it is a hang


# ---------------------------------------------------------------- the harness sees each kind of failure

def crashes(case: Case, work: Path) -> str:
    return str(1 / 0)


def sleeps(case: Case, work: Path) -> str:
    time.sleep(3600)
    return ""


def allocates(case: Case, work: Path) -> str:
    return str(len(bytearray(2**30)))


def writes_canary(case: Case, work: Path) -> str:
    (work.parent / "canary" / "keep-me.txt").write_text("changed")
    return ""


def refuses_in_two_lines(case: Case, work: Path) -> str:
    raise Refused("input.jsonl line 3:\nsecond line")


def refuses_without_source(case: Case, work: Path) -> str:
    raise Refused("something is wrong")


def accepts(case: Case, work: Path) -> str:
    return (work / "input.jsonl").read_text()


@pytest.mark.parametrize("attempt, outcome", [(crashes, CRASH), (sleeps, HANG), (allocates, MEMORY),
                                              (refuses_in_two_lines, CRASH), (refuses_without_source, CRASH)])
def test_the_harness_sees_each_kind_of_failure(tmp_path, attempt, outcome):
    places = Places.make(tmp_path)
    case = Case("self-test", 0, "a harness check", REFUSE, "input.jsonl", "call", files={"input.jsonl": b"{}"})
    fresh_work(places, case.files)
    limits = Limits(seconds=1.0 if attempt is sleeps else CASE_SECONDS, memory_mib=64)
    result = judge(case, run_forked(attempt, case, places, limits))
    assert result.outcome == outcome, result


def test_the_harness_sees_a_file_written_outside_and_a_clean_case(tmp_path):
    places = Places.make(tmp_path)
    case = Case("self-test", 0, "a harness check", REFUSE, "input.jsonl", "call", files={"input.jsonl": b"{}"})
    for attempt, outside in ((accepts, []), (writes_canary, ["canary/keep-me.txt"])):
        fresh_work(places, case.files)
        before = snapshot(places, None)
        result = run_forked(attempt, case, places, Limits(seconds=CASE_SECONDS))
        assert (result.outcome, changes(before, snapshot(places, None))) == ("accepted", outside)


def test_a_one_line_refusal_naming_its_source_stays_a_refusal():
    case = Case("self-test", 0, "", REFUSE, "input.jsonl", "call")
    assert judge(case, Result(REFUSED, "input.jsonl line 3: field 'k': out of range")).outcome == REFUSED


# ---------------------------------------------------------------- the sample

@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> dict:
    """The sample run as the command line runs it, in a process of its own (it forks one child per case,
    which wants a parent with no other threads)."""
    out = tmp_path_factory.mktemp("fuzz")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "bench.fuzz", "--cases", str(CASES), "--seed", str(SEED),
                           "--seconds", str(CASE_SECONDS), "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    written = list(out.glob("fuzz-*.json"))
    assert written, f"no results (exit {done.returncode}): {done.stderr[-2000:]}"
    return json.loads(written[0].read_text())


def failing(sample: dict, keep) -> list[str]:
    """'kind: class, case N: change -> message' for the example failures `keep(known)` selects."""
    return [f"{kind}: {cls}, case {e['index']}: {e['change']} -> {e['outcome']}: {e['message'][:200]}"
            for kind, by_class in sample["examples"].items() for cls, rows in by_class.items() for e in rows
            if keep(e["known"])]


def test_every_kind_ran_its_cases_and_met_both_oracles(sample):
    kinds = sample["kinds"]
    assert list(kinds) == list(KINDS)
    assert all(t["cases"] == CASES for t in kinds.values())
    assert all(t["accepted"] > 0 and t["refused"] > 0 for t in kinds.values()), \
        {k: (t["accepted"], t["refused"]) for k, t in kinds.items()}


def test_no_failure_that_no_known_defect_explains(sample):
    unknown = {kind: t["unknown"] for kind, t in sample["kinds"].items() if t["unknown"]}
    assert not unknown, f"{unknown}; the first of them: {failing(sample, lambda known: known is None)[:8]}"


@pytest.mark.parametrize("defect", list(KNOWN))
def test_no_failure_of_a_known_defect(sample, defect):
    found = {kind: t["known"][defect] for kind, t in sample["kinds"].items() if t["known"].get(defect)}
    assert not found, f"{defect}: {found}; {failing(sample, lambda known: known == defect)[:5]}"
