"""Every golden case (tests/golden_traces.py) run with the current code equals its stored output in tests/golden/.

The goldens were written by the code before a refactor that must not change any trace: each case is
run again here, normalised the same way (timings, dates, machine names and temporary paths out),
and compared record by record. Ints, strings, booleans, nulls, key order and list lengths must be
equal; floats within FLOAT_REL / FLOAT_ABS. To accept an intended change of the traces, rewrite the
goldens with `python tests/golden_traces.py --write` and review the diff.
"""
import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.golden_traces import CASES, GOLDEN, TP_CASE, generate, normalise, read_golden, tp_unavailable

# A stored golden is compared with a run on whatever machine runs the tests: float32 matmuls and
# softmaxes take other kernels on another CPU model (AVX2 or AVX-512 oneDNN paths, other blockings), which
# sum in another order and differ in the 6th-7th significant digit, ~1e-7 relative per operation. Over
# the tiny models' two layers and a softmax that grows to ~1e-6, so a bit-exact float comparison would
# fail across machines (two torch threads instead of one already move these cases' floats by up to
# 4e-7 relative). rel 1e-4 leaves a hundredfold margin above that, while anything the refactor could
# really change (another token's or position's probability, a residual instead of the target's row, a
# draw from another generator state) moves these values by 1e-2 or more. abs 1e-6 is for values near 0
# (a softmax tail of ~1e-8), whose relative error is large though their meaning is unchanged.
FLOAT_REL = 1e-4
FLOAT_ABS = 1e-6


def first_difference(got: Any, want: Any, path: str = "$") -> str | None:
    """Where `got` first departs from `want` (a JSON path and what differs), or None when they agree:
    dict keys in the same order, list lengths, ints, strings, booleans and nulls exactly, floats
    within the tolerance. A float never equals an int: json writes 1.0 and 1 differently."""
    if isinstance(want, dict) and isinstance(got, dict):
        if list(got) != list(want):
            return f"{path}: keys {list(got)} != golden {list(want)}"
        for key in want:
            found = first_difference(got[key], want[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return f"{path}: {len(got)} items != golden {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            found = first_difference(g, w, f"{path}[{i}]")
            if found:
                return found
        return None
    if type(got) is not type(want):
        return f"{path}: {got!r} ({type(got).__name__}) != golden {want!r} ({type(want).__name__})"
    if isinstance(want, float):
        if math.isclose(got, want, rel_tol=FLOAT_REL, abs_tol=FLOAT_ABS):
            return None
        return f"{path}: {got!r} != golden {want!r} (beyond rel {FLOAT_REL}, abs {FLOAT_ABS})"
    return None if got == want else f"{path}: {got!r} != golden {want!r}"


def assert_same_file(case: str, name: str, got: str, want: str) -> None:
    """Two normalised files agree line by line; the message names the case, the file, the line and the path."""
    got_lines, want_lines = got.splitlines(), want.splitlines()
    for n, (g, w) in enumerate(zip(got_lines, want_lines), 1):
        found = first_difference(json.loads(g), json.loads(w))
        assert found is None, f"{case}: {name} line {n}: {found}"
    assert len(got_lines) == len(want_lines), f"{case}: {name} has {len(got_lines)} lines, golden {len(want_lines)}"


def assert_same_output(case: str, got: dict[str, str], want: dict[str, str]) -> None:
    assert want, f"{case}: no golden in {GOLDEN}; write it with `python tests/golden_traces.py --write`"
    assert sorted(got) == sorted(want), f"{case}: files {sorted(got)} != golden {sorted(want)}"
    for name in want:
        assert_same_file(case, name, got[name], want[name])


@pytest.mark.parametrize("case", list(CASES))
def test_the_current_code_writes_the_golden_trace(case, tmp_path):
    if case == TP_CASE and tp_unavailable():
        pytest.skip(f"tensor parallelism cannot run here: {tp_unavailable()}")
    assert_same_output(case, generate(case, tmp_path), read_golden(case))


# ---------------------------------------------------------------- the comparison can fail

def golden_lines(case: str = "chain_sampled_dynamic") -> list[dict]:
    return [json.loads(line) for line in read_golden(case)[f"{case}.jsonl"].splitlines()]


def first_cycle_with_a_draft(records: list[dict]) -> int:
    return next(i for i, r in enumerate(records) if r["type"] == "cycle" and r["draft_token_ids"])


def as_text(records: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def test_a_golden_equals_itself_and_a_float_within_the_tolerance():
    records = golden_lines()
    assert_same_output("self", {"t.jsonl": as_text(records)}, {"t.jsonl": as_text(records)})
    i = first_cycle_with_a_draft(records)
    nudged = json.loads(json.dumps(records))
    nudged[i]["p_target"][0] *= 1 + FLOAT_REL / 10  # a rounding difference of another CPU's kernels
    assert_same_output("nudged", {"t.jsonl": as_text(nudged)}, {"t.jsonl": as_text(records)})


def changed(records: list[dict], change) -> str:
    copy = json.loads(json.dumps(records))
    change(copy)
    return as_text(copy)


def swap_first_two_keys(record: dict) -> None:
    keys = list(record)
    items = [(keys[1], record[keys[1]]), (keys[0], record[keys[0]])] + [(k, record[k]) for k in keys[2:]]
    record.clear()
    record.update(items)


# Each change to the golden's first cycle with a draft (line n), and the message that must name it.
CHANGES = [
    pytest.param(lambda r, i: r[i]["draft_token_ids"].__setitem__(0, r[i]["draft_token_ids"][0] ^ 1),
                 r"line {n}: \$\.draft_token_ids\[0\]: \d+ != golden \d+", id="a token id"),
    pytest.param(lambda r, i: swap_first_two_keys(r[i]), r"line {n}: \$: keys \['cycle', 'type'", id="the key order"),
    pytest.param(lambda r, i: r[i]["p_target"].__setitem__(0, r[i]["p_target"][0] * 1.01),
                 r"line {n}: \$\.p_target\[0\]: .* \(beyond rel", id="a float beyond the tolerance"),
    pytest.param(lambda r, i: r[i].__setitem__("num_accepted", float(r[i]["num_accepted"])),
                 r"line {n}: \$\.num_accepted: .*\(float\) != golden .*\(int\)", id="an int written as a float"),
    pytest.param(lambda r, i: r[i]["committed_token_ids"].append(1), r"line {n}: \$\.committed_token_ids: \d+ items",
                 id="a list's length"),
    pytest.param(lambda r, i: r[0]["settings"].__setitem__("cache_layout", "paged"),
                 r"line 1: \$\.settings\.cache_layout: 'paged' != golden 'dynamic'", id="a nested string"),
    pytest.param(lambda r, i: r.pop(), r"has \d+ lines, golden \d+", id="a dropped line"),
]


@pytest.mark.parametrize("change, message", CHANGES)
def test_a_changed_trace_fails_and_the_message_says_where(change, message):
    records = golden_lines()
    i = first_cycle_with_a_draft(records)
    got = changed(records, lambda r: change(r, i))
    with pytest.raises(AssertionError, match=f"^mutated: t.jsonl {message.format(n=i + 1)}"):
        assert_same_output("mutated", {"t.jsonl": got}, {"t.jsonl": as_text(records)})


def test_a_missing_or_extra_workload_file_fails():
    want = read_golden("batched_workload")
    missing = {name: text for name, text in want.items() if not name.endswith("request-0005.jsonl")}
    extra = want | {"batched_workload/request-0006.jsonl": want["batched_workload/request-0005.jsonl"]}
    for got in (missing, extra):
        with pytest.raises(AssertionError, match=r"^batched_workload: files \["):
            assert_same_output("batched_workload", got, want)


def test_normalising_drops_only_timings_dates_machine_and_temporary_paths(tmp_path):
    raw = [{"type": "header", "created": "2030-01-02T03:04:05Z", "name": f"{tmp_path}/target", "k": 3,
            "versions": {"python": "3.11.7", "torch": "2.13.0+cpu", "transformers": "5.24.0"},
            "tensor_parallel": {"ranks": [{"rank": 0, "host": "node-7", "device": "cpu"}]},
            "machine": {"cpu": "Some CPU", "features": "avx2", "threads": 8, "device": "cpu"}},
           {"type": "cycle", "draft_time_s": 0.25, "draft_step_times_s": [0.1, 0.2], "u": [0.5], "p": 0.125,
            "admitted": [{"row": 1, "prefill_s": 0.01}], "tokens_per_s": 12}]
    text = "".join(json.dumps(r) + "\n" for r in raw)
    header, cycle = (json.loads(line) for line in normalise(text, (str(tmp_path),)).splitlines())
    assert list(header) == list(raw[0]) and list(cycle) == list(raw[1])  # key order kept
    assert header["created"] == "<created>" and header["name"] == "<tmp>/target" and header["k"] == 3
    assert header["tensor_parallel"]["ranks"] == [{"rank": 0, "host": "<machine>", "device": "cpu"}]
    assert header["versions"] == {"python": "<machine>", "torch": "<machine>", "transformers": "<machine>"}
    assert header["machine"] == {"cpu": "<machine>", "features": "<machine>", "threads": "<machine>", "device": "cpu"}
    assert cycle == {"type": "cycle", "draft_time_s": 0.0, "draft_step_times_s": [0.0, 0.0], "u": [0.5], "p": 0.125,
                     "admitted": [{"row": 1, "prefill_s": 0.0}], "tokens_per_s": 0}
    # One indented JSON document (a manifest) becomes one line.
    assert normalise(json.dumps(raw[1], indent=1)) == json.dumps(cycle) + "\n"


def test_two_runs_of_a_case_write_the_same_normalised_text(tmp_path):
    """Same seed, same output: what differs between two runs is only what `normalise` takes out."""
    first = generate("chain_sampled_paged", tmp_path / "a")
    second = generate("chain_sampled_paged", tmp_path / "b")
    assert first == second


def test_every_case_has_a_golden():
    stored = {p.name.removesuffix(".jsonl") for p in Path(GOLDEN).iterdir()}
    assert stored == set(CASES)
