"""The command line at its edges: one-line errors with exit code 2 before any model loads,
a prompt that must fit the context, an earlier --out that survives a failed run, Ctrl-C."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import engine.run
from engine.cli import main
from engine.cli.run import ctrl_c_at_cycle_ends
from engine.trace.format import load_trace, partial_path
from tests.tiny import noisy_pair, save_tiny

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return save_tiny(noisy_pair(0), tmp_path_factory.mktemp("models"))


def run_cli(capsys, *args) -> tuple[int, str]:
    """Exit code and the message the command ended with (loading and progress lines come before it)."""
    code = main(["run", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert sum(line.startswith(("error:", "interrupted")) for line in err) <= 1
    return code, err[-1] if err else ""


@pytest.fixture
def no_model_loads(monkeypatch):
    monkeypatch.setattr(engine.run, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))


@pytest.mark.parametrize("make_args, message", [
    (lambda tmp: ["--prompt", "   \n\t", "--out", str(tmp / "a.jsonl")], "only whitespace"),
    (lambda tmp: ["--prompt", "", "--out", str(tmp / "a.jsonl")], "prompt is empty"),
    (lambda tmp: ["--prompt", "x" * 1_000_001, "--out", str(tmp / "a.jsonl")], "characters"),
    (lambda tmp: ["--prompt", "the cat", "--out", str(tmp)], "is a folder"),
    (lambda tmp: ["--prompt", "the cat", "--out", str(tmp / "file.txt" / "a.jsonl")], "cannot write"),
    (lambda tmp: ["--prompt", "the cat", "--device", "tpu9", "--out", str(tmp / "a.jsonl")], "not a device"),
    (lambda tmp: ["--prompt", "the cat", "--device", "cuda:7", "--out", str(tmp / "a.jsonl")], "no such CUDA"),
    (lambda tmp: ["--prompt", "the cat", "--device", "cpu", "--dtype", "float16", "--out", str(tmp / "a.jsonl")],
     "float32"),
])
def test_cheap_checks_fail_in_one_line_before_any_model_loads(tmp_path, capsys, no_model_loads, folders,
                                                              make_args, message):
    (tmp_path / "file.txt").write_text("x")
    code, err = run_cli(capsys, "--target", folders[0], "--draft", folders[1], *make_args(tmp_path))
    assert code == 2 and message in err and err.startswith("error: ")
    assert not (tmp_path / "a.jsonl").exists()


@pytest.mark.parametrize("args, message", [
    (["--drafter", "prompt-lookup", "--max-ngram", "0"], "--min-ngram (1) <= --max-ngram (0)"),
    (["--drafter", "prompt-lookup", "--min-ngram", "4", "--max-ngram", "2"], "--min-ngram (4) <= --max-ngram (2)"),
    (["--drafter", "prompt-lookup", "--max-ngram", "17"], "<= 16"),
    (["--drafter", "prompt-lookup", "--draft", "somewhere"], "drop --draft"),
    (["--drafter", "other-tokenizer", "--draft-steps", "-1", "--temperature", "0"], "--draft-steps"),
    (["--drafter", "other-tokenizer", "--draft-steps", "33", "--temperature", "0"], "--draft-steps"),
    (["--drafter", "other-tokenizer", "--temperature", "1"], "greedy"),
    (["--drafter", "other-tokenizer", "--temperature", "0", "--preset", "chat"], "ships no draft"),
    (["--drafter", "other-tokenizer", "--temperature", "0", "--target", "t"], "needs a draft model"),
    (["--cache", "paged", "--block-size", "0"], "block_size"),
    (["--cache", "paged", "--block-size", "1025"], "block_size"),
    (["--drafter", "prompt-lookup", "--cache", "static", "--k", "0"], "k must be"),
])
def test_drafter_and_cache_options_fail_in_one_line_before_any_model_loads(tmp_path, capsys, no_model_loads,
                                                                           args, message):
    code, err = run_cli(capsys, "--prompt", "the cat", "--out", str(tmp_path / "a.jsonl"), *args)
    assert code == 2 and message in err and err.startswith("error: "), err
    assert not (tmp_path / "a.jsonl").exists()


def test_a_prompt_longer_than_the_context_allows_is_refused_and_the_old_trace_survives(tmp_path, capsys, folders):
    out = tmp_path / "run.jsonl"
    out.write_text("an earlier trace")
    prompt = " ".join(["the cat sat on a mat"] * 85)  # 510 tokens; the tiny models' context is 512
    code, err = run_cli(capsys, "--target", folders[0], "--draft", folders[1], "--prompt", prompt,
                        "--max-new-tokens", "8", "--k", "2", "--out", str(out))
    assert code == 2 and err.startswith("error: ") and "leaves room for 502 prompt tokens" in err
    assert out.read_text() == "an earlier trace" and not partial_path(out).exists()


def failing_after(cycles: int, error: BaseException):
    real = engine.run.run_cycles

    def generate(*args, **kwargs):
        for i, rec in enumerate(real(*args, **kwargs)):
            if i == cycles:
                raise error
            yield rec
    return generate


@pytest.mark.parametrize("error, code, first_word", [(RuntimeError("device lost"), 2, "error:"),
                                                     (KeyboardInterrupt(), 130, "interrupted")])
def test_a_run_stopped_mid_way_keeps_its_cycles_in_the_partial_file_and_the_old_trace(
        tmp_path, capsys, folders, monkeypatch, error, code, first_word):
    out = tmp_path / "run.jsonl"
    out.write_text("an earlier trace")
    monkeypatch.setattr(engine.run, "run_cycles", failing_after(2, error))
    got, err = run_cli(capsys, "--target", folders[0], "--draft", folders[1], "--prompt", "the cat sat",
                       "--max-new-tokens", "30", "--out", str(out))
    assert got == code and err.startswith(first_word) and str(partial_path(out)) in err
    assert out.read_text() == "an earlier trace"
    partial = load_trace(partial_path(out), allow_incomplete=True)
    assert len(partial.cycles) == 2 and not partial.complete


def test_a_finished_run_replaces_the_old_trace_and_leaves_no_partial(tmp_path, capsys, folders):
    out = tmp_path / "run.jsonl"
    out.write_text("an earlier trace")
    code, _ = run_cli(capsys, "--target", folders[0], "--draft", folders[1], "--prompt", "the cat sat",
                      "--max-new-tokens", "6", "--out", str(out))
    assert code == 0 and load_trace(out).complete and not partial_path(out).exists()


def test_line_separators_in_token_texts_round_trip(tmp_path, capsys):
    """A reproduction: U+2028 in a byte-level prompt, written raw, read back by `stats`."""
    out = tmp_path / "u.jsonl"
    code = main(["run", "--preset", "tiny-shakespeare", "--prompt", "Romeo.\u2028\u2029\x85\n",
                 "--max-new-tokens", "8", "--device", "cpu", "--out", str(out)])
    assert code == 0
    assert "\u2028" in out.read_text(encoding="utf-8")  # written raw (ensure_ascii=False)
    assert main(["stats", str(out)]) == 0
    assert "ACCEPTANCE" in capsys.readouterr().out


def test_a_first_ctrl_c_waits_for_the_cycle_end_and_a_second_does_not():
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with ctrl_c_at_cycle_ends() as stop_if_asked:
            stop_if_asked()  # nothing asked yet
            os.kill(os.getpid(), signal.SIGINT)  # Python runs its handler before the next bytecode
            reached_the_cycle_end = True  # noted, not raised
            stop_if_asked()
    assert reached_the_cycle_end and signal.getsignal(signal.SIGINT) is before
    with pytest.raises(KeyboardInterrupt):
        with ctrl_c_at_cycle_ends():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)  # the second: at once
            pytest.fail("a second Ctrl-C should have interrupted")
    assert signal.getsignal(signal.SIGINT) is before


def test_sigint_ends_a_real_run_with_one_line(tmp_path, folders):
    """A real Ctrl-C (SIGINT) to a running `python -m engine run`: exit 130, one line, cycles kept."""
    out = tmp_path / "run.jsonl"
    models = save_tiny(noisy_pair(0), tmp_path / "models")
    # No EOS and a longer context, so the run is still going when the signal comes.
    edits = {"config.json": {"max_position_embeddings": 8192, "eos_token_id": None},
             "generation_config.json": {"eos_token_id": None}, "tokenizer_config.json": {"eos_token": None}}
    for folder in models:
        for name, changes in edits.items():
            path = Path(folder) / name
            path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine", "run", "--target", models[0], "--draft", models[1], "--prompt",
         "the cat sat", "--max-new-tokens", "4096", "--k", "1", "--out", str(out)],
        cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    partial = partial_path(out)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not partial.exists() or partial.read_text().count("\n") < 3):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    last = err.strip().splitlines()[-1]
    assert proc.returncode == 130 and last.startswith("interrupted") and str(partial) in last
    assert "Traceback" not in err and not out.exists()
    lines = partial.read_text().split("\n")
    assert lines[-1] == ""  # ends on a whole line
    assert [json.loads(line)["type"] for line in lines[:2]] == ["header", "cycle"]
