"""A workload run through the batched cycle (engine/workload/batched.py): the same folder as an unbatched
workload, each request an ordinary trace equal to its own run, continuous batching, and the batch trace."""
import json
from dataclasses import replace

import pytest

from engine.cli import main
from engine.config import SettingsError, SpecSettings
from engine.cycle.plain import target_generate
from engine.run import encode_prompt
from engine.trace.batch_reader import BATCH_TRACE, BatchTraceError, check_against_workload, loads_batch_trace
from engine.trace.format import load_trace
from engine.workload.batched import run_batched_workload
from engine.workload.folder import open_workload
from engine.workload.manifest import MANIFEST
from engine.workload.run import run_workload
from tests.test_workload_run import REQUESTS, prompt_file, requests_of
from tests.tiny import noisy_pair, save_tiny

# Five requests of different lengths through two rows: rows take new requests as theirs finish.
MORE = REQUESTS + [{"id": "r5", "category": "logs", "prompt": "we went to the sea and the sky was grey and then"}]
# Batched and single-row float32 kernels round differently (and differently per CPU model): about 1e-7 on
# these probabilities here; 1e-4 leaves room for another CPU's kernels, while another row's or position's
# distribution differs by O(0.1)
PROB_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def pair():
    return noisy_pair(5, noise=0.05)  # a draft near the target: rows accept different counts


def accepted_by_request(workload) -> dict[int, list[int]]:
    return {e.index: [c["num_accepted"] for c in workload.trace(e).cycles] for e in workload.done}


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_each_request_equals_its_unbatched_run_and_the_batch_trace_agrees(pair, tmp_path, temperature):
    s = SpecSettings(k=3, temperature=temperature, top_k=8, max_new_tokens=10, seed=3)
    batched = run_batched_workload(pair, requests_of(MORE), s, tmp_path / "b", batch=2, prompts_name="p.jsonl",
                                   chat_template=False)
    alone = run_workload(pair, requests_of(MORE), replace(s, cache_layout="static"), tmp_path / "a",
                         prompts_name="p.jsonl", chat_template=False)
    assert [e.status for e in batched.entries] == ["done"] * 5
    for e, request in zip(batched.entries, requests_of(MORE)):
        trace = load_trace(tmp_path / "b" / e.file)  # checked as strictly as any trace
        single = alone.trace(alone.entries[e.index])
        assert trace.header["batch"]["rows"] == 2 and trace.header["settings"] == single.header["settings"]
        assert trace.summary["generated_token_ids"] == single.summary["generated_token_ids"]
        for got, want in zip(trace.cycles, single.cycles, strict=True):
            for key in ("draft_token_ids", "num_accepted", "committed_token_ids", "u", "target_cache_len",
                        "draft_cache_len", "draft_catch_up", "rejected_position", "bonus_token_id"):
                assert got[key] == want[key], (e.id, got["cycle"], key)
            for key in ("p_draft", "p_target", "accept_prob", "beta"):
                assert got[key] == pytest.approx(want[key], abs=PROB_TOLERANCE)
        if temperature == 0:
            ids = encode_prompt(pair.target.tokenizer, request.text, False)
            assert trace.summary["generated_token_ids"] == target_generate(pair.target, ids, s, pair.eos_ids)
    batch = loads_batch_trace((tmp_path / "b" / BATCH_TRACE).read_bytes())
    check_against_workload(batch, accepted_by_request(batched))
    assert {a["request"] for c in batch["cycles"] for a in c["admitted"]} == {2, 3, 4}  # continuous batching
    assert batch["cycles"][-1]["idle_rows"] <= 1 and batch["summary"]["requests_done"] == 5
    assert len({r.trace.summary["acceptance_rate"] for r in batched.runs()}) > 1  # rows accepted differently


def test_idle_rows_are_counted_and_ragged_rows_end_at_their_own_lengths(pair, tmp_path):
    s = SpecSettings(k=2, temperature=0.0, max_new_tokens=6)
    run_batched_workload(pair, requests_of(MORE[:3]), s, tmp_path / "b", batch=3, chat_template=False)
    batch = loads_batch_trace((tmp_path / "b" / BATCH_TRACE).read_bytes())
    assert batch["header"]["rows"] == 3 and not any(c["admitted"] for c in batch["cycles"])
    idle = [c["idle_rows"] for c in batch["cycles"]]
    assert idle == sorted(idle) and idle[-1] >= 1, "a row that finished early keeps its slot, counted idle"
    lengths = {tuple(r["target_cache_len"]["after_rollback"] for r in c["rows"] if not r["idle"])
               for c in batch["cycles"]}
    assert any(len(set(row_lengths)) > 1 for row_lengths in lengths)  # ragged rows


def good_batch(pair, tmp_path) -> bytes:
    run_batched_workload(pair, requests_of(MORE), SpecSettings(k=2, temperature=0.0, max_new_tokens=5),
                         tmp_path / "g", batch=2, chat_template=False)
    return (tmp_path / "g" / BATCH_TRACE).read_bytes()


def edit(data: bytes, line: int, change) -> bytes:
    lines = data.decode().splitlines()
    rec = json.loads(lines[line])
    change(rec)
    lines[line] = json.dumps(rec)
    return ("\n".join(lines) + "\n").encode()


HOSTILE = {
    "another format": (0, lambda h: h.update(format="other"), "not a batch trace"),
    "accepted beyond K": (1, lambda c: c["rows"][0].update(num_accepted=3), "accepted 0..2"),
    "a rollback off the convention": (1, lambda c: c["rows"][0]["target_cache_len"].update(after_rollback=999),
                                      "committed length - 1"),
    "a row missing": (1, lambda c: c["rows"].pop(), "must list all 2 rows"),
    "times that do not add up": (1, lambda c: c.update(cycle_time_s=c["cycle_time_s"] + 1), "add up"),
    "a negative time": (1, lambda c: c.update(verify_time_s=-1.0), "none negative"),
    "a wrong idle count": (1, lambda c: c.update(idle_rows=2), "count the idle rows"),
    "a request in two rows": (1, lambda c: c["rows"][1].update(request=c["rows"][0]["request"]), "two rows"),
    "fewer requests in the header than ran": (0, lambda h: h.update(requests=1), "the header says the workload has 1"),
    "a summary counting one more request": (-1, lambda s: s.update(requests_done=s["requests_done"] + 1),
                                            "requests finished"),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_a_batch_trace_that_contradicts_itself_is_refused(pair, tmp_path, name):
    line, change, message = HOSTILE[name]
    with pytest.raises(BatchTraceError, match=message):
        loads_batch_trace(edit(good_batch(pair, tmp_path), line, change))


def test_a_batch_trace_that_disagrees_with_the_requests_traces_is_refused(pair, tmp_path):
    batch = loads_batch_trace(good_batch(pair, tmp_path))
    workload = open_workload(tmp_path / "g")
    counts = accepted_by_request(workload)
    counts[0] = counts[0][:-1] + [counts[0][-1] + 1]
    with pytest.raises(BatchTraceError, match="request 0's accepted counts"):
        check_against_workload(batch, counts)
    for bad in (b"", b"\xff\xfe", b"[1, 2]\n", b'{"type": "batch_header"}\n'):
        with pytest.raises(BatchTraceError):
            loads_batch_trace(bad)


def test_a_request_traced_in_a_batch_says_so_and_a_bad_batch_header_is_refused(pair, tmp_path):
    from engine.trace.errors import TraceError
    from engine.trace.format import loads_trace
    run_batched_workload(pair, requests_of(MORE[:2]), SpecSettings(k=2, max_new_tokens=4), tmp_path / "b", batch=2,
                         chat_template=False)
    text = (tmp_path / "b" / "request-0002.jsonl").read_text()
    header = json.loads(text.splitlines()[0])
    assert header["batch"] == {"rows": 2, "row": 1} and header["cache_layout"]["name"] == "static"
    for bad in ({"rows": 2, "row": 2}, {"rows": 0, "row": 0}, {"rows": 2}, "two"):
        broken = json.dumps(header | {"batch": bad}) + "\n" + text.split("\n", 1)[1]
        with pytest.raises(TraceError, match="batch"):
            loads_trace(broken)


def test_what_the_batch_cannot_run_is_refused_before_anything_is_written(tmp_path):
    from engine.drafters.registry import DrafterOptions
    from engine.run import pair_for_target
    from engine.trace.schema import PROMPT_LOOKUP
    pair = noisy_pair(5, noise=0.05)
    lookup = pair_for_target(pair.target, DrafterOptions(kind=PROMPT_LOOKUP))
    for bad_pair, batch, message in ((pair, 0, "--batch must be"), (lookup, 2, "draft-model drafter only")):
        with pytest.raises(SettingsError, match=message):
            run_batched_workload(bad_pair, requests_of(), SpecSettings(k=2), tmp_path / "x", batch=batch)
        assert not (tmp_path / "x").exists()


def test_cli_runs_a_batched_workload_and_repeats_one_prompt(tmp_path, capsys):
    target, draft = save_tiny(noisy_pair(5, noise=0.05), tmp_path / "models")
    prompts = prompt_file(tmp_path)
    pair_args = ["--target", target, "--draft", draft, "--k", "2", "--max-new-tokens", "5"]
    assert main(["run", *pair_args, "--prompts", str(prompts), "--batch", "2", "--out", str(tmp_path / "w")]) == 0
    manifest = json.loads((tmp_path / "w" / MANIFEST).read_text())
    assert manifest["batch"] == {"rows": 2} and all(r["status"] == "done" for r in manifest["requests"])
    assert main(["stats", str(tmp_path / "w")]) == 0  # every workload view reads it
    assert main(["run", *pair_args, "--prompt", "a dog", "--batch", "3", "--temperature", "1",
                 "--out", str(tmp_path / "r")]) == 0
    repeated = open_workload(tmp_path / "r")
    seeds = {r.trace.header["settings"]["seed"] for r in repeated.runs()}
    assert [r.id for r in repeated.runs()] == ["copy-1", "copy-2", "copy-3"] and len(seeds) == 3
    capsys.readouterr()
    for extra, message in ((["--fast"], "--batch does not run with --fast"), (["--batch", "0"], "--batch must be"),
                           (["--cache", "paged"], "--batch does not run with --cache paged")):
        args = ["run", *pair_args, "--prompts", str(prompts), "--batch", "2", *extra, "--out", str(tmp_path / "x")]
        assert main(args) == 2
        assert message in capsys.readouterr().err and not (tmp_path / "x").exists()
