"""The engine as a server's replica (`python -m engine replica`): a live vLLM's greedy n-gram requests run
again through the lab's prompt lookup from the server's prompt ids match it step by step and token by
token; the alignment of vLLM's per-step lists with the replica's cycles; hostile inputs refused in one
line; and the Workload page showing a replica's comparison with links into the stepper at its cycle."""
import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.ui.state import parse_request_name, parse_token
from engine.cli import main
from engine.replica.align import Difference, Step, compare_request, drafting_cycles, first_difference, server_steps
from engine.replica.comparison import REPLICA_FILE, ReplicaFileError, loads_comparison
from engine.replica.server_workload import ServerWorkloadError, read_server_workload
from engine.replica.settings import replica_plan
from engine.workload.folder import open_folder
from engine.workload.manifest import Entry
from tests.replica_sample import (
    MAIN,
    NGRAM,
    PARTED,
    build_replica_runs,
    open_workload_page,
    server_folder,
    stepper_links,
)
from tests.server_workload_sample import PROMPTS, write_server_workload

# ---------------------------------------------------------------- live: the replica matches vLLM

def test_the_replica_matches_every_greedy_request_step_by_step_and_token_by_token(ngram_server, tmp_path, capsys):
    server_folder = write_server_workload(ngram_server, tmp_path / "server")
    out = tmp_path / "replica"
    capsys.readouterr()  # the client's own report
    assert main(["replica", str(server_folder), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in printed[:len(PROMPTS)]] == [rid for rid, _, _ in PROMPTS]
    assert all(": equal (" in line for line in printed[:len(PROMPTS)]), printed
    assert printed[len(PROMPTS)].startswith(f"{len(PROMPTS)} of {len(PROMPTS)} requests equal")
    # Checked here from the traces themselves, not through the replica's own comparison.
    server = read_server_workload(server_folder)
    replica = open_folder(out)
    drafted_somewhere = 0
    for answer, entry in zip(server.answers, replica.entries, strict=True):
        trace = replica.trace(entry)
        assert trace.header["prompt_token_ids"] == answer.prompt_ids  # the server's ids, fed as they are
        drafting = [(len(c["draft_token_ids"]), c["num_accepted"]) for c in trace.cycles if c["draft_token_ids"]]
        assert drafting == list(zip(answer.drafted_per_step, answer.accepted_per_step)), entry.id
        assert [t for c in trace.cycles for t in c["committed_token_ids"]] == answer.token_ids, entry.id
        drafted_somewhere += bool(drafting)
    assert drafted_somewhere >= 3  # the prompts repeat themselves: most requests draft
    body = json.loads((out / REPLICA_FILE).read_text())
    assert [r["id"] for r in body["requests"]] == [rid for rid, _, _ in PROMPTS]
    assert all(r["equal"] and r["tokens_equal"] and r["first_difference"] is None for r in body["requests"])
    k = replica.manifest["settings"]["k"]
    assert k == 3 and replica.manifest["pair"]["drafter"] == {"kind": "prompt-lookup", "max_ngram": 4, "min_ngram": 2,
                                                               "ngram_match": "earliest"}
    assert len(loads_comparison((out / REPLICA_FILE).read_bytes(), "replica", k, replica.entries)) == len(PROMPTS)
    # The same traces against an answer altered at its second drafting step part there, at that step's cycle.
    answer, entry = next((a, e) for a, e in zip(server.answers, replica.entries) if len(a.drafted_per_step) >= 2)
    cycles = replica.trace(entry).cycles
    accepted = list(answer.accepted_per_step)
    accepted[1] = (accepted[1] + 1) % (answer.drafted_per_step[1] + 1)
    parted = compare_request(entry.id, server_steps(answer.drafted_per_step, accepted), answer.token_ids, cycles)
    assert parted.first_difference.step == 1 and not parted.equal and parted.tokens_equal
    assert parted.first_difference.replica_cycle == [c["cycle"] for c in cycles if c["draft_token_ids"]][1]


# ---------------------------------------------------------------- alignment on hand-built lists

def cycle(i: int, drafted: int, accepted: int, committed: list[int] | None = None) -> dict:
    return {"cycle": i, "draft_token_ids": list(range(drafted)), "num_accepted": accepted,
            "committed_token_ids": committed if committed is not None else [7] * (accepted + 1)}


def test_equal_lists_are_equal():
    cycles = [cycle(0, 3, 3), cycle(1, 3, 1), cycle(2, 2, 0)]
    tokens = [t for c in cycles for t in c["committed_token_ids"]]
    c = compare_request("r", server_steps([3, 3, 2], [3, 1, 0]), tokens, cycles)
    assert c.equal and c.tokens_equal and c.first_difference is None
    assert (c.server_steps, c.replica_drafting_cycles) == (3, 3)


def test_the_first_step_where_they_part_is_named_with_the_replicas_cycle():
    cycles = [cycle(0, 3, 3), cycle(1, 3, 2), cycle(2, 3, 3)]
    c = compare_request("r", server_steps([3, 3, 3], [3, 1, 3]), [], cycles)
    assert not c.equal
    assert c.first_difference == Difference(1, 3, 1, 3, 2, 1)


def test_cycles_that_drafted_nothing_are_skipped_and_keep_their_trace_index():
    # vLLM counts no step whose n-gram lookup found nothing; the trace records those cycles too.
    cycles = [cycle(0, 0, 0), cycle(1, 3, 3), cycle(2, 0, 0), cycle(3, 0, 0), cycle(4, 2, 1), cycle(5, 3, 0)]
    assert drafting_cycles(cycles) == [Step(3, 3, 1), Step(2, 1, 4), Step(3, 0, 5)]
    tokens = [t for c in cycles for t in c["committed_token_ids"]]
    assert compare_request("r", server_steps([3, 2, 3], [3, 1, 0]), tokens, cycles).equal
    parted = compare_request("r", server_steps([3, 2, 3], [3, 1, 1]), tokens, cycles)
    assert parted.first_difference == Difference(2, 3, 1, 3, 0, 5)  # step 2 is trace cycle 5


def test_a_side_that_runs_out_of_steps_parts_there():
    assert first_difference([Step(3, 3), Step(3, 1)], [Step(3, 3, 0)]) == Difference(1, 3, 1, None, None, None)
    assert first_difference([Step(3, 3)], [Step(3, 3, 0), Step(1, 0, 4)]) == Difference(1, None, None, 1, 0, 4)


def test_equal_steps_with_other_tokens_are_not_equal():
    cycles = [cycle(0, 3, 3, [1, 2, 3, 4])]
    c = compare_request("r", server_steps([3], [3]), [1, 2, 3, 5], cycles)
    assert not c.equal and not c.tokens_equal and c.first_difference is None


# ---------------------------------------------------------------- what is refused, in one line

ENTRIES = [Entry(i, i + 1, f"r{i}", "c", "f" * 16, f"request-{i + 1:04d}.jsonl", "done",
                 {"num_cycles": 10}, None) for i in range(3)]


def valid_body() -> dict:
    return {"format": "speclab-replica", "version": 1, "server_workload": "s", "server": {}, "speculative_config": NGRAM,
            "requests": [{"id": "r0", "equal": True, "server_steps": 2, "replica_drafting_cycles": 2,
                          "tokens_equal": True, "first_difference": None},
                         {"id": "r1", "equal": False, "server_steps": 4, "replica_drafting_cycles": 4,
                          "tokens_equal": False, "first_difference": {"step": 1, "server_drafted": 3,
                          "server_accepted": 1, "replica_drafted": 3, "replica_accepted": 2, "replica_cycle": 6}}]}


def test_a_valid_comparison_reads_back():
    read = loads_comparison(json.dumps(valid_body()).encode(), "rep", 3, ENTRIES)
    assert read[1].first_difference == Difference(1, 3, 1, 3, 2, 6)


def hostile(change) -> bytes:
    body = valid_body()
    change(body)
    return json.dumps(body).encode()


HOSTILE = {
    "not JSON": b"{\"format\": NaN",
    "another format": hostile(lambda b: b.update(format="speclab-workload")),
    "an unknown request": hostile(lambda b: b["requests"][0].update(id="<script>")),
    "a cycle beyond the trace": hostile(lambda b: b["requests"][1]["first_difference"].update(replica_cycle=10)),
    "a negative step": hostile(lambda b: b["requests"][1]["first_difference"].update(step=-1)),
    "more accepted than drafted": hostile(lambda b: b["requests"][1]["first_difference"].update(replica_accepted=3,
                                                                                                replica_drafted=2)),
    "drafted beyond K": hostile(lambda b: b["requests"][1]["first_difference"].update(server_drafted=4)),
    "equal with a difference": hostile(lambda b: b["requests"][1].update(equal=True)),
    "equal with other tokens": hostile(lambda b: b["requests"][0].update(tokens_equal=False)),
    "a step no side took": hostile(lambda b: b["requests"][1]["first_difference"].update(step=4)),
    "a string count": hostile(lambda b: b["requests"][0].update(server_steps="2")),
    "a duplicate id": hostile(lambda b: b["requests"][1].update(id="r0")),
    "an extra key": hostile(lambda b: b["requests"][0].update(html="<b>")),
    "no requests": hostile(lambda b: b.update(requests=[])),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_replica_file_is_refused_in_one_line(name):
    with pytest.raises(ReplicaFileError) as err:
        loads_comparison(HOSTILE[name], "rep", 3, ENTRIES)
    assert "\n" not in str(err.value) and str(err.value).startswith("rep: ")


@pytest.mark.parametrize("config, temperature, says", [
    (None, 0.0, "without speculative decoding"),
    ({"method": "eagle3", "num_speculative_tokens": 3}, 0.0, "'eagle3'"),
    (NGRAM, 0.7, "temperature 0.7"),
    (NGRAM | {"num_speculative_tokens": 0}, 0.0, "num_speculative_tokens"),
    (NGRAM | {"prompt_lookup_max": 1}, 0.0, "prompt_lookup_max"),
])
def test_what_the_lab_cannot_replicate_is_refused_saying_what_it_can(config, temperature, says):
    with pytest.raises(ServerWorkloadError) as err:
        replica_plan(config, temperature)
    assert says in str(err.value) and "\"ngram\"" in str(err.value) and "\n" not in str(err.value)


def test_the_plan_for_vllms_ngram_is_prompt_lookup_at_its_k_and_range():
    plan = replica_plan(NGRAM, 0.0)
    assert (plan.k, plan.drafter.kind, plan.drafter.min_ngram, plan.drafter.max_ngram) == (3, "prompt-lookup", 2, 4)
    assert plan.drafter.ngram_match == "earliest"  # vLLM V1 copies after the n-gram's first occurrence


def test_the_reader_takes_the_servers_ids_and_steps(tmp_path):
    (a,) = read_server_workload(server_folder(tmp_path / "s")).answers
    assert (a.prompt_ids, a.token_ids, a.drafted_per_step, a.accepted_per_step, a.max_tokens) == ([1, 2, 3], [4, 5, 2],
                                                                                                 [3], [1], 8)
    assert a.request.messages == (("user", "hi"),)


def test_a_request_that_never_drafted_has_no_steps_though_vllm_writes_null(tmp_path):
    folder = server_folder(tmp_path / "s")
    line = json.loads((folder / "answers.jsonl").read_text())
    line["answer"]["metrics"]["speculative_decoding"] = {
        "mean_acceptance_length": 1.0, "draft_acceptance_rate": 0.0, "acceptance_histogram": [0, 0, 0, 0],
        "num_spec_steps": 0, "num_accepted_draft_tokens": 0, "num_draft_tokens": 0, "num_spec_tokens": 3,
        "per_step_accepted": None, "per_step_drafted": None}  # as a live vLLM 0.32 answers it
    (folder / "answers.jsonl").write_text(json.dumps(line) + "\n")
    (a,) = read_server_workload(folder).answers
    assert (a.drafted_per_step, a.accepted_per_step) == ([], [])


def no_prompt_ids(line: dict) -> None:
    del line["answer"]["prompt_token_ids"]


def a_negative_id(line: dict) -> None:
    line["answer"]["prompt_token_ids"] = [1, -2]


def no_metrics(line: dict) -> None:
    del line["answer"]["metrics"]


def no_step_lists(line: dict) -> None:
    del line["answer"]["metrics"]["speculative_decoding"]["per_step_accepted"]
    del line["answer"]["metrics"]["speculative_decoding"]["per_step_drafted"]


def edited_line(tmp: Path, edit) -> str:
    line = json.loads((server_folder(tmp) / "answers.jsonl").read_text())
    edit(line)
    return json.dumps(line)


@pytest.mark.parametrize("config, edit, says", [
    ({"method": "eagle", "num_speculative_tokens": 3}, None, "'eagle'"),
    (NGRAM, "{not json", "answers.jsonl line 1"),
    (NGRAM, a_negative_id, "prompt_token_ids"),
    (NGRAM, no_prompt_ids, "return_token_ids"),
    (NGRAM, no_metrics, "speculative_decoding"),
    (NGRAM, no_step_lists, "--per-request-spec-decode-metrics detailed"),
])
def test_the_command_refuses_a_server_workload_in_one_line_with_exit_code_2(tmp_path, capsys, config, edit, says):
    line = edit if edit is None or isinstance(edit, str) else edited_line(tmp_path / "good", edit)
    folder = server_folder(tmp_path / "s", config, line)
    assert main(["replica", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and says in err, err
    assert not (folder / "replica").exists()  # refused before anything was written or loaded


def test_a_used_out_folder_is_refused(tmp_path, capsys):
    folder = server_folder(tmp_path / "s")
    (folder / "replica").mkdir()
    (folder / "replica" / "x").write_text("x")
    assert main(["replica", str(folder)]) == 2
    assert "not an empty folder" in capsys.readouterr().err


# ---------------------------------------------------------------- the Workload page shows a replica

@pytest.fixture
def replica_runs(tmp_path, example_traces) -> tuple[Path, int]:
    return build_replica_runs(tmp_path, Path(example_traces["sampled"]))


def test_the_workload_page_shows_a_replica_and_its_link_opens_the_stepper_at_that_cycle(replica_runs, monkeypatch):
    root, parted_at = replica_runs
    at = open_workload_page(root, monkeypatch)
    assert [s.value for s in at.subheader] == ["Against its server"]
    shown = "\n".join(m.value for m in at.markdown).replace("\\", "")
    assert "equal, step by step and token by token" in shown
    assert f"parts at drafting step 1 (replica cycle {parted_at})" in shown
    parted = [(t, q) for t, q in stepper_links(at) if " · cycle " in t]
    assert len(parted) == 1
    text, query = parted[0]
    assert text.endswith(f" · cycle {parted_at}") and query["cycle"] == str(parted_at)
    ref = parse_token(query["trace"])
    assert parse_request_name(ref.name) == ("run", "replica-of-vllm", PARTED)
    # Following the link: a new session whose URL carries the query opens the stepper at that cycle.
    stepper = AppTest.from_file(str(MAIN), default_timeout=120)
    stepper.query_params.update(query)
    stepper.run()
    assert not stepper.exception, [e.value for e in stepper.exception]
    assert stepper.session_state["trace_ref"].name == ref.name
    assert stepper.session_state["cycle"] == parted_at


def test_a_hostile_replica_file_on_the_page_is_one_escaped_line(replica_runs, monkeypatch):
    root, _ = replica_runs
    path = root / "runs" / "workloads" / "replica-of-vllm" / REPLICA_FILE
    body = json.loads(path.read_text())
    body["requests"][1]["first_difference"]["replica_cycle"] = 10**6
    path.write_text(json.dumps(body))
    at = open_workload_page(root, monkeypatch)
    (error,) = at.error
    assert "replica_cycle" in error.value.replace("\\", "") and "\n" not in error.value
    assert not at.subheader  # no comparison drawn from a file that was refused
