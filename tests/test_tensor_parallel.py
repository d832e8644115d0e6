"""The engine under torchrun with a tensor-parallel target: 2 gloo ranks on the CPU, tiny random models.

One torchrun launch (`-m tests.tp_worker`) runs every case on one process group; the traces rank 0
writes and the cache logs every rank writes are compared here with single-process runs of the
same settings. The same launch ends with the real command line and rank 1 killed mid-run. A
second launch, marked slow, runs the command line with a rank that hangs. Each launch starts two
Python processes that import torch, so this file spends most of its time starting processes.
"""
import html
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.cli import main as cli_main
from engine.config import SettingsError, SpecSettings
from engine.drafters.registry import DrafterOptions
from engine.mode import RunMode
from engine.models.loading import ModelLoadError
from engine.parallel.failure import GroupError, RankError, is_group_failure, short_reason, speaker, stop_on_sigterm
from engine.parallel.sharding import check_config_shardable, shardable_sizes
from engine.parallel.world import check_launch
from engine.run import load_with_drafter, pair_for_target, run_to_trace
from engine.trace.format import load_trace, partial_path
from engine.trace.schema import DRAFT_MODEL, EAGLE
from tests.tiny import save_tiny, tiny_pair
from tests.tp_worker import CASES, KILLED_AFTER, KILLED_RUN, PROMPT, drafter_options

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID")
LAUNCH_BOUND_S = 240  # two torch processes starting on a busy 2-core machine take 10-40 s; far past it means a hang
# Rank 0's logits come from two shards' partial sums added by an all-reduce, the single process's
# from one product (through the packed oneDNN twin): float32 rounding differs in the 6th-7th digit.
PROB_TOL = 1e-5
TINY_KV_HEADS = 2  # tests/tiny.py: 4 attention heads, 2 key/value heads


def torchrun(args: list[str]) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --standalone --nproc-per-node 2 ARGS` from the repository root.

    ARGS start with `-m tests.<worker>`: each rank runs `python -m tests.<worker>` in the root, which
    puts the root on sys.path (engine and tests import as they are)."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    env["OMP_NUM_THREADS"] = "1"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=LAUNCH_BOUND_S)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[str, str]:
    return save_tiny(tiny_pair(), tmp_path_factory.mktemp("tp-models"))


@pytest.fixture(scope="module")
def single_pair(models):
    """The same folders loaded by one process, as `python -m engine run` without --tp loads them."""
    target, draft = models
    return load_with_drafter(target, DrafterOptions(draft_model=draft))


@pytest.fixture(scope="module")
def broken_target(models, tmp_path_factory) -> Path:
    """The target's folder with its weights file cut short: the config reads, the weights do not."""
    import shutil
    folder = tmp_path_factory.mktemp("tp-broken") / "target"
    shutil.copytree(models[0], folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    return folder


@pytest.fixture(scope="module")
def tp_out(models, broken_target, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tp-out")
    done = torchrun(["-m", "tests.tp_worker", "--target", models[0], "--draft", models[1], "--out", str(out),
                     "--broken", str(broken_target)])
    assert (out / "killed.result.json").is_file(), done.stderr[-4000:]  # rank 0 finished every stage
    (out / "torchrun.stderr").write_text(done.stderr)
    assert done.returncode != 0 and "Signal 9 (SIGKILL) received" in done.stderr  # torchrun saw rank 1 die
    return out


@pytest.fixture(scope="module")
def references(models, single_pair, tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("tp-reference")
    out = {}
    for name, case in CASES.items():
        pair = single_pair if case.drafter == DRAFT_MODEL else pair_for_target(
            single_pair.target, drafter_options(case, models[1]))
        out[name] = run_to_trace(pair, PROMPT, case.settings, folder / f"{name}.jsonl", chat_template=False)
    return out


def rank_log(tp_out: Path, name: str, rank: int) -> list[dict]:
    """A rank's cache after each rollback of the run itself (calibration's caches come before it)."""
    entries = [json.loads(line) for line in (tp_out / f"{name}.rank{rank}.jsonl").read_text().splitlines()]
    run_cache = max(e["cache_id"] for e in entries)
    return [e for e in entries if e["cache_id"] == run_cache]


def committed_after_each_cycle(trace) -> list[list[int]]:
    seq, out = list(trace.header["prompt_token_ids"]), []
    for c in trace.cycles:
        seq += c["committed_token_ids"]
        out.append(list(seq))
    return out


# ---------------------------------------------------------------- the traces rank 0 writes

@pytest.mark.parametrize("name", [n for n in CASES if n != "sampled"])
def test_trace_equals_the_single_process_run(tp_out, references, name):
    """Greedy runs on every layout, and a sampled prompt-lookup run (one-hot proposals: its draws follow
    the same tokens)."""
    tp, ref = load_trace(tp_out / f"{name}.jsonl"), references[name]  # load_trace runs every trace check
    assert tp.summary["generated_token_ids"] == ref.summary["generated_token_ids"]
    assert len(tp.cycles) == len(ref.cycles) > 1
    assert any(c["draft_token_ids"] for c in tp.cycles) and tp.drafter_kind == ref.drafter_kind
    for a, b in zip(tp.cycles, ref.cycles):
        for field in ("draft_token_ids", "u", "num_accepted", "committed_token_ids", "target_cache_len", "draft_cache_len"):
            assert a[field] == b[field], (name, a["cycle"], field)
        assert a.get("target_cache_layout_state") == b.get("target_cache_layout_state"), (name, a["cycle"])
    assert tp.header["cache_layout"] == ref.header["cache_layout"]


def test_sampled_run_makes_the_same_draws_and_tokens(tp_out, references):
    tp, ref = load_trace(tp_out / "sampled.jsonl"), references["sampled"]
    assert tp.header["settings"]["temperature"] == 1.0 and "calibration" in tp.header
    assert len(tp.cycles) == len(ref.cycles)
    assert any(c["rejected_position"] is not None for c in tp.cycles)  # the ratio test really rejected
    for a, b in zip(tp.cycles, ref.cycles):
        assert a["u"] == b["u"], a["cycle"]  # the same generator, drawn the same number of times
        for field in ("draft_token_ids", "num_accepted", "resampled_token_id", "bonus_token_id", "committed_token_ids"):
            assert a[field] == b[field], (a["cycle"], field)
        for field in ("p_target", "accept_prob"):
            assert a[field] == pytest.approx(b[field], abs=PROB_TOL), (a["cycle"], field)


def test_header_records_the_rank_layout(tp_out):
    h = load_trace(tp_out / "greedy-dynamic.jsonl").header
    tp = h["tensor_parallel"]
    assert (tp["world_size"], tp["tp_size"], tp["backend"], tp["drafter_rank"]) == (2, 2, "gloo", 0)
    assert [(r["rank"], r["local_rank"], r["device"]) for r in tp["ranks"]] == [(0, 0, "cpu"), (1, 1, "cpu")]
    assert all(r["host"] for r in tp["ranks"]) and h["device"] == "cpu"


def test_each_rank_holds_a_shard_and_runs_it_without_the_packed_twin(tp_out):
    for rank in (0, 1):
        facts = json.loads((tp_out / f"shard.rank{rank}.json").read_text())
        assert facts["weight_type"] == "DTensor" and facts["global_shape"] == [32, 32]
        assert facts["local_shape"] == [16, 32]  # half the query projection's output rows
        assert facts["fast_linear"] is False and facts["runs_the_model_itself"] is True


# ---------------------------------------------------------------- every rank's cache

@pytest.mark.parametrize("name", list(CASES))
def test_every_rank_cache_follows_the_convention_after_every_cycle(tp_out, name):
    trace = load_trace(tp_out / f"{name}.jsonl")
    logs = {rank: rank_log(tp_out, name, rank) for rank in (0, 1)}
    committed = committed_after_each_cycle(trace)
    for rank, log in logs.items():
        assert len(log) == len(trace.cycles), rank  # one rollback per cycle
        for entry, c, seq in zip(log, trace.cycles, committed):
            where = (name, rank, c["cycle"])
            assert entry["broken"] is None, (where, entry["broken"])  # engine/kv/layouts.py check_invariants
            assert entry["length"] == c["target_cache_len"]["after_rollback"] == len(seq) - 1, where
            assert entry["tokens"] == seq[:-1], where  # K/V of every committed token but the last
            assert entry["kv_heads"] == TINY_KV_HEADS // 2, where  # its own shard of the K/V heads
            if "target_cache_layout_state" in c:
                assert entry["layout"] == c["target_cache_layout_state"]["after_rollback"], where
    assert logs[0] == [{**e, "rank": 0} for e in logs[1]]  # both ranks hold the same positions, rank by rank


# ---------------------------------------------------------------- failure: a rank killed, a rank that hangs

def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if re.match(r"^(rank \d+: )?error:", line)]


def assert_partial_keeps_finished_cycles(out: Path, single_pair, tmp_path, at_least: int) -> list[dict]:
    """OUT was never written; OUT.partial holds cycles, each the single-process run's."""
    assert not out.exists()
    partial = load_trace(partial_path(out), allow_incomplete=True)
    assert not partial.complete and len(partial.cycles) >= at_least
    ref = run_to_trace(single_pair, "the cat sat", SpecSettings(k=2, temperature=0.0, max_new_tokens=30),
                       tmp_path / "ref.jsonl", chat_template=False)  # tests/tp_worker.py KILLED_RUN's settings
    for a, b in zip(partial.cycles, ref.cycles):
        assert a["committed_token_ids"] == b["committed_token_ids"] and a["target_cache_len"] == b["target_cache_len"]
    return partial.cycles


def assert_no_traceback_of_ours(stderr: str) -> None:
    """torchrun prints its own report (with its launcher's frames); no rank may print a traceback."""
    assert "[rank0]:" not in stderr and "[rank1]:" not in stderr
    frames = re.findall(r'File "([^"]+)"', stderr)
    assert all("torch/distributed" in f or f.startswith("<frozen") for f in frames), frames


def test_a_killed_rank_ends_the_run_with_one_line_and_keeps_the_finished_cycles(tp_out, single_pair, tmp_path):
    result = json.loads((tp_out / "killed.result.json").read_text())  # rank 1 died after cycle 2's rollback
    assert result["exit_code"] == 2
    lines = error_lines(result["stderr"])
    assert len(lines) == 1, result["stderr"]
    assert lines[0].startswith("error: ") and str(partial_path(tp_out / "killed.jsonl")) in lines[0]
    assert error_lines((tp_out / "torchrun.stderr").read_text()) == []  # the dead rank said nothing
    assert_no_traceback_of_ours((tp_out / "torchrun.stderr").read_text())
    cycles = assert_partial_keeps_finished_cycles(tp_out / "killed.jsonl", single_pair, tmp_path, at_least=2)
    assert len(cycles) <= 3  # cycle 3 needs rank 1


def test_rank_0_failing_on_its_own_tells_the_others_to_stop(tp_out):
    assert "the prompt is empty" in (tp_out / "refused.rank0.txt").read_text()
    assert (tp_out / "refused.rank1.txt").read_text() == "follower exit code 2"  # stopped, not left waiting


def test_a_rank_that_cannot_load_stops_every_rank_and_rank_0_names_it(tp_out, broken_target):
    said = (tp_out / "broken-load.rank0.txt").read_text()
    assert said.startswith("rank 1 on ") and "could not load its shard of the target" in said
    assert str(broken_target) in said and "\n" not in said
    assert (tp_out / "broken-load.rank1.txt").read_text() == "another rank failed to load"  # printed by nobody


@pytest.mark.slow
def test_a_hung_rank_ends_the_run_after_the_timeout(models, single_pair, tmp_path):
    """`torchrun -m engine run --tp 2` with rank 1 asleep after cycle 2: rank 0 gives up after --tp-timeout,
    says so in one line, and torchrun's SIGTERM ends the sleeper."""
    out = tmp_path / "hung.jsonl"
    done = torchrun(["-m", "tests.tp_fault", "--fault", "hang", "--rank", "1", "--after", str(KILLED_AFTER), "--",
                     "run", *KILLED_RUN, "--tp-timeout", "10", "--target", models[0], "--draft", models[1],
                     "--out", str(out)])
    assert done.returncode != 0
    lines = error_lines(done.stderr)
    assert len(lines) == 1, done.stderr[-3000:]
    assert "did not answer within --tp-timeout 10 s" in lines[0] and str(partial_path(out)) in lines[0]
    assert_no_traceback_of_ours(done.stderr)
    assert len(assert_partial_keeps_finished_cycles(out, single_pair, tmp_path, at_least=3)) == 3


# ---------------------------------------------------------------- the app reads such traces

def stepper_captions(monkeypatch, trace_file: Path) -> list[str]:
    monkeypatch.setenv("SPECLAB_TRACE", str(trace_file))
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=60)
    at.query_params.update({"trace": "env", "cycle": "1", "stage": "5"})
    at.run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    return [html.unescape(re.sub(r"\\(.)", r"\1", c.value)) for c in at.caption]


def test_stepper_header_shows_the_rank_layout_with_host_names_escaped(tp_out, monkeypatch, tmp_path):
    lines = (tp_out / "greedy-paged.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    header["tensor_parallel"]["ranks"][1]["host"] = "<b>**node-2**</b>"  # a trace is untrusted text
    edited = tmp_path / "tp.jsonl"
    edited.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    host = header["tensor_parallel"]["ranks"][0]["host"]
    captions = stepper_captions(monkeypatch, edited)
    layout = next(c for c in captions if "tensor parallelism" in c)
    assert layout == (f"Target sharded over 2 ranks by tensor parallelism (gloo), drafter on rank 0 · "
                      f"{host}: rank 0 cpu; <b>**node-2**</b>: rank 1 cpu")


# ---------------------------------------------------------------- checks that need no second process

def test_tp_needs_torchrun_and_a_matching_process_count(monkeypatch):
    for var in TORCHRUN_VARS:
        monkeypatch.delenv(var, raising=False)
    check_launch(1)
    with pytest.raises(SettingsError, match="torchrun --nproc-per-node 2 -m engine run --tp 2"):
        check_launch(2)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(SettingsError, match="started 4 processes but --tp is 1: pass --tp 4"):
        check_launch(1)
    with pytest.raises(SettingsError, match="started 4 processes but --tp is 2"):
        check_launch(2)
    check_launch(4)


def test_cli_refuses_tp_without_torchrun_in_one_line(monkeypatch, capsys, tmp_path):
    for var in TORCHRUN_VARS:
        monkeypatch.delenv(var, raising=False)
    code = cli_main(["run", "--tp", "2", "--preset", "tiny-shakespeare", "--prompt", "hi",
                     "--out", str(tmp_path / "t.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: --tp 2 runs one process per rank")


def test_unsupported_combinations_are_refused_before_loading():
    with pytest.raises(SettingsError, match="EAGLE head drafts through the target's output layer"):
        RunMode(tp_size=2).check_drafter(EAGLE)
    with pytest.raises(SettingsError, match="drop --fast"):
        RunMode(fast="none", tp_size=2)
    RunMode(tp_size=2).check_drafter("model")


def test_heads_must_split_evenly_and_the_architecture_needs_a_plan():
    from transformers import GPT2Config, LlamaConfig
    smollm2 = LlamaConfig(num_attention_heads=9, num_key_value_heads=3, hidden_size=576)  # SmolLM2-135M's heads
    check_config_shardable(smollm2, 3)
    with pytest.raises(ModelLoadError, match="cannot split LlamaConfig's 9 attention heads and 3 key/value heads "
                                             "evenly over 2 ranks; --tp 3 would"):
        check_config_shardable(smollm2, 2)
    assert shardable_sizes(32, 8) == [2, 4, 8] and shardable_sizes(7, 7) == [7] and shardable_sizes(5, 1) == []
    with pytest.raises(ModelLoadError, match="no tensor-parallel plan"):
        check_config_shardable(GPT2Config(), 2)


def test_who_reports_a_failure(monkeypatch):
    gone = RuntimeError("[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                        "[127.0.0.1]:10395. This is typically caused by a remote worker crashing. GLHF!")
    assert is_group_failure(gone) and short_reason(gone) == "Connection closed by peer [127.0.0.1]:10395"
    assert not is_group_failure(RuntimeError("CUDA out of memory")) and is_group_failure(GroupError("x"))
    for var in TORCHRUN_VARS:
        monkeypatch.delenv(var, raising=False)
    assert speaker(gone) == ""  # a plain process reports everything
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert speaker(gone) is None and speaker(KeyboardInterrupt()) is None  # rank 0 speaks for the group
    assert speaker(ValueError("bad --k")) is None  # before joining: every rank parsed the same command line
    assert speaker(RankError("local rank 1 has no GPU")) == "rank 1: "
    monkeypatch.setenv("RANK", "0")
    assert speaker(gone) == ""


def test_sigterm_on_rank_0_becomes_one_error_unless_one_is_already_being_reported():
    previous = signal.getsignal(signal.SIGTERM)
    try:
        stop_on_sigterm()
        with pytest.raises(GroupError, match="torchrun stopped rank 0"):
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs as os.kill returns
        stop_on_sigterm()
        try:
            raise ValueError("the first error")
        except ValueError:
            os.kill(os.getpid(), signal.SIGTERM)  # ignored: the ValueError is the one to report
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)
