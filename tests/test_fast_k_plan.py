"""The K advisor on the fast path (`run --fast --k auto`): its calibration times the fast path's own
forwards, the pilot and the run reuse them without changing a token, and what it advises (plain
decoding included) runs on the fast path."""
import pytest

import engine.stats.fast_calibrate as fc
from engine.cli import main
from engine.config import SpecSettings
from engine.cycle import fast as fp
from engine.mode import RunMode
from engine.run import answer_text, encode_prompt, run_fast_advised
from engine.stats.analysis import NO_OVERHEAD
from engine.trace import load_trace
from engine.trace.check_basics import BrokenInvariant
from engine.trace.header_checks import check_calibration
from tests.test_fast_path import comparable, tokens
from tests.test_k_plan import CHEAP, COSTLY
from tests.tiny import noisy_pair, save_tiny

PROMPT = "the cat sat"
EAGER = RunMode(fast="none")


@pytest.fixture(scope="module")
def pair():
    return noisy_pair(0, noise=0.05)  # a draft close to the target: the pilot sees a high alpha


@pytest.fixture
def hand_built(monkeypatch):
    """Hand-built step times in place of the measured ones (the forwards are still built and run), and no
    pilot overhead: the tiny models' real seconds would not be on the hand-built scale."""
    import engine.stats.plan

    monkeypatch.setattr(engine.stats.plan, "overhead_of", lambda *a: NO_OVERHEAD)

    def use(cal: dict) -> None:
        times = {"step": cal["target_step_s"], "draft": cal["draft_step_s"], **dict(zip(cal["verify_positions"],
                                                                                          cal["verify_s"]))}
        monkeypatch.setattr(fc, "time_fast_forwards", lambda forwards, *a: {w: times[w] for w in
                                                                            [*forwards.target, "step", "draft"]})
    return use


def test_the_calibration_times_every_width_a_chain_up_to_k_needs_on_the_runs_own_forwards(pair):
    s = SpecSettings(k=3, temperature=1.0, max_new_tokens=10, seed=1)
    cal, forwards = fc.calibrate_fast(pair, [1, 2, 3], s, "none", repeats=2)
    assert cal["verify_positions"] == [1, 2, 3, 4] and sorted(forwards.target) == [1, 2, 3, 4]
    assert all(t > 0 for t in [cal["target_step_s"], cal["draft_step_s"], *cal["verify_s"]])
    assert cal["capture"] == "none" and cal["cache_len"] == 2 + 10 // 2  # the prompt less one, half the new tokens
    check_calibration(cal, "header", {"capture": "none"})  # what a fast trace's header accepts
    for fast in (None, {"capture": "compile"}):  # timed on other forwards than the run's: refused
        with pytest.raises(BrokenInvariant, match="calibration.capture"):
            check_calibration(cal, "header", fast)
    # the caches hold a run at any K up to 3, and the plain step reads the same target cache
    assert all(forwards.models_for(k).fits(SpecSettings(k=k, max_new_tokens=10), 3) for k in (1, 2, 3))
    assert forwards.plain_model().cache is forwards.target_cache


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_runs_on_the_calibrated_forwards_equal_runs_on_fresh_ones(pair, temperature):
    """The calibration leaves its timing passes' K/V in the caches; a run on them must not see any. Fresh
    caches of the same capacity (attention sums over every slot of a static cache, masked or not, so
    another capacity rounds differently in float32) give the same records, number for number."""
    s = SpecSettings(k=3, temperature=temperature, max_new_tokens=14, seed=5)
    _, forwards = fc.calibrate_fast(pair, [4, 5, 6, 7], s, "none", repeats=1)
    again = fc.calibrate_on(pair, forwards, [9, 8, 7, 6, 5, 4], s, repeats=1)  # another prompt, the same forwards
    assert again["cache_len"] == 5 + 14 // 2 and again["verify_positions"] == [1, 2, 3, 4]
    for k in (1, 3):
        at_k = SpecSettings(k=k, temperature=temperature, max_new_tokens=14, seed=5)
        fresh = list(fp.fast_generate(pair, [1, 2, 3], at_k, models=fp.FastModels.empty(pair, k, forwards.capacity)))
        reused = list(fp.fast_generate(pair, [1, 2, 3], at_k, models=forwards.models_for(k)))
        assert [comparable(r) for r in reused] == [comparable(r) for r in fresh]
    plain = fp.fast_plain_decode(pair.target, [1, 2, 3], s, set(), model=fp.FastPlainModel.empty(pair.target,
                                                                                                  forwards.capacity))
    assert fp.fast_plain_decode(pair.target, [1, 2, 3], s, set(), model=forwards.plain_model()) == plain


def test_the_fast_advisor_decodes_plainly_or_traces_at_its_k_on_the_fast_path(pair, tmp_path, hand_built):
    s = SpecSettings(k=4, temperature=1.0, max_new_tokens=12, seed=3)
    ids = encode_prompt(pair.target.tokenizer, PROMPT, True)
    hand_built(COSTLY)
    out = tmp_path / "plain.jsonl"
    done = run_fast_advised(pair, PROMPT, s, out, EAGER)
    assert done.plan.plain and done.trace is None and not out.exists()  # nothing written
    plain = fp.fast_plain_decode(pair.target, ids, s, pair.eos_ids)
    assert done.text == answer_text(pair.target.tokenizer, plain) and done.tokens == len(plain)
    hand_built(CHEAP)
    done = run_fast_advised(pair, PROMPT, s, tmp_path / "spec.jsonl", EAGER)
    trace = load_trace(tmp_path / "spec.jsonl")
    assert done.plan.k >= 1 and trace.k == done.plan.k and trace.header["fast_path"] == {"capture": "none"}
    assert trace.header["calibration"] == {**CHEAP, "verify_positions": [1, 2, 3, 4, 5],
                                           "verify_s": CHEAP["verify_s"][:5], "repeats": 7, "threads":
                                           trace.header["calibration"]["threads"], "cache_len": len(ids) - 1 + 6,
                                           "capture": "none"}
    # fresh caches of the trace's capacity: attention sums over every static slot, so another capacity rounds
    # otherwise in float32, and a sampled token on a near tie could then differ on some CPU
    fresh = list(fp.fast_generate(pair, ids, SpecSettings(k=trace.k, temperature=1.0, max_new_tokens=12, seed=3),
                                  models=fp.FastModels.empty(pair, trace.k, trace.header["cache_layout"]["capacity"])))
    assert tokens(trace.cycles) == tokens(fresh) and done.text == trace.summary["generated_text"]
    held = {st["capacity"] for c in trace.cycles for st in c["target_cache_layout_state"].values()}
    assert held == {trace.header["cache_layout"]["capacity"]}  # the header names the buffers the run wrote


def test_cli_fast_k_auto_runs_the_fast_path_and_says_what_it_timed(tmp_path, capsys, hand_built):
    target, draft = save_tiny(noisy_pair(0, noise=0.05), tmp_path)
    base = ["run", "--target", target, "--draft", draft, "--prompt", PROMPT, "--max-new-tokens", "8", "--k", "auto",
            "--fast"]
    hand_built(COSTLY)
    out = tmp_path / "auto.jsonl"
    assert main([*base, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "timing the fast path's forwards of 1 to 5 positions" in captured.err
    assert "Decode plainly (K=0)" in captured.err and "decoded plainly" in captured.out and not out.exists()
    hand_built(CHEAP)
    assert main([*base, "--temperature", "0", "--out", str(out)]) == 0
    assert "trace written to" in capsys.readouterr().out
    trace = load_trace(out)
    assert trace.k >= 1 and trace.header["fast_path"]["capture"] == trace.header["calibration"]["capture"] == "none"
    assert main([*base, "--tree", "static:2,1", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "use one of the two" in capsys.readouterr().err


def test_cli_fast_calibrate_times_the_fast_paths_own_forwards(tmp_path, capsys):
    target, draft = save_tiny(noisy_pair(0, noise=0.05), tmp_path)
    out = tmp_path / "calibrated.jsonl"
    assert main(["run", "--target", target, "--draft", draft, "--prompt", PROMPT, "--max-new-tokens", "8", "--k", "2",
                 "--fast", "--calibrate", "--out", str(out)]) == 0
    trace = load_trace(out)
    cal = trace.header["calibration"]
    assert cal["capture"] == trace.header["fast_path"]["capture"] == "none" and cal["verify_positions"] == [1, 2, 3]
    assert all(t > 0 for t in cal["verify_s"]) and trace.k == 2
    assert main(["stats", str(out)]) == 0
    said = capsys.readouterr().out
    assert "t_step" in said and "STEP TIMES: timed on the fast path's own forwards" in said
    assert "FORWARDS: the fast path, its fixed-shape forwards eager" in said


def test_a_fast_calibrated_workload_times_its_forwards_once_and_every_request_runs_on_them(tmp_path):
    """`run --prompts F --fast --calibrate`: one calibration of the fast path's forwards, on the first request,
    recorded in every trace; the forwards are built for the longest request and serve them all, each request's
    tokens as a fresh fast run of it gives them."""
    from engine.workload.run import run_workload
    from tests.test_workload_run import requests_of
    pair = noisy_pair(0, noise=0.05)
    s = SpecSettings(k=2, temperature=0.0, max_new_tokens=8, seed=4)
    workload = run_workload(pair, requests_of(), s, tmp_path / "w", RunMode(fast="none", calibrate=True),
                            chat_template=False)
    traces = [r.trace for r in workload.runs()]
    calibrations = [t.header["calibration"] for t in traces]
    assert len(traces) == 4 and all(c == calibrations[0] for c in calibrations) and calibrations[0]["capture"] == "none"
    capacities = {t.header["cache_layout"]["capacity"] for t in traces}
    assert len(capacities) == 1  # one buffer for every request, as each header says
    for t in traces:
        assert {st["capacity"] for c in t.cycles for st in c["target_cache_layout_state"].values()} == capacities
        fresh = list(fp.fast_generate(pair, t.header["prompt_token_ids"],
                                      SpecSettings(k=2, max_new_tokens=8, temperature=0.0),
                                      models=fp.FastModels.empty(pair, 2, t.header["cache_layout"]["capacity"])))
        assert t.summary["generated_token_ids"] == tokens(fresh)

