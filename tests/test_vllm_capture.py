"""The capture plugin (vllm_capture/): a live vLLM with SPECLAB_CAPTURE_DIR set writes one lab trace per
request. Offline: the recorder's traces from made-up steps load, and load_trace holds them to vLLM's cache
convention. Live (one more server, capture on, for this module): greedy answers equal the plugin-off server's,
every captured trace loads, the greedy ones equal the lab's replica cycle by cycle, and sampled ones replay
their accepts from their own u, p and q (load_trace does that)."""
import json
import urllib.request
from pathlib import Path

import pytest

from engine.cli import main
from engine.models.presets import smollm2_folder
from engine.replica.server_workload import read_server_workload
from engine.servers.launch import NGRAM_K3, start_vllm
from engine.trace import TraceError, load_trace, loads_trace
from engine.trace.schema import VLLM_CONVENTION, VLLM_CONVENTION_TEXT
from engine.workload.folder import open_folder
from tests.live_vllm import require_vllm_env
from tests.server_workload_sample import write_server_workload
from vllm_capture.speclab_vllm_capture import recorder as rec

# ---------------------------------------------------------------- offline: the recorder and the convention

EOS = 2


def recorder(folder: Path) -> rec.Recorder:
    """The recorder as the hooks make it, for a 16-token vocabulary, n-gram K=3."""
    return rec.Recorder(str(folder), {
        "target": {"name": "t", "architecture": "LlamaForCausalLM", "parameters": 1, "vocab_size": 16},
        "draft": {"name": "n-gram", "architecture": "none", "parameters": 0, "vocab_size": 16},
        "drafter": {"kind": "prompt-lookup", "min_ngram": 2, "max_ngram": 4, "ngram_match": "earliest"},
        "device": "cpu", "dtype": "float32", "versions": {}}, 3, (2, 4), lambda t: f"<{t}>")


def record(r: rec.Recorder, rid: str, temperature: float, seed: int | None = 1, finish: bool = True) -> None:
    """A request of prompt [5, 6, 7, 5, 6] (the n-gram [5, 6] recurs) through the recorder, as the hooks would
    feed it: the prefill, a step that drafts [7, 5, 6] and accepts 2, then one that stops at EOS (or, with
    finish False, the request is aborted before it)."""
    r.start(rid, [5, 6, 7, 5, 6], rec.Sampling(temperature, 0, 1.0, seed, 16, [EOS]))
    greedy = temperature == 0
    one = [(7, 1.0)] if greedy else [(7, 0.9), (3, 0.1)]
    r.step(rid, rec.Step(0, 5, [], [7], [], [one], None, None, 0.0, 0.1, 0.2))
    p = [1.0, 1.0, 0.0] if greedy else [0.8, 0.7, 0.1]
    rows = [[(5, 1.0)], [(6, 1.0)], [(9, 1.0)]] if greedy else [[(5, 0.8), (4, 0.2)], [(6, 0.7), (4, 0.3)],
                                                                  [(9, 0.9), (7, 0.1)]]
    residual = [(9, 1.0, 1.0, 0.0)] if greedy else [(9, 0.9, 1.0, 0.0)]
    r.step(rid, rec.Step(5, 4, [5, 6, 7], [5, 6, 9], p, rows + [[(1, 1.0)]], residual,
                         None if greedy else [0.5, 0.2, 0.3], 0.001, 0.1, 0.2))
    if not finish:
        r.end(rid, "aborted")
        return
    r.step(rid, rec.Step(8, 1, [], [EOS], [], [[(EOS, 1.0)]], None, None, 0.0, 0.1, 0.2))


def made_up(folder: Path, temperature: float) -> Path:
    """One request (record) in a capture folder of its own; its trace's path."""
    record(recorder(folder), "cmpl-1", temperature)
    assert json.loads((folder / rec.MANIFEST).read_text())["traces"][0]["complete"]
    return folder / "cmpl-1.jsonl"


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_recorders_trace_loads_under_vllms_convention(tmp_path, temperature):
    trace = load_trace(made_up(tmp_path, temperature))
    assert trace.header["cache_convention"] == {"name": VLLM_CONVENTION, "text": VLLM_CONVENTION_TEXT}
    assert [c["num_accepted"] for c in trace.cycles] == [0, 2, 0]
    assert trace.summary["generated_token_ids"] == [7, 5, 6, 9, EOS]
    assert [c["target_cache_len"]["after_rollback"] for c in trace.cycles] == [5, 8, 9]
    assert trace.cycles[1]["drafter_state"]["match_start"] == 0  # [5, 6] first occurs at the start


def test_the_plugin_states_the_labs_convention():
    assert (rec.CONVENTION, rec.CONVENTION_TEXT) == (VLLM_CONVENTION, VLLM_CONVENTION_TEXT)


def altered(path: Path, line: int, change) -> str:
    lines = path.read_text().splitlines()
    record = json.loads(lines[line])
    change(record)
    lines[line] = json.dumps(record)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("line, change, words", [
    (2, lambda c: c["target_cache_len"].update(after_rollback=9), "rejected drafts off"),
    (1, lambda c: c["target_cache_len"].update(before=1, after_append=4), "prefill"),
    (2, lambda c: c["u"].__setitem__(1, 0.75), "u[1]"),
    (0, lambda h: h["cache_convention"].update(text="whatever"), "cache_convention.text"),
    (0, lambda h: h["cache_convention"].update(name="vllm"), "cache_convention.name"),
    (0, lambda h: h.update(fast_path={"capture": "none"}), "n-gram proposer or draft model on a chain"),
])
def test_a_capture_that_breaks_vllms_convention_is_refused(tmp_path, line, change, words):
    text = altered(made_up(tmp_path, 0.8), line, change)
    with pytest.raises(TraceError, match=words.replace("[", r"\[").replace("]", r"\]")):
        loads_trace(text, "capture")


def model_recorder(folder: Path, method: str) -> rec.Recorder:
    """The recorder as the hooks make it for vLLM's draft model (draft_sample_method `method`), K=3."""
    return rec.Recorder(str(folder), {
        "target": {"name": "t", "architecture": "LlamaForCausalLM", "parameters": 1, "vocab_size": 16},
        "draft": {"name": "d", "architecture": "LlamaForCausalLM", "parameters": 1, "vocab_size": 16},
        "drafter": {"kind": "model", "vllm_draft_sample_method": method},
        "device": "cpu", "dtype": "float32", "versions": {}}, 3, None, lambda t: f"<{t}>")


def record_sampling_draft(folder: Path) -> Path:
    """A sampled request whose draft sampled [5, 6, 7] with q 0.9, 0.5, 0.6 where the target gives 0.8, 0.7, 0.1:
    the ratios are 0.889, 1.4 (so 1) and 0.167, and draws 0.5, 0.2, 0.3 accept two and reject the third; the
    residual max(0, p - q) there keeps only token 9 (0.9 - 0.4)."""
    r = model_recorder(folder, "probabilistic")
    r.start("cmpl-q", [5, 6, 7, 5, 6], rec.Sampling(0.8, 0, 0.95, 3, 16, [EOS]))
    r.step("cmpl-q", rec.Step(0, 5, [], [7], [], [[(7, 0.9), (3, 0.1)]], None, None, 0.0, 0.1, 0.2))
    q = rec.DraftRows([0.9, 0.5, 0.6], [[(5, 0.9), (4, 0.1)], [(6, 0.5), (3, 0.5)], [(7, 0.6), (9, 0.4)]],
                      [0.9, 0.5, 0.5])
    r.step("cmpl-q", rec.Step(5, 4, [5, 6, 7], [5, 6, 9], [0.8, 0.7, 0.1],
                              [[(5, 0.8), (4, 0.2)], [(6, 0.7), (4, 0.3)], [(9, 0.9), (7, 0.1)], [(1, 1.0)]],
                              [(9, 0.9, 1.0, 0.4)], [0.5, 0.2, 0.3], 0.001, 0.1, 0.2, draft=q))
    r.step("cmpl-q", rec.Step(8, 4, [1, 3, 4], [EOS], [0.1, 0.0, 0.0], [[(EOS, 0.9), (1, 0.1)]] + [[(EOS, 1.0)]] * 3,
                              [(EOS, 0.9, 1.0, 0.0)], [0.9, 0.5, 0.5], 0.001, 0.1, 0.2,
                              draft=rec.DraftRows([0.5, 1.0, 1.0], [[(1, 0.5)], [(3, 1.0)], [(4, 1.0)]],
                                                  [0.1, 0.0, 0.0])))
    return folder / "cmpl-q.jsonl"


def test_a_sampling_draft_models_capture_replays_from_its_own_q(tmp_path):
    trace = load_trace(record_sampling_draft(tmp_path))
    drafted = trace.cycles[1]
    assert drafted["p_draft"] == [0.9, 0.5, 0.6]
    assert drafted["accept_prob"] == pytest.approx([0.8 / 0.9, 1.0, 0.1 / 0.6])
    assert drafted["residual_top"][0] | {"text": ""} == {"token_id": 9, "text": "", "p_target": 0.9, "p_draft": 0.4,
                                                          "residual": 1.0}
    assert "drafter_state" not in drafted and drafted["draft_cache_len"] is None
    # top_p 0.95 with a draft that warps by temperature alone: the lab's "temperature only" draft
    assert trace.header["drafter"]["draft_filters"] == "temperature only"


@pytest.mark.parametrize("line, change, words", [
    (2, lambda c: c["u"].__setitem__(2, 0.1), r"u\[2\]"),  # 0.1 < 0.167 would have accepted the third draft
    (3, lambda c: c.update(draft_token_ids=[], draft_token_texts=[], p_draft=[], p_target=[], accept_prob=[], u=[],
                           beta=[], draft_top=[], target_top=c["target_top"][:1], rejected_position=None,
                           resampled_token_id=None, bonus_token_id=EOS, residual_top=None, verify_positions=1,
                           target_cache_len={"before": 8, "after_append": 9, "after_rollback": 9}),
     "drafts in every step after the prefill"),
    (0, lambda h: h["drafter"].update(vllm_draft_sample_method="greedy"), r"p_draft\[0\]"),  # q must be one-hot
    (0, lambda h: h["drafter"].pop("vllm_draft_sample_method"), "vllm_draft_sample_method"),
])
def test_a_draft_models_capture_that_breaks_its_rules_is_refused(tmp_path, line, change, words):
    with pytest.raises(TraceError, match=words):
        loads_trace(altered(record_sampling_draft(tmp_path), line, change), "capture")


def test_a_greedy_capture_draws_nothing(tmp_path):
    text = altered(made_up(tmp_path, 0.0), 2, lambda c: c.update(u=[0.1, 0.1, 0.1]))
    with pytest.raises(TraceError, match="draws no uniform"):
        loads_trace(text, "capture")


# ---------------------------------------------------------------- live: a server with the capture on

SAMPLED = [("fox-sampled", "rewrite", "Repeat this sentence three times: The quick brown fox jumps over the lazy dog."),
           ("days-sampled", "lists", "List the days of the week, then list them again in the same order.")]


@pytest.fixture(scope="module")
def capture_server(tmp_path_factory):
    """vLLM as ngram_server runs it, with SPECLAB_CAPTURE_DIR set: the plugin on."""
    require_vllm_env()
    folder = tmp_path_factory.mktemp("capture")
    server = start_vllm(smollm2_folder(), NGRAM_K3, model_name="smollm2", log=folder / "server.log",
                        env={"SPECLAB_CAPTURE_DIR": str(folder / "traces")})
    yield server, folder / "traces"
    server.stop()


def captured(folder: Path) -> dict[tuple, object]:
    """Every trace the manifest lists, loaded (so checked), by its prompt ids."""
    manifest = json.loads((folder / rec.MANIFEST).read_text())
    traces = {}
    for entry in manifest["traces"]:
        assert entry["complete"], entry
        trace = load_trace(folder / entry["file"])
        traces[tuple(trace.header["prompt_token_ids"])] = trace
    return traces


def test_the_capture_changes_no_answer_and_matches_the_replica(capture_server, ngram_server, tmp_path, capsys):
    server, traces_folder = capture_server
    on = read_server_workload(write_server_workload(server, tmp_path / "on"))
    off = read_server_workload(write_server_workload(ngram_server, tmp_path / "off"))
    for a, b in zip(on.answers, off.answers, strict=True):
        assert (a.prompt_ids, a.token_ids) == (b.prompt_ids, b.token_ids), a.request
        assert (a.drafted_per_step, a.accepted_per_step) == (b.drafted_per_step, b.accepted_per_step), a.request
    traces = captured(traces_folder)
    assert main(["replica", str(tmp_path / "on"), "--out", str(tmp_path / "replica")]) == 0
    replica = open_folder(tmp_path / "replica")
    drafting = 0
    for answer, entry in zip(on.answers, replica.entries, strict=True):
        trace = traces[tuple(answer.prompt_ids)]
        assert trace.header["settings"]["temperature"] == 0
        assert trace.summary["generated_token_ids"] == answer.token_ids
        steps = [(len(c["draft_token_ids"]), c["num_accepted"]) for c in trace.cycles if c["draft_token_ids"]]
        assert steps == list(zip(answer.drafted_per_step, answer.accepted_per_step))  # vLLM's own per-step counts
        mine = [(c["draft_token_ids"], c["num_accepted"], c["committed_token_ids"]) for c in trace.cycles]
        lab = [(c["draft_token_ids"], c["num_accepted"], c["committed_token_ids"])
               for c in replica.trace(entry).cycles]
        assert mine == lab, answer.request
        drafting += bool(steps)
    assert drafting >= 3
    capsys.readouterr()
    first = next(iter(traces.values()))
    path = traces_folder / next(e["file"] for e in json.loads((traces_folder / rec.MANIFEST).read_text())["traces"]
                                if e["request_id"] == first.header["vllm_request"]["request_id"])
    assert main(["stats", str(path)]) == 0 and "accept" in capsys.readouterr().out.lower()


def test_sampled_requests_replay_from_their_own_draws(capture_server):
    server, traces_folder = capture_server
    prompts = {}
    for rid, _, text in SAMPLED:
        body = {"model": "smollm2", "messages": [{"role": "user", "content": text}], "max_tokens": 32,
                "temperature": 0.8, "top_p": 0.95, "seed": 7}
        request = urllib.request.Request(f"{server.url}/v1/chat/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as answer:
            prompts[rid] = json.load(answer)
    manifest = json.loads((traces_folder / rec.MANIFEST).read_text())["traces"]
    sampled = [e for e in manifest if e["temperature"] > 0]
    assert len(sampled) >= len(SAMPLED)
    tested = []
    for entry in sampled:
        trace = loads_trace((traces_folder / entry["file"]).read_text(), entry["file"], allow_incomplete=True)
        # vLLM 0.32's CPU build tests sampled drafts past the first against rows that are NaN (docs/servers.md):
        # such a step is no ratio test, so the capture ends the trace there and the manifest says why.
        assert trace.complete == entry["complete"] and (entry["complete"] or "not finite" in entry["ended"]), entry
        tested += [c for c in trace.cycles if c["draft_token_ids"]]
    assert all(len(c["u"]) == min(c["num_accepted"] + 1, len(c["draft_token_ids"])) for c in tested)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_stepper_opens_a_capture_at_every_stage(tmp_path, monkeypatch, temperature):
    from streamlit.testing.v1 import AppTest
    monkeypatch.setenv("SPECLAB_TRACE", str(made_up(tmp_path, temperature)))
    for cycle in (0, 1):  # vLLM's prefill, then a step that drafted and rejected
        for stage in range(1, 6):
            at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app" / "main.py"), default_timeout=60)
            at.query_params.update({"trace": "env", "cycle": str(cycle), "stage": str(stage)})
            at.run()
            assert not at.exception, (cycle, stage, [e.value for e in at.exception])
            assert at.subheader[0].value.startswith(f"Cycle {cycle} · stage {stage}")


def test_one_process_writes_each_engines_traces():
    """Tensor parallel: TP rank 0 of the last pipeline stage only."""
    writes = {(tp, last): rec.writes_traces(tp, last) for tp in (0, 1, 3) for last in (True, False)}
    assert writes == {(0, True): True, (0, False): False, (1, True): False, (1, False): False, (3, True): False,
                      (3, False): False}


def test_data_parallel_engines_share_one_folder_and_its_manifest(tmp_path):
    """Two engine processes (two recorders) ending requests in turn: the manifest lists all of them, once."""
    one, two = recorder(tmp_path), recorder(tmp_path)
    record(one, "cmpl-1", 0.0)
    record(two, "cmpl-2", 0.0)
    record(one, "cmpl-3", 0.0)
    listed = [e["file"] for e in json.loads((tmp_path / rec.MANIFEST).read_text())["traces"]]
    assert listed == ["cmpl-1.jsonl", "cmpl-2.jsonl", "cmpl-3.jsonl"]
    assert all(load_trace(tmp_path / f).complete for f in listed)


def test_the_stepper_tells_vllms_prefill_and_rollback_as_vllm_did_them(tmp_path):
    """The captions follow vLLM's cycle: the first is its prefill (no lookup failed), and a rejection takes
    drafts off num_computed_tokens rather than deleting cache entries."""
    from app.figures.explain import stage_caption
    trace = load_trace(made_up(tmp_path, 0.8))
    assert trace.is_vllm_capture
    prefill, drafted = trace.cycles[0], trace.cycles[1]
    words = [stage_caption(prefill, 0, stage, drafter=trace.drafter_kind, captured=True) for stage in range(1, 6)]
    assert "prefill" in words[0] and "found no earlier occurrence" not in words[0]
    assert "num_computed_tokens 0 → 5" in words[1]
    assert "there is no draft token to test" in words[2] and "all 0" not in words[2]
    assert "all 5 prompt positions stay computed" in words[4]
    rollback = stage_caption(drafted, 3, 5, drafter=trace.drafter_kind, captured=True)
    assert "takes the 1 rejected draft(s) off num_computed_tokens: 9 → 8" in rollback
    sampled = stage_caption(load_trace(record_sampling_draft(tmp_path / "q")).cycles[1], 3, 1, drafter="model",
                            captured=True)
    assert "sampled them from its distribution" in sampled
