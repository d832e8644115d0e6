"""Acceptance, cost and speed analysis: formulas by hand, real tiny traces, calibration, CLI, K sweep."""
import json
import math
import statistics

import pytest

from engine.cli import main
from engine.config import SpecSettings
from engine.mode import RunMode
from engine.run import run_to_trace
from engine.stats.analysis import (
    NO_OVERHEAD,
    Calibration,
    CycleOverhead,
    advice_sentence,
    advise_k,
    advised_k,
    best_k,
    calibration_of,
    cycle_times,
    explain_speed,
    measured_alpha,
    overhead_of,
    predicted_per_position,
    refined_speedup,
    speed_report,
    tokens_per_cycle_counts,
    trace_stats,
    truncated_geometric_pmf,
)
from engine.stats.calibrate import calibrate, context_of_length, time_draft_in_cycle, time_widths
from engine.stats.sweep import k_sweep
from engine.trace import Trace, TraceError, load_trace
from engine.trace.metrics import expected_tokens_per_cycle, predicted_speedup
from tests.tiny import noisy_pair, save_tiny

LINEAR = Calibration(cache_len=10, target_step_s=0.010, draft_step_s=0.002,
                     verify_positions=[1, 2, 3, 4], verify_s=[0.010, 0.012, 0.014, 0.016])


@pytest.fixture(scope="module")
def pair():
    return noisy_pair(0, noise=0.05)


@pytest.fixture(scope="module")
def calibrated(pair, tmp_path_factory):
    path = tmp_path_factory.mktemp("analysis") / "calibrated.jsonl"
    run_to_trace(pair, "the cat sat on", SpecSettings(k=3, temperature=1.0, max_new_tokens=40, seed=5), path,
                 RunMode(calibrate=True))
    return path


def cycle(num_accepted: int, beta: list[float], draft_steps: list[float] = (), verify: float = 0.0,
          catch_up: float = 0.0, total: float = 0.0, committed: int | None = None) -> dict:
    """The fields the analysis reads, for hand-made cycles (one drafted token per beta)."""
    return {"num_accepted": num_accepted, "beta": beta, "draft_token_ids": [0] * len(beta),
            "draft_step_times_s": list(draft_steps),
            "draft_time_s": sum(draft_steps), "verify_time_s": verify, "catch_up_time_s": catch_up,
            "cycle_time_s": total, "committed_token_ids": [0] * (num_accepted + 1 if committed is None else committed)}


# ---------------------------------------------------------------- formulas by hand

def test_truncated_geometric_by_hand():
    assert truncated_geometric_pmf(0.5, 3) == pytest.approx([0.5, 0.25, 0.125, 0.125])
    for alpha in (0.0, 0.3, 0.9, 1.0):
        pmf = truncated_geometric_pmf(alpha, 5)
        assert sum(pmf) == pytest.approx(1.0)
        mean = sum(n * p for n, p in enumerate(pmf, start=1))  # E[tokens per cycle] of the paper
        assert mean == pytest.approx(expected_tokens_per_cycle(alpha, 5))
    assert predicted_per_position(0.5, 3) == pytest.approx([0.5, 0.25, 0.125])


def test_alpha_and_counts_from_hand_made_cycles():
    cycles = [cycle(0, [0.2, 0.4]), cycle(2, [1.0, 0.8]), cycle(1, [0.6, 0.0])]
    assert measured_alpha(cycles) == pytest.approx(3.0 / 6)
    assert tokens_per_cycle_counts(cycles, 2) == [1, 1, 1]
    assert measured_alpha([]) == 0.0


def test_a_cycle_that_drafted_nothing_is_no_draft():
    # A prompt lookup that found nothing: a plain step, left out of the distribution as vLLM leaves it out.
    cycles = [cycle(2, [1.0, 0.8]), cycle(0, []), cycle(0, [0.2, 0.4])]
    assert tokens_per_cycle_counts(cycles, 2) == [1, 0, 1]


def test_refined_equals_leviathan_when_verify_costs_one_step():
    t_step, c = 0.02, 0.1
    for k in (1, 4, 8):
        assert refined_speedup(0.7, k, t_step, c * t_step, t_step) == pytest.approx(predicted_speedup(0.7, k, c))
    # A verify pass that costs two steps: the refined prediction drops accordingly.
    assert refined_speedup(0.7, 4, t_step, c * t_step, 2 * t_step) == pytest.approx(
        expected_tokens_per_cycle(0.7, 4) / (4 * c + 2))


def test_verify_time_measured_inside_and_fitted_beyond():
    assert LINEAR.verify_time(3) == 0.014 and LINEAR.measured(3)
    assert LINEAR.verify_time(8) == pytest.approx(0.024) and not LINEAR.measured(8)
    assert LINEAR.fit() == pytest.approx((0.008, 0.002))


def test_cycle_times_and_speed_report_by_hand():
    # Two cycles of K=2: 1 ms draft steps, 3 ms verify, one 1 ms catch-up, 6 and 7 ms cycles.
    cycles = [cycle(2, [0.9, 0.9], [0.001, 0.001], 0.003, 0.001, 0.007),
              cycle(0, [0.5, 0.5], [0.001, 0.001], 0.003, 0.0, 0.006)]
    t = cycle_times(cycles)
    assert (t.draft_step_s, t.draft_s, t.verify_s, t.catch_up_s) == pytest.approx((0.001, 0.002, 0.003, 0.0005))
    assert t.other_s == pytest.approx(0.0065 - 0.0055) and t.decode_s == pytest.approx(0.013) and t.tokens == 4
    cal = Calibration(50, 0.002, 0.001, [1, 2, 3], [0.002, 0.0025, 0.003])
    r = speed_report(2, 0.7, t, cal, overhead_of(cycles, t))
    assert r.c == pytest.approx(0.5) and r.verify_in_steps == pytest.approx(1.5)
    # Two tokens a cycle at a median cycle of 6.5 ms, where one target step takes 2 ms.
    assert r.measured == pytest.approx(0.002 * 2 / 0.0065)
    assert (r.measured_spread.low, r.measured_spread.high) == pytest.approx((0.002 * 2 / 0.00675, 0.002 * 2 / 0.00625))
    assert r.leviathan == pytest.approx((1 + 0.7 + 0.49) / 2)
    # The refined prediction counts what a cycle costs beyond its forwards: the 1 ms catch-up step,
    # paid after a full accept (alpha^K = 0.49 of the cycles), and 1 ms of other time.
    assert r.overhead_s == pytest.approx(0.49 * 0.001 + 0.001)
    assert r.refined == pytest.approx((1 + 0.7 + 0.49) * 0.002 / (0.002 + 0.003 + 0.49 * 0.001 + 0.001))
    assert r.cycle_steps == pytest.approx((0.002 + 0.003 + 0.00149) / 0.002)
    assert r.closer == "refined" and "verifying 3 positions took 1.50 target steps" in explain_speed(r)


def test_a_stalled_cycle_moves_neither_c_nor_the_measured_speedup():
    # Five 6 ms cycles, then one in which another process held the core for a second.
    quiet = [cycle(1, [0.9, 0.9], [0.001, 0.001], 0.003, 0.0, 0.006) for _ in range(5)]
    stalled = cycle(1, [0.9, 0.9], [0.001, 0.5], 0.5, 0.0, 1.006)
    cal = Calibration(50, 0.002, 0.001, [1, 2, 3], [0.002, 0.0025, 0.003])
    before, after = (speed_report(2, 0.9, cycle_times(cs), cal) for cs in (quiet, quiet + [stalled]))
    assert (after.c, after.measured) == pytest.approx((before.c, before.measured))
    # Total time over total tokens, the definition this replaced, would have fallen sixfold.
    t = cycle_times(quiet + [stalled])
    assert 0.002 * t.tokens / t.decode_s < after.measured / 6


def test_advisor_finds_the_best_k_and_says_when_none_pays_off():
    cheap = advise_k(0.8, 0.0005, LINEAR, list(range(1, 9)))
    best = best_k(cheap)
    assert best.refined == max(a.refined for a in cheap) > 1.0
    assert 1 < best.k < 8 and advice_sentence(cheap).startswith(f"Best K = {best.k}")
    assert advised_k(cheap) == best
    costly = advise_k(0.3, 0.008, LINEAR, list(range(1, 9)))
    assert all(a.refined < 1 for a in costly)
    assert advised_k(costly).k == 0 and advised_k(costly).refined == 1.0  # decode plainly
    said = advice_sentence(costly)
    assert said.startswith("Decode plainly (K=0): no K beats plain decoding on this machine")
    assert f"K={best_k(costly).k}, is predicted at {best_k(costly).refined:.2f}x" in said  # the measured reason
    one = costly[0]  # K=1: one 8 ms draft step and a 12 ms verify pass, in 10 ms target steps
    assert one.cost_steps == pytest.approx(2.0) and one.refined == pytest.approx(one.expected_tokens / 2.0)


def test_a_cycles_overhead_carries_over_to_another_k():
    # The reference path feeds the draft d_K only after a full accept: alpha^K of the cycles.
    after_full_accepts = CycleOverhead(catch_up_step_s=0.004, every_cycle=False, other_s=0.001)
    assert after_full_accepts.at(0.5, 2) == pytest.approx(0.25 * 0.004 + 0.001)
    assert after_full_accepts.at(0.5, 4) == pytest.approx(0.0625 * 0.004 + 0.001)
    every_cycle = CycleOverhead(0.004, True, 0.001)  # the fast path feeds it in every cycle
    assert every_cycle.at(0.5, 2) == every_cycle.at(0.5, 4) == pytest.approx(0.005)
    # Measured from cycles: the catch-up step is the median of the cycles that paid one.
    cycles = [cycle(2, [0.9, 0.9], [0.001, 0.001], 0.003, 0.0012, 0.007),
              cycle(0, [0.5, 0.5], [0.001, 0.001], 0.003, 0.0, 0.006)]
    measured = overhead_of(cycles, cycle_times(cycles))
    assert (measured.catch_up_step_s, measured.every_cycle) == (0.0012, False)
    assert measured.other_s == pytest.approx(cycle_times(cycles).other_s)
    assert overhead_of([], None) == NO_OVERHEAD


def test_the_overhead_turns_the_int4_chat_case_into_decode_plainly():
    # Session 12's int4 chat target on a 2-core EPYC: a 17.2 ms step, a 3.8 ms draft step, a 19.0 ms
    # verify over 2 positions, alpha 0.42; a 4.2 ms catch-up step and 0.8 ms bookkeeping per cycle.
    # The forwards alone promise 1.07x at K=1; the run measured 0.89x.
    cal = Calibration(71, 0.01716, 0.00376, [1, 2], [0.01716, 0.01895])
    forwards_only = advise_k(0.42, 0.00376, cal, [1])
    assert forwards_only[0].refined == pytest.approx(1.42 * 17.16 / (3.76 + 18.95), rel=1e-3)
    assert advised_k(forwards_only).k == 1
    whole_cycle = advise_k(0.42, 0.00376, cal, [1], CycleOverhead(0.0042, False, 0.00079))
    assert whole_cycle[0].refined == pytest.approx(1.42 * 17.16 / (3.76 + 18.95 + 0.42 * 4.2 + 0.79), rel=1e-3)
    assert whole_cycle[0].refined < 1 and advised_k(whole_cycle).k == 0
    assert whole_cycle[0].cost_steps == pytest.approx((3.76 + 18.95 + 0.42 * 4.2 + 0.79) / 17.16, rel=1e-3)


def test_advisor_picks_k_from_the_measured_widths_only():
    # A curve with a slow width 2 (a BLAS kernel change): the line fitted through it falls,
    # so past the last measured width (4) it would promise wide verifies for 11 ms: a guess.
    bumpy = Calibration(10, 0.010, 0.001, [1, 2, 3, 4], [0.010, 0.020, 0.012, 0.011])
    advice = advise_k(0.9, 0.001, bumpy, list(range(1, 9)))
    assert [a.extrapolated for a in advice] == [False] * 3 + [True] * 5
    assert [a.verify_s for a in advice[:3]] == [0.020, 0.012, 0.011]  # measured, not fitted
    best = best_k(advice)
    assert best.k == 3 and not best.extrapolated
    assert best.refined < max(a.refined for a in advice)  # a fitted K looked better; it is not picked
    only_fitted = [a for a in advice if a.extrapolated]
    assert best_k(only_fitted) == max(only_fitted, key=lambda a: a.refined)


# ---------------------------------------------------------------- calibration and real traces

def test_context_of_length_repeats_the_prompt():
    assert context_of_length([5, 6, 7], 7) == [5, 6, 7, 5, 6, 7, 5]
    with pytest.raises(ValueError):
        context_of_length([], 3)


def test_calibration_shape(pair):
    s = SpecSettings(k=10, max_new_tokens=20)
    cal = calibrate(pair, [1, 2, 3, 4], s, repeats=1)
    assert cal["cache_len"] == 3 + 10  # prompt minus the open token, plus half the new tokens
    assert cal["verify_positions"] == list(range(1, 12))  # at least K+1 widths
    assert len(cal["verify_s"]) == 11 and min(cal["verify_s"]) > 0
    assert cal["target_step_s"] > 0 and cal["draft_step_s"] > 0
    assert calibration_of({"calibration": json.loads(json.dumps(cal))}).verify_positions == cal["verify_positions"]


def test_the_draft_step_is_timed_in_a_cycles_place_after_a_target_pass(pair, monkeypatch):
    # In a run the draft steps come right after a verify pass has streamed the target's weights
    # through the CPU's caches; timed back to back the Shakespeare draft read up to 37% cheaper
    # (bench/results/draft-step-*.md).
    calls = []
    for name, model in (("target", pair.target), ("draft", pair.draft)):
        real = model.forward
        monkeypatch.setattr(model, "forward", lambda ids, cache, *a, _n=name, _f=real, **kw:
                            calls.append((_n, len(ids), int(cache.get_seq_length()))) or _f(ids, cache, *a, **kw))
    s = SpecSettings(k=3, max_new_tokens=8)
    context = [1, 2, 3, 4, 5, 6]
    assert time_draft_in_cycle(pair, context, s, repeats=2) > 0
    assert calls[:2] == [("target", 5, 0), ("draft", 5, 0)]  # both caches filled once
    rounds = calls[2:]
    one_round = [("target", s.k + 1, 5)] + [("draft", 1, 5)] * s.k  # every forward from 5 cached positions
    assert rounds == one_round * 3  # the warm-up round and 2 kept


def test_step_is_timed_in_the_same_round_robin_as_the_widths(pair):
    s = SpecSettings(k=2, max_new_tokens=8)
    times = time_widths(pair.target, [1, 2, 3, 4, 5], [1, 2, 3], s, repeats=1, draw=False, step=True)
    assert set(times) == {1, 2, 3, "step"} and min(times.values()) > 0
    assert set(time_widths(pair.target, [1, 2, 3], [2], s, repeats=1, draw=False)) == {2}


def test_calibrated_trace_round_trips_and_stats_match_the_records(calibrated):
    trace = load_trace(calibrated)
    st = trace_stats(trace)
    cycles = trace.cycles
    betas = [b for c in cycles for b in c["beta"]]
    assert st.alpha == pytest.approx(sum(betas) / len(betas))
    assert st.acceptance["acceptance_rate"] == pytest.approx(trace.summary["acceptance_rate"])
    assert sum(st.tokens_per_cycle) == len(cycles)
    mean_committed = sum(n * count for n, count in enumerate(st.tokens_per_cycle, start=1)) / len(cycles)
    assert mean_committed == pytest.approx(trace.summary["mean_acceptance_length"])
    cal = trace.header["calibration"]
    r = st.speed
    tokens = sum(len(c["committed_token_ids"]) for c in cycles)
    median_cycle = statistics.median(c["cycle_time_s"] for c in cycles)
    assert r.measured == pytest.approx(cal["target_step_s"] * tokens / len(cycles) / median_cycle)
    assert r.measured_spread.low <= r.measured <= r.measured_spread.high
    draft_step = statistics.median(t for c in cycles for t in c["draft_step_times_s"])
    assert r.c == pytest.approx(draft_step / cal["target_step_s"])
    assert r.verify_in_steps == pytest.approx(st.calibration.verify_time(4) / cal["target_step_s"])
    # The headline prediction is the advisor's row at the trace's own K: one value, two places.
    at_k = next(a for a in st.advice if a.k == trace.k)
    assert (r.refined, r.leviathan, r.cycle_steps) == pytest.approx((at_k.refined, at_k.leviathan, at_k.cost_steps))
    assert r.leviathan == pytest.approx(predicted_speedup(st.alpha, 3, r.c))
    assert [a.k for a in st.advice] == list(range(1, 9))


def test_trace_without_or_with_broken_calibration(calibrated, tmp_path):
    lines = calibrated.read_text().splitlines()
    header = json.loads(lines[0])
    good = load_trace(calibrated)
    for value, error, refusal in ((None, None, None), ({"cache_len": 3}, "malformed", "calibration.target_step_s"),
                                  ({**header["calibration"], "target_step_s": 0}, "not positive",
                                   "calibration.target_step_s")):
        header["calibration"] = value
        path = tmp_path / "edited.jsonl"
        path.write_text("\n".join([json.dumps(header), *lines[1:]]))
        if refusal:  # a file with a broken calibration is refused, naming the field
            with pytest.raises(TraceError, match=refusal):
                load_trace(path)
        # In memory (a calibration measured now, say), the analysis still says what is wrong.
        st = trace_stats(Trace(dict(header), good.cycles, good.summary))
        assert st.speed is None and st.advice == []
        assert (st.calibration_error is None) if error is None else (error in st.calibration_error)
        assert st.acceptance["num_cycles"] == len(lines) - 2  # acceptance still works


def test_cli_stats_prints_the_analysis(calibrated, capsys):
    assert main(["stats", str(calibrated)]) == 0
    out = capsys.readouterr().out
    st = trace_stats(load_trace(calibrated))
    assert f"alpha: {st.alpha:.3f}" in out
    assert f"draft acceptance rate: {st.acceptance['acceptance_rate']:.3f}" in out
    assert f"measured: {st.speed.measured:.3f}x" in out and f"refined prediction: {st.speed.refined:.3f}x" in out
    assert f"c = t_draft / t_step: {st.speed.c:.3f}" in out
    assert "<- best" in out and "K ADVISOR" in out
    for n, count in enumerate(st.tokens_per_cycle, start=1):
        assert f"  {n:>6}  {count:>6}  {count / st.num_cycles:>8.3f}  {st.pmf[n - 1]:>9.3f}" in out


def test_cli_run_calibrate_flag_and_stats_without_calibration(pair, tmp_path, capsys):
    target, draft = save_tiny(pair, tmp_path / "models")
    for flag in ([], ["--calibrate"]):
        out = tmp_path / f"cli{len(flag)}.jsonl"
        assert main(["run", "--prompt", "the cat", "--target", target, "--draft", draft, "--k", "2",
                     "--max-new-tokens", "6", "--out", str(out), *flag]) == 0
        assert ("calibration" in load_trace(out).header) == bool(flag)
    capsys.readouterr()
    assert main(["stats", str(tmp_path / "cli0.jsonl")]) == 0
    assert "has no step-time calibration" in capsys.readouterr().out


def test_k_sweep_on_tiny_models(pair):
    s = SpecSettings(k=2, temperature=0.0, max_new_tokens=16)
    seen = []
    result = k_sweep(pair, [1, 2, 3], s, [1, 3], on_progress=lambda f, text: seen.append(f))
    assert [p.k for p in result.points] == [1, 3]
    assert seen == sorted(seen) and seen[-1] == 1.0
    assert all(p.tokens == 16 and p.tokens_per_s > 0 for p in result.points)
    assert all(0 <= p.acceptance_rate <= 1 and 1 <= p.mean_acceptance_length <= p.k + 1 for p in result.points)
    assert result.calibration["verify_positions"] == list(range(1, 10))
    predicted = result.predicted_tokens_per_s()
    assert predicted["mean_acceptance_length"] == pytest.approx(
        [expected_tokens_per_cycle(result.alpha, k) for k in (1, 3)])
    assert result.plain_tokens_per_s > 0 and not math.isnan(result.alpha)
