"""Trace files: self-consistency of what the engine writes, and clear errors for bad files."""
import json

import pytest

from engine.config import SpecSettings
from engine.run import run_to_trace
from engine.trace import TraceError, load_trace, loads_trace
from tests.checks import assert_self_consistent
from tests.tiny import noisy_pair


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "run.jsonl"
    pair = noisy_pair(0, noise=0.03)
    run_to_trace(pair, "the cat sat on", SpecSettings(k=4, temperature=1.0, max_new_tokens=40, seed=2), path)
    return path, pair


def test_trace_is_self_consistent(trace_file):
    path, pair = trace_file
    trace = load_trace(path)
    assert_self_consistent(trace)
    text = pair.target.tokenizer.decode(trace.summary["generated_token_ids"], skip_special_tokens=True)
    assert text == trace.summary["generated_text"]  # as a server answers: special tokens skipped


def test_summary_metrics_follow_vllm_definitions(trace_file):
    trace = load_trace(trace_file[0])
    accepted = [c["num_accepted"] for c in trace.cycles]
    s = trace.summary
    assert s["acceptance_rate"] == pytest.approx(sum(accepted) / (len(accepted) * trace.k))
    assert s["mean_acceptance_length"] == pytest.approx(1 + sum(accepted) / len(accepted))
    rates = s["per_position_acceptance"]
    assert rates == sorted(rates, reverse=True)
    assert rates[0] == pytest.approx(sum(n >= 1 for n in accepted) / len(accepted))


def lines_of(path) -> list[str]:
    return path.read_text().splitlines()


def test_truncated_file_is_incomplete_not_finished(trace_file):
    lines = lines_of(trace_file[0])
    cut = "\n".join(lines[:4]) + "\n" + lines[4][:30]
    with pytest.raises(TraceError, match="truncated"):
        loads_trace(cut)
    partial = loads_trace(cut, allow_incomplete=True)
    assert not partial.complete and len(partial.cycles) == 3
    with pytest.raises(TraceError, match="no summary"):
        loads_trace("\n".join(lines[:-1]))


@pytest.mark.parametrize("edit, message", [
    (lambda h, c: h.update(version=99), "version 99 is not supported"),
    (lambda h, c: h.update(format="other"), "not a speclab-trace"),
    (lambda h, c: h["settings"].pop("k"), "missing field 'k'"),
    (lambda h, c: c.pop("u"), "missing field 'u'"),
    (lambda h, c: c.update(p_draft="high"), "'p_draft' should be list"),
    (lambda h, c: c.update(num_accepted=True), "'num_accepted' should be int"),
    (lambda h, c: c.update(accept_prob=[0.5]), "field 'accept_prob': needs one entry per draft token"),
    (lambda h, c: c["target_cache_len"].pop("after_rollback"), "missing field 'after_rollback'"),
])
def test_malformed_trace_gets_a_clear_error(trace_file, edit, message):
    lines = lines_of(trace_file[0])
    header, cycle = json.loads(lines[0]), json.loads(lines[1])
    edit(header, cycle)
    broken = [json.dumps(header), json.dumps(cycle), *lines[2:]]
    with pytest.raises(TraceError, match=message):
        loads_trace("\n".join(broken))


@pytest.mark.parametrize("text, message", [
    ("", "empty"), ("not json\n", "not valid JSON"), ("[1, 2]\n", "JSON object"),
    ('{"type": "cycle"}\n', "first record must be the header"),
])
def test_garbage_gets_a_clear_error(text, message):
    with pytest.raises(TraceError, match=message):
        loads_trace(text)


def test_non_utf8_and_missing_files(tmp_path):
    with pytest.raises(TraceError, match="UTF-8"):
        loads_trace(b"\xff\xfe\x00")
    with pytest.raises(TraceError, match="not found"):
        load_trace(tmp_path / "nope.jsonl")


def test_reading_accepts_what_the_writer_writes_and_refuses_clearly(trace_file):
    text = trace_file[0].read_text(encoding="utf-8")
    header, rest = text.split("\n", 1)
    assert loads_trace("\ufeff" + text).complete  # a BOM
    assert loads_trace(text.replace("\n", "\r\n")).complete  # Windows line ends
    cases = {
        header[:-1] + ', "x": 1e999}\n' + rest: "line 1: the number 1e999 is too large to be a finite number",
        header[:-1] + ', "x": -Infinity}\n' + rest: "line 1: -Infinity is not a number a trace may hold",
        header[:-1] + ', "x": ' + "[" * 17 + "]" * 17 + "}\n" + rest: "line 1: the record nests more than 16 levels deep",
        header[:-1] + ', "x": ' + "[" * 5000 + "]" * 5000 + "}\n" + rest: "line 1: the record nests more than 16",
    }
    for bad, message in cases.items():
        with pytest.raises(TraceError, match=message):
            loads_trace(bad)
    with pytest.raises(TraceError, match=r"MiB is larger than the 0 MiB"):
        loads_trace(text, max_bytes=1000)


def test_an_inconsistent_cycle_is_refused_naming_line_cycle_field_and_rule(trace_file):
    lines = lines_of(trace_file[0])
    cycle = json.loads(lines[2])
    cycle["accept_prob"][0] = cycle["accept_prob"][0] + 0.05 if cycle["accept_prob"][0] < 0.9 else 0.5
    broken = "\n".join([lines[0], lines[1], json.dumps(cycle), *lines[3:]])
    with pytest.raises(TraceError, match=r"line 3 \(cycle 1\): field 'accept_prob\[0\]': must equal "
                                         r"min\(1, p_target/p_draft\)"):
        loads_trace(broken)
