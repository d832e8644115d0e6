"""The fast path compiled on the CPU (--capture compile: torch.compile, inductor's C++ with the
weights frozen in): the same algorithm as the eager fast path, only rounded differently.

Compiling costs seconds per model and width even for the tiny pair, so the compiled models are
built once per module and shared."""
import pytest
import torch
from torch._dynamo.utils import counters

from engine.cli import main
from engine.config import SpecSettings
from engine.cycle import fast as fp
from engine.cycle.plain import target_generate
from engine.trace import load_trace
from tests.test_fast_path import PROMPT, comparable, tokens
from tests.tiny import noisy_pair, save_tiny

K = 3
# Inductor fuses and blocks the float32 arithmetic its own way (another summation order in every
# matrix product, norm and softmax), so a probability moves by float32 rounding compounded over
# the forward: observed up to 7.5e-6 relative (3e-6 absolute, on an acceptance ratio p_t/p_d whose
# p_d is small) on a Xeon with AMX. 1e-4 relative is ~13x that, for CPUs whose kernels block
# differently, and still far below any gap the ratio test or the figures could show; an error in
# positions, masks or caches moves these probabilities by 1e-2 or more on this random model.
PROB_RELATIVE = 1e-4
PROB_FIELDS = ("p_draft", "p_target", "accept_prob")


@pytest.fixture(scope="module")
def pair():
    return noisy_pair(0, noise=0.3)  # rejections and bonus tokens both occur


@pytest.fixture(scope="module")
def compiled(pair):
    return fp.FastModels.empty(pair, K, 64, "compile")


def close_records(compiled_records: list[dict], eager_records: list[dict]) -> None:
    """Same cycles, tokens and cache lengths; probabilities within PROB_RELATIVE."""
    assert len(compiled_records) == len(eager_records)
    for got, want in zip(compiled_records, eager_records):
        for field in PROB_FIELDS:
            assert got[field] == pytest.approx(want[field], rel=PROB_RELATIVE), field
        drop = set(PROB_FIELDS) | {"beta", "residual_top", "target_top", "draft_top"}
        assert {k: v for k, v in comparable(got).items() if k not in drop} == \
               {k: v for k, v in comparable(want).items() if k not in drop}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_compiled_fast_path_follows_the_eager_fast_path(pair, compiled, temperature):
    s = SpecSettings(k=K, temperature=temperature, max_new_tokens=30, seed=0, cache_layout="static")
    eager = list(fp.fast_generate(pair, PROMPT, s, models=fp.FastModels.empty(pair, K, 64)))  # same capacity
    got = list(fp.fast_generate(pair, PROMPT, s, models=compiled))
    assert compiled.target_forward.capture == "compile"
    close_records(got, eager)
    accepted = [r["num_accepted"] for r in eager]
    assert temperature == 0 or (0 in accepted and K in accepted)  # rejections and full accepts were compared


def test_compiled_greedy_speculation_is_plain_greedy_decoding(pair, compiled):
    s = SpecSettings(k=K, temperature=0.0, max_new_tokens=30, seed=0)
    assert tokens(list(fp.fast_generate(pair, [4, 6, 9], s, models=compiled))) == \
           target_generate(pair.target, [4, 6, 9], s, set())


def test_a_second_compiled_set_of_the_same_shapes_runs_on_its_own_caches(pair, compiled):
    """Two compiled sets of forwards with the same shapes (a benchmark builds one per setting): the
    second must not run the first one's graphs, which freezing bound to the first one's caches."""
    s = SpecSettings(k=K, temperature=1.0, max_new_tokens=20, seed=1, cache_layout="static")
    first = list(fp.fast_generate(pair, PROMPT, s, models=compiled))
    second = list(fp.fast_generate(pair, PROMPT, s, models=fp.FastModels.empty(pair, K, 64, "compile")))
    close_records(second, first)
    close_records(list(fp.fast_generate(pair, PROMPT, s, models=compiled)), first)  # the first set still works


def test_plan_compiles_on_the_cpu_only_when_asked():
    assert fp.plan_fast_path(torch.device("cpu")).capture == "none"
    plan = fp.plan_fast_path(torch.device("cpu"), "compile")
    assert plan.capture == "compile" and "torch.compile" in plan.message


@pytest.mark.parametrize("flags, message", [
    (["--capture", "compile"], "add --fast"),
])
def test_cli_refuses_capture_it_cannot_honour(tmp_path, capsys, flags, message):
    code = main(["run", "--prompt", "x", "--preset", "chat", "--out", str(tmp_path / "t.jsonl"), *flags])
    assert code != 0 and message in capsys.readouterr().err
    assert not (tmp_path / "t.jsonl").exists()


def test_cli_compiled_run_records_its_capture(pair, tmp_path, capsys):
    folders = save_tiny(pair, tmp_path)
    out = tmp_path / "compiled.jsonl"
    args = ["run", "--prompt", "the cat sat", "--target", folders[0], "--draft", folders[1], "--k", str(K),
            "--max-new-tokens", "12", "--seed", "2", "--device", "cpu", "--fast"]
    assert main([*args, "--capture", "compile", "--out", str(out)]) == 0
    assert "compiled by torch.compile" in capsys.readouterr().err
    trace = load_trace(out)
    assert trace.header["fast_path"] == {"capture": "compile"}
    assert main(["stats", str(out)]) == 0
    assert "FORWARDS: the fast path, its fixed-shape forwards compiled with torch.compile" in capsys.readouterr().out
    eager_out = tmp_path / "eager.jsonl"
    assert main([*args, "--out", str(eager_out)]) == 0
    close_records(trace.cycles, load_trace(eager_out).cycles)


DRAFT_S = 1e-5


def test_a_compiled_advised_run_compiles_each_width_once_and_records_what_it_timed(pair, tmp_path, monkeypatch):
    """`run --fast --capture compile --k auto`: the calibration compiles the draft step and every target width
    from 1 to K+1, and the pilot and the advised run reuse them all; the trace names the compiled forwards as
    what its step times timed."""
    import engine.cycle.fast_forward as ff
    import engine.stats.fast_calibrate as fc
    from engine.mode import RunMode
    from engine.run import run_fast_advised
    from engine.stats.analysis import NO_OVERHEAD

    compiles = []
    real = ff.compile_forward
    monkeypatch.setattr(ff, "compile_forward", lambda model, cache, width: compiles.append((model.name, width))
                        or real(model, cache, width))
    import engine.stats.plan
    timed = fc.time_fast_forwards  # still called, so the calibration is what compiles; its times then replaced by
    # hand-built ones on which speculation pays at this pair's low alpha: a flat verify and a free draft step,
    # with no pilot overhead (the tiny models' real seconds would not be on their scale)
    monkeypatch.setattr(fc, "time_fast_forwards", lambda *a: {key: DRAFT_S if key == "draft" else 0.010
                                                              for key in timed(*a)})
    monkeypatch.setattr(engine.stats.plan, "overhead_of", lambda *a: NO_OVERHEAD)
    s = SpecSettings(k=K, temperature=1.0, max_new_tokens=10, seed=2)
    graphs = counters["stats"]["unique_graphs"]
    done = run_fast_advised(pair, "the cat sat", s, tmp_path / "advised.jsonl", RunMode(fast="compile"),
                            chat_template=False)
    assert sorted(compiles) == sorted([(pair.draft.name, 1)] + [(pair.target.name, w) for w in range(1, K + 2)])
    # and none of them compiled again for the pilot or the run (a guard that failed on their inputs would)
    assert counters["stats"]["unique_graphs"] - graphs == K + 2
    assert done.trace is not None and done.trace.k == done.plan.k >= 1  # a draft step nearly free: speculate
    cal = done.trace.header["calibration"]
    assert cal["capture"] == done.trace.header["fast_path"]["capture"] == "compile"
    assert cal["verify_positions"] == list(range(1, K + 2)) and cal["draft_step_s"] == DRAFT_S


def test_a_compiled_run_compiles_each_forward_once(pair):
    """The draft step and the verify compile once each: the first cycle's inputs are the kind of tensor every
    later cycle's are, so no guard fails after it (the draft's first token, made outside inference mode,
    once recompiled the draft at its next call: seconds for the chat draft on a 2-core CPU)."""
    graphs = counters["stats"]["unique_graphs"]
    s = SpecSettings(k=K, temperature=1.0, max_new_tokens=12, seed=2)
    list(fp.fast_generate(pair, PROMPT, s, models=fp.FastModels.empty(pair, K, 64, "compile")))
    assert counters["stats"]["unique_graphs"] - graphs == 2
