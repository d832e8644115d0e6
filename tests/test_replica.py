"""The engine as a server's replica (`python -m engine replica`): a live vLLM's greedy n-gram requests run
again through the lab's prompt lookup from the server's prompt ids match it step by step and token by
token; the alignment of vLLM's per-step lists with the replica's cycles; hostile inputs refused in one
line; and the Workload page showing a replica's comparison with links into the stepper at its cycle."""
import json
import math
import re
import tempfile
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.ui.state import parse_request_name, parse_token
from engine.cli import main
from engine.replica.align import Difference, Step, compare_request, drafting_cycles, first_difference, server_steps
from engine.replica.comparison import REPLICA_FILE, ReplicaFileError, loads_comparison, write_sampled
from engine.replica.report import sampled_lines, sampled_request_line
from engine.replica.sampled import (
    SampledComparison,
    SampledRequest,
    compare_sampled,
    overall,
    position_row,
    position_rows,
    sampled_request,
    two_proportions,
    wilson,
)
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
                                                               "ngram_match": "earliest", "after_first_token": True}
    assert len(loads_comparison((out / REPLICA_FILE).read_bytes(), "replica", k, replica.entries)) == len(PROMPTS)
    # The same traces against an answer altered at its second drafting step part there, at that step's cycle.
    answer, entry = next((a, e) for a, e in zip(server.answers, replica.entries) if len(a.drafted_per_step) >= 2)
    cycles = replica.trace(entry).cycles
    accepted = list(answer.accepted_per_step)
    accepted[1] = (accepted[1] + 1) % (answer.drafted_per_step[1] + 1)
    parted = compare_request(entry.id, server_steps(answer.drafted_per_step, accepted), answer.token_ids, cycles)
    assert parted.first_difference.step == 1 and not parted.equal and parted.tokens_equal
    assert parted.first_difference.replica_cycle == [c["cycle"] for c in cycles if c["draft_token_ids"]][1]


LIVE_SAMPLING = (0.8, 0.95, 7)  # temperature, top_p, seed
LIVE_SAMPLED_TOKENS = 32


def conditional_counts(steps: list[tuple[int, int]], k: int) -> list[tuple[int, int]]:
    """Per position i, (steps that drafted i and accepted i, steps that drafted i and accepted i - 1),
    counted here again from the raw (drafted, accepted) pairs, drafting steps only."""
    steps = [(d, a) for d, a in steps if d]
    return [(sum(d >= i and a >= i for d, a in steps), sum(d >= i and a >= i - 1 for d, a in steps))
            for i in range(1, k + 1)]


def test_a_sampled_replica_counts_both_sides_per_position_from_their_raw_data(ngram_server, tmp_path, capsys):
    temperature, top_p, seed = LIVE_SAMPLING
    server_folder = write_server_workload(ngram_server, tmp_path / "server", max_tokens=LIVE_SAMPLED_TOKENS,
                                          sampling=LIVE_SAMPLING)
    out = tmp_path / "replica"
    capsys.readouterr()
    assert main(["replica", str(server_folder), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    n, k = len(PROMPTS), 3
    assert [line.split(":")[0] for line in printed[:n]] == [rid for rid, _, _ in PROMPTS]
    assert all(" drafting step" in line and "; replica " in line for line in printed[:n]), printed
    assert printed[n].startswith("CONDITIONAL ACCEPTANCE BY POSITION")
    assert [line.split(":")[0] for line in printed[n + 1:n + 1 + k]] == [f"  position {i}" for i in range(1, k + 1)]
    assert printed[n + 1 + k].startswith("  acceptance rate: server ")
    assert printed[n + 2 + k].startswith("  mean acceptance length: server ")
    assert printed[n + 3 + k].startswith(f"{n} sampled requests compared in aggregate (temperature 0.8, top_p 0.95)")
    # The server's raw data: answers.jsonl as the client wrote it, read here without the lab's readers.
    answers = {}
    for line in (server_folder / "answers.jsonl").read_text().splitlines():
        record = json.loads(line)
        sd = record["answer"]["metrics"]["speculative_decoding"]
        answers[record["id"]] = (record["request"], list(zip(sd["per_step_drafted"] or [], sd["per_step_accepted"] or [])))
    replica = open_folder(out)
    settings = replica.manifest["settings"]
    assert (settings["temperature"], settings["top_p"], settings["seed"], settings["k"]) == (temperature, top_p, seed, k)
    assert replica.manifest["pair"]["drafter"]["ngram_match"] == "earliest"
    theirs, ours = [], []
    body = json.loads((out / REPLICA_FILE).read_text())
    for i, (entry, row) in enumerate(zip(replica.entries, body["requests"], strict=True)):
        request, steps = answers[entry.id]
        assert request["seed"] == seed * 100_000 + i  # the number vLLM was sent; the replica's request i runs with it
        trace = replica.trace(entry)
        assert trace.header["settings"]["seed"] == seed * 100_000 + i
        mine = [(len(c["draft_token_ids"]), c["num_accepted"]) for c in trace.cycles if c["draft_token_ids"]]
        assert row == {"id": entry.id, "server_steps": len(steps), "server_draft_tokens": sum(d for d, _ in steps),
                       "server_accepted_tokens": sum(a for _, a in steps), "replica_drafting_cycles": len(mine),
                       "replica_draft_tokens": sum(d for d, _ in mine), "replica_accepted_tokens": sum(a for _, a in mine)}
        theirs += steps
        ours += mine
    assert body["mode"] == "sampled" and body["sampling"] == {"temperature": temperature, "top_p": top_p, "seed": seed}
    assert [(p["server"]["accepted"], p["server"]["reached"]) for p in body["positions"]] == conditional_counts(theirs, k)
    assert [(p["replica"]["accepted"], p["replica"]["reached"]) for p in body["positions"]] == conditional_counts(ours, k)
    for p in body["positions"]:
        for side in ("server", "replica"):
            cell = p[side]
            if cell["reached"]:
                assert cell["interval"][0] <= cell["rate"] == cell["accepted"] / cell["reached"] <= cell["interval"][1]
    assert body["overall"]["server"]["drafts"] == len(theirs) and body["overall"]["replica"]["drafts"] == len(ours)
    assert theirs and ours  # both sides drafted: the prompts repeat themselves
    read = loads_comparison((out / REPLICA_FILE).read_bytes(), "replica", k, replica.entries, settings)
    assert read.positions == body["positions"]


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
    assert plan.drafter.after_first_token  # and proposes only once the prefill has sampled the first token
    assert replica_plan(NGRAM, 0.7) == plan  # sampled requests draft the same way; run.py samples as the server did


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


# ---------------------------------------------------------------- sampled: acceptance per position, in aggregate

Z = 1.959963984540054


def test_the_wilson_interval_has_its_known_values():
    # 0/n: [0, z^2 / (n + z^2)]; n/n: [n / (n + z^2), 1]; both from the closed form at the edges.
    assert wilson(0, 10) == [0.0, pytest.approx(Z * Z / (10 + Z * Z))]
    assert wilson(0, 10)[1] == pytest.approx(0.27753, abs=1e-5)
    assert wilson(10, 10) == [pytest.approx(10 / (10 + Z * Z)), 1.0]
    assert wilson(5, 10) == [pytest.approx(0.236593, abs=1e-6), pytest.approx(0.763407, abs=1e-6)]
    assert wilson(1, 1) == [pytest.approx(1 / (1 + Z * Z)), 1.0]
    assert wilson(0, 0) is None  # no trial, no interval
    with pytest.raises(ValueError):
        wilson(3, 2)


@pytest.mark.parametrize("x, n", [(1, 10), (81, 263), (7, 9), (500, 1000), (2, 3000)])
def test_the_wilson_interval_is_where_the_score_test_stops_rejecting(x, n):
    # Its ends are the proportions p whose score |x/n - p| / sqrt(p (1 - p) / n) equals z exactly.
    low, high = wilson(x, n)
    assert 0 < low < x / n < high < 1
    for p in (low, high):
        assert abs(x / n - p) / math.sqrt(p * (1 - p) / n) == pytest.approx(Z, rel=1e-9)


def test_the_two_proportion_test_has_its_known_values():
    z, p = two_proportions(30, 100, 50, 100)  # pooled 0.4: se = sqrt(0.4 * 0.6 * (1/100 + 1/100))
    assert z == pytest.approx(-0.2 / math.sqrt(0.24 * 0.02)) and p == pytest.approx(0.0038924, abs=1e-6)
    assert two_proportions(5, 10, 5, 10) == (0.0, 1.0)
    assert two_proportions(0, 5, 0, 7) == (0.0, 1.0) and two_proportions(4, 4, 9, 9) == (0.0, 1.0)
    assert two_proportions(0, 0, 1, 3) is None and two_proportions(1, 3, 0, 0) is None


SERVER_STEPS = [Step(3, 3), Step(3, 1), Step(2, 0), Step(0, 0)]  # the last drafted nothing: no draft
REPLICA_STEPS = [Step(3, 2, 0), Step(3, 3, 2), Step(2, 0, 1), Step(1, 1, 4)]


def test_positions_count_the_projects_conditional_acceptance_of_drafting_steps():
    rows = position_rows(SERVER_STEPS, REPLICA_STEPS, 3)
    # Position i: steps that drafted i and accepted i - 1 (reached), and of those the ones that accepted i.
    assert [(r["server"]["accepted"], r["server"]["reached"]) for r in rows] == [(2, 3), (1, 2), (1, 1)]
    assert [(r["replica"]["accepted"], r["replica"]["reached"]) for r in rows] == [(3, 4), (2, 2), (1, 2)]
    assert rows[0]["server"]["rate"] == 2 / 3 and rows[0]["server"]["interval"] == wilson(2, 3)
    first = rows[0]
    assert (first["z"], first["p_value"]) == two_proportions(2, 3, 3, 4)
    assert first["differ"] is (first["p_value"] < 0.05) and first["intervals_overlap"] is True
    assert [r["position"] for r in rows] == [1, 2, 3]


def test_a_position_one_side_never_reached_has_no_rate_interval_or_test():
    (_, second) = position_rows([Step(1, 1), Step(1, 0)], [Step(2, 2, 0)], 2)
    assert second["server"] == {"accepted": 0, "reached": 0, "rate": None, "interval": None}
    assert second["replica"]["reached"] == 1
    assert (second["intervals_overlap"], second["z"], second["p_value"], second["differ"]) == (None,) * 4


def test_each_requests_counts_and_the_overall_figures():
    r = sampled_request("a", SERVER_STEPS, REPLICA_STEPS)
    assert r == SampledRequest("a", 3, 8, 4, 4, 9, 6)
    totals = overall([r, SampledRequest("b", 1, 3, 0, 0, 0, 0)])
    assert {k: totals["server"][k] for k in ("requests", "drafts", "draft_tokens", "accepted_tokens")} == \
        {"requests": 2, "drafts": 4, "draft_tokens": 11, "accepted_tokens": 4}
    assert totals["server"]["acceptance_rate"] == 4 / 11 and totals["server"]["mean_acceptance_length"] == 2.0
    assert totals["replica"]["mean_acceptance_length"] == 1 + 6 / 4
    low, high = totals["server"]["acceptance_rate_interval"]
    assert 0 <= low <= high <= 8 / 11  # request-level bootstrap: between the requests' own rates (0 and 4/8)


SAMPLING = {"temperature": 0.8, "top_p": 0.95, "seed": 7}
SAMPLED_SERVER = {"r0": SERVER_STEPS[:3], "r1": [Step(3, 0), Step(1, 1)]}
SAMPLED_REPLICA = {"r0": REPLICA_STEPS[:2], "r1": REPLICA_STEPS[2:]}


def sampled_of(server: dict[str, list[Step]], replica: dict[str, list[Step]], k: int = 3):
    requests = [sampled_request(rid, server[rid], replica[rid]) for rid in server]
    return compare_sampled(SAMPLING, requests, [s for v in server.values() for s in v],
                           [s for v in replica.values() for s in v], k)


def sampled_body() -> dict:
    """A valid sampled replica.json, as write_sampled writes it."""
    with tempfile.TemporaryDirectory() as tmp:
        write_sampled(Path(tmp), {"server_workload": "s", "server": {}, "speculative_config": NGRAM},
                      sampled_of(SAMPLED_SERVER, SAMPLED_REPLICA))
        return json.loads((Path(tmp) / REPLICA_FILE).read_text())


def test_a_valid_sampled_comparison_reads_back_as_written():
    body = sampled_body()
    assert body["mode"] == "sampled" and body["sampling"] == SAMPLING
    read = loads_comparison(json.dumps(body).encode(), "rep", 3, ENTRIES, {"temperature": 0.8, "top_p": 0.95,
                                                                              "seed": 7, "k": 3})
    assert isinstance(read, SampledComparison)
    assert read.requests[1] == SampledRequest("r1", 2, 4, 1, 2, 3, 1) and read.positions == body["positions"]
    assert read.overall == body["overall"]
    # A greedy file says so, and one written before there was a mode reads as greedy.
    assert isinstance(loads_comparison(json.dumps(valid_body() | {"mode": "greedy"}).encode(), "rep", 3, ENTRIES), list)


def sampled_hostile(change) -> bytes:
    body = sampled_body()
    change(body)
    return json.dumps(body).encode()


def recount(body: dict, i: int, side: str, accepted: int, reached: int) -> None:
    """Change a position's counts and everything computed from them, so that only the cross-checks can tell."""
    row = body["positions"][i]
    counts = {s: (row[s]["accepted"], row[s]["reached"]) for s in ("server", "replica")} | {side: (accepted, reached)}
    body["positions"][i] = json.loads(json.dumps(position_row(i + 1, counts["server"], counts["replica"])))


SAMPLED_HOSTILE = {
    "an unknown mode": sampled_hostile(lambda b: b.update(mode="beam")),
    "a greedy file with positions": hostile(lambda b: b.update(mode="greedy", positions=[])),
    "a file without mode holding a sampled field": hostile(lambda b: b.update(overall={})),
    "sampled without sampling": sampled_hostile(lambda b: b.pop("sampling")),
    "temperature 0": sampled_hostile(lambda b: b["sampling"].update(temperature=0)),
    "a temperature as text": sampled_hostile(lambda b: b["sampling"].update(temperature="0.8")),
    "top_p above 1": sampled_hostile(lambda b: b["sampling"].update(top_p=1.5)),
    "a negative seed": sampled_hostile(lambda b: b["sampling"].update(seed=-1)),
    "a request of the greedy shape": sampled_hostile(lambda b: b["requests"].__setitem__(0, valid_body()["requests"][0])),
    "an id that is a list": sampled_hostile(lambda b: b["requests"][0].update(id=["r0"])),
    "an unknown request": sampled_hostile(lambda b: b["requests"][0].update(id="<img src=x>")),
    "a duplicate id": sampled_hostile(lambda b: b["requests"][1].update(id="r0")),
    "more drafted than K per step": sampled_hostile(lambda b: b["requests"][0].update(server_draft_tokens=10)),
    "fewer drafted than steps": sampled_hostile(lambda b: b["requests"][0].update(replica_draft_tokens=1)),
    "more accepted than drafted": sampled_hostile(lambda b: b["requests"][1].update(replica_accepted_tokens=4)),
    "replica cycles beyond the trace": sampled_hostile(lambda b: b["requests"][0].update(replica_drafting_cycles=11)),
    "a rate not its counts": sampled_hostile(lambda b: b["positions"][0]["server"].update(rate=0.9)),
    "an interval not its counts": sampled_hostile(lambda b: b["positions"][1]["replica"].update(interval=[0.0, 1.0])),
    "a p-value not its counts": sampled_hostile(lambda b: b["positions"][0].update(p_value=0.001)),
    "a verdict flipped": sampled_hostile(lambda b: b["positions"][0].update(differ=not b["positions"][0]["differ"])),
    "an overlap flipped": sampled_hostile(lambda b: b["positions"][0].update(intervals_overlap=False)),
    "a position renumbered": sampled_hostile(lambda b: b["positions"][0].update(position=2)),
    "an extra key in a position": sampled_hostile(lambda b: b["positions"][0].update(note="<b>")),
    "a boolean count": sampled_hostile(lambda b: b["positions"][2]["server"].update(accepted=True)),
    "a position as text": sampled_hostile(lambda b: b["positions"].__setitem__(0, "<b>")),
    "more accepted than reached": sampled_hostile(lambda b: b["positions"][2]["server"].update(accepted=2)),
    "positions short of K": sampled_hostile(lambda b: b.update(positions=b["positions"][:2])),
    "reached not the drafting steps": sampled_hostile(lambda b: recount(b, 0, "server", 2, 4)),
    "reached beyond the accepted before": sampled_hostile(lambda b: recount(b, 2, "replica", 0, 3)),
    "accepted not adding up": sampled_hostile(lambda b: recount(b, 2, "server", 0, 1)),
    "totals not the requests'": sampled_hostile(lambda b: b["overall"]["server"].update(accepted_tokens=99)),
    "an overall interval edited": sampled_hostile(lambda b: b["overall"]["replica"].update(
        mean_acceptance_length_interval=[1.0, 4.0])),
    "no overall": sampled_hostile(lambda b: b.pop("overall")),
}


@pytest.mark.parametrize("name", SAMPLED_HOSTILE)
def test_a_hostile_sampled_replica_file_is_refused_in_one_line(name):
    with pytest.raises(ReplicaFileError) as err:
        loads_comparison(SAMPLED_HOSTILE[name], "rep", 3, ENTRIES)
    assert "\n" not in str(err.value) and str(err.value).startswith("rep: ")


@pytest.mark.parametrize("settings, field", [
    ({"temperature": 0.0, "top_p": 0.95, "seed": 7}, "mode"),  # sampled beside a greedy workload
    ({"temperature": 0.7, "top_p": 0.95, "seed": 7}, "sampling.temperature"),
    ({"temperature": 0.8, "top_p": 1.0, "seed": 7}, "sampling.top_p"),
    ({"temperature": 0.8, "top_p": 0.95, "seed": 8}, "sampling.seed"),
])
def test_a_sampled_file_must_say_how_the_workload_beside_it_ran(settings, field):
    with pytest.raises(ReplicaFileError, match=re.escape(repr(field))):
        loads_comparison(json.dumps(sampled_body()).encode(), "rep", 3, ENTRIES, settings)
    with pytest.raises(ReplicaFileError, match="'mode'"):  # and a greedy file beside a sampled workload
        loads_comparison(json.dumps(valid_body()).encode(), "rep", 3, ENTRIES, SAMPLING)


def test_the_sampled_report_has_a_line_per_position_and_the_overall_figures():
    lines = sampled_lines(sampled_of(SAMPLED_SERVER, SAMPLED_REPLICA))
    assert lines[0].startswith("CONDITIONAL ACCEPTANCE BY POSITION")
    # Pooled over both requests: position 1 reached by all 5 server steps, accepted by 3; the replica 3 of 4.
    assert lines[1] == ("  position 1: server 0.600 [0.231, 0.882] (3/5), replica 0.750 [0.301, 0.954] (3/4); "
                        "intervals overlap; two-proportion p = 0.635: no difference shown")
    assert [line.split(":")[0].strip() for line in lines[1:4]] == ["position 1", "position 2", "position 3"]
    assert lines[4].startswith("  acceptance rate: server 0.417 [") and "mean acceptance length: server 2.00" in lines[5]
    assert lines[6] == ("2 sampled requests compared in aggregate (temperature 0.8, top_p 0.95): 5 server drafting "
                        "steps, 4 replica drafting cycles; no position differs at the 5% level")
    assert sampled_request_line(sampled_request("r1", SAMPLED_SERVER["r1"], SAMPLED_REPLICA["r1"])) == \
        "r1: server 2 drafting steps, 1 of 4 drafted tokens accepted; replica 2 drafting cycles, 1 of 3 accepted"


SAMPLED_IDS = [{"id": "r*1 <b>", "category": "c", "prompt": "the cat sat on a mat"},
               {"id": "r2", "category": "c", "prompt": "a dog ran"}]


@pytest.fixture
def sampled_replica_runs(tmp_path, example_traces) -> Path:
    """A live sampled workload folder (tiny models, no server) with a sampled replica.json beside its
    manifest: the replica's steps from its traces, the server's hand-made."""
    from engine.config import SpecSettings
    from engine.workload.prompts import parse_prompts
    from engine.workload.run import run_workload
    from tests.tiny import tiny_pair

    folder = tmp_path / "runs" / "workloads" / "sampled-replica"
    requests = parse_prompts("\n".join(json.dumps(e) for e in SAMPLED_IDS).encode(), "p.jsonl")
    s = SpecSettings(k=3, max_new_tokens=10, **SAMPLING)
    workload = run_workload(tiny_pair(3), requests, s, folder)
    replica = {e.id: drafting_cycles(workload.trace(e).cycles) for e in workload.entries}
    server = {e.id: [Step(3, 1), Step(2, 2), Step(3, 0)] for e in workload.entries}
    write_sampled(folder, {"server_workload": "s", "server": {}, "speculative_config": NGRAM}, sampled_of(server, replica))
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "default.jsonl").write_bytes(Path(example_traces["sampled"]).read_bytes())
    return tmp_path


def test_the_workload_page_shows_a_sampled_replica_per_position_escaped(sampled_replica_runs, monkeypatch):
    at = open_workload_page(sampled_replica_runs, monkeypatch)
    assert [s.value for s in at.subheader] == ["Against its server"]
    shown = "\n".join(m.value for m in at.markdown)
    assert "<b>" not in shown and "&lt;b&gt;" in shown  # the request id, escaped
    plain = shown.replace("\\", "")
    for i in (1, 2, 3):
        assert f"| {i} | " in plain
    assert "two-proportion p = " in plain and "| mean acceptance length | " in plain
    links = stepper_links(at)
    assert [q["cycle"] for t, q in links if t in ("r*1 &lt;b&gt;", "r2")] == ["0", "0"]
    assert "Wilson" in " ".join(c.value for c in at.caption)


def test_a_hostile_sampled_file_on_the_page_is_one_escaped_line(sampled_replica_runs, monkeypatch):
    path = sampled_replica_runs / "runs" / "workloads" / "sampled-replica" / REPLICA_FILE
    body = json.loads(path.read_text())
    body["positions"][0]["server"]["rate"] = 0.123
    path.write_text(json.dumps(body))
    at = open_workload_page(sampled_replica_runs, monkeypatch)
    (error,) = at.error
    assert "positions[0]" in error.value.replace("\\", "") and "\n" not in error.value
    assert not at.subheader
