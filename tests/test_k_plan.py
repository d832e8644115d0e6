"""The K advisor for a run about to start: K = 0 (decode plainly) when no K beats plain decoding on
the measured curve, the advised K otherwise, and a live run that follows it unless told to insist."""
import pytest

import engine.run
import engine.stats.plan
from engine.config import SpecSettings
from engine.cycle.plain import target_generate
from engine.run import answer_text, encode_prompt, run_advised
from engine.stats.analysis import NO_OVERHEAD, CycleOverhead
from engine.stats.plan import plan_from
from engine.trace import load_trace
from tests.app_jobs import finish_job
from tests.test_app import live_form, model_folders, plain, traces_dir  # noqa: F401 (fixtures)
from tests.tiny import noisy_pair, save_tiny, tiny_pair

WIDTHS = list(range(1, 10))
# Hand-built calibrations (seconds): a draft step as dear as a target step makes every K lose; a
# draft step at a tenth of it with a flat verify curve makes speculation win from K=1 at alpha 0.8.
COSTLY = {"cache_len": 8, "repeats": 1, "threads": 1, "target_step_s": 0.010, "draft_step_s": 0.010,
          "verify_positions": WIDTHS, "verify_s": [0.010 + 0.004 * w for w in WIDTHS]}
CHEAP = {**COSTLY, "draft_step_s": 0.001, "verify_s": [0.011] * len(WIDTHS)}


@pytest.fixture(autouse=True)
def hand_built_costs_are_the_whole_cycle(monkeypatch):
    """The hand-built calibrations stand for everything a cycle costs: the pilot's measured overhead
    (real seconds of the tiny models on this machine) would not be on their scale."""
    monkeypatch.setattr(engine.stats.plan, "overhead_of", lambda *a: NO_OVERHEAD)


def test_the_plan_is_k0_when_no_k_beats_plain_decoding_and_says_why():
    plan = plan_from(0.5, COSTLY, 4, 16)
    assert plan.plain and plan.k == 0 and plan.best.k >= 1 and plan.best.refined < 1
    assert plan.sentence.startswith("Decode plainly (K=0)") and f"{plan.best.refined:.2f}x" in plan.sentence
    good = plan_from(0.8, CHEAP, 4, 16)
    assert good.k == good.best.k >= 1 and good.best.refined > 1 and good.sentence.startswith(f"Best K = {good.k}")
    # 40 ms of bookkeeping a cycle (4 target steps) outweighs what any K of 1..9 saves here
    burdened = plan_from(0.8, CHEAP, 4, 16, CycleOverhead(0.001, False, 0.040))
    assert burdened.plain and burdened.best.refined < 1


def test_an_advised_run_decodes_plainly_or_traces_at_the_advised_k(tmp_path, monkeypatch):
    pair, s = tiny_pair(), SpecSettings(k=4, temperature=1.0, max_new_tokens=12, seed=3)
    monkeypatch.setattr(engine.run, "measure_step_times", lambda *a: COSTLY)
    out = tmp_path / "plain.jsonl"
    done = run_advised(pair, "the cat sat", s, out)
    ids = encode_prompt(pair.target.tokenizer, "the cat sat", True)
    assert done.plan.plain and done.trace is None and not out.exists()  # nothing written
    assert done.text == answer_text(pair.target.tokenizer, target_generate(pair.target, ids, s, pair.eos_ids))
    monkeypatch.setattr(engine.run, "measure_step_times", lambda *a: CHEAP)
    done = run_advised(pair, "the cat sat", s, tmp_path / "spec.jsonl")
    trace = load_trace(tmp_path / "spec.jsonl")
    assert done.plan.k >= 1 and trace.k == done.plan.k and trace.header["calibration"] == CHEAP
    assert done.text == trace.summary["generated_text"]


@pytest.mark.parametrize("calibration", [COSTLY, CHEAP], ids=["plain", "speculative"])
def test_the_live_run_follows_the_advisor_unless_told_to_insist(calibration, traces_dir, model_folders,  # noqa: F811
                                                                monkeypatch):
    monkeypatch.setattr(engine.run, "measure_step_times", lambda *a: calibration)
    at = live_form(model_folders, monkeypatch)
    before = at.session_state["trace_ref"]
    at.checkbox(key="live_insist_k").uncheck()
    at.button(key="live_run").click().run(timeout=120)
    finish_job(at)
    assert not at.exception and not at.error, [e.value for e in at.error]
    said = [plain(i.value) for i in at.info]
    if calibration is COSTLY:
        assert at.session_state["trace_ref"] == before and not at.success  # no trace: the open one stays
        assert any(t.startswith("Decoded plainly: ") and "Decode plainly (K=0)" in t for t in said), said
    else:
        trace = load_trace(at.session_state["trace_ref"].path)
        assert any(t.startswith(f"The K advisor chose K={trace.k} instead of 3") or
                   t.startswith(f"The K advisor kept K={trace.k}") for t in said), said
        assert plain(at.success[0].value).startswith(f"Finished: {len(trace.cycles)} cycles")


# A verify pass that costs two target steps at every width, and a cheap draft: at alpha 0.36 a cycle
# commits at most 1/(1 - 0.36) = 1.56 tokens on average, less than the verify alone costs.
DEAR_VERIFY = {**CHEAP, "verify_s": [0.020] * len(WIDTHS)}


def test_a_verify_dearer_than_what_speculation_can_win_means_plain_decoding_and_the_sentence_says_so():
    plan = plan_from(0.36, DEAR_VERIFY, 4, 16)
    assert plan.plain and plan.k == 0 and plan.best.refined < 1 and plan.best.verify_steps == pytest.approx(2.0)
    assert plan.sentence.startswith("Decode plainly (K=0)") and "\n" not in plan.sentence  # one line
    assert f"over {plan.best.k + 1} positions costs 2.00 target steps here" in plan.sentence
    assert "already more than" in plan.sentence  # the verify alone outweighs the expected tokens
    assert plan_from(0.9, CHEAP, 4, 16).k >= 1  # the same advisor speculates where it pays


# A verify pass that costs 1.2 target steps at every width and a draft step at a tenth of one (no overhead): at
# alpha 0.5, K=2 commits 1.75 tokens a cycle for 1.4 steps (1.25x), K=1 1.5 tokens for 1.3 steps (1.15x);
# at alpha 0.305 K=2 commits 1.398 for 1.4 (0.999x), K=1 1.305 for 1.3 (1.004x).
NEAR = {**CHEAP, "draft_step_s": 0.001, "verify_s": [0.012] * len(WIDTHS)}


def test_a_k_that_wins_only_at_the_pilots_alpha_is_not_chosen_and_the_sentence_says_why():
    sure = plan_from(0.5, NEAR, 4, 16)  # no uncertainty given: the K predicted fastest
    assert sure.k == sure.best.k >= 2 and sure.best.refined > 1.2 and sure.sentence.startswith("Best K = ")
    within = plan_from(0.5, NEAR, 4, 16, alpha_error=0.05)  # the best K still wins at 0.45: unchanged
    assert (within.k, within.sentence) == (sure.k, sure.sentence) and within.alpha_error == 0.05
    unsure = plan_from(0.5, NEAR, 4, 16, alpha_error=0.3)  # at 0.2 no K wins
    assert unsure.plain and unsure.best == sure.best  # the best K at the pilot's alpha, for the record
    assert unsure.sentence.startswith("Decode plainly (K=0): At the pilot's alpha 0.50 K=")
    assert "only to +-0.30, and at 0.20 K=" in unsure.sentence and "plain decoding cannot lose" in unsure.sentence
    smaller = plan_from(0.5, NEAR, 4, 16, alpha_error=0.195)  # at 0.305 K=1 still wins, the longer chains do not
    assert smaller.k == 1 and smaller.sentence.startswith("K = 1: At the pilot's alpha 0.50 K=")
    assert "K=1 still beats plain decoding there" in smaller.sentence


def test_the_pilots_alpha_error_is_the_spread_of_its_cycles():
    from engine.stats.analysis import alpha_standard_error
    cycles = [{"beta": [1.0, 1.0]}, {"beta": [0.0, 0.0]}, {"beta": [1.0, 0.0]}, {"beta": []}]  # means 1, 0, 0.5
    assert alpha_standard_error(cycles) == pytest.approx(0.5 / 3 ** 0.5)  # stdev 0.5 over sqrt(3) cycles
    assert alpha_standard_error(cycles[:1]) == 0.0 and alpha_standard_error([]) == 0.0


def test_cli_k_auto_decodes_plainly_when_the_advisor_says_so_and_refuses_what_it_cannot_do(tmp_path, monkeypatch,
                                                                                             capsys):
    from engine.cli import main
    target, draft = save_tiny(noisy_pair(0, noise=0.05), tmp_path)  # a draft close to the target: alpha high
    base = ["run", "--target", target, "--draft", draft, "--prompt", "the cat sat", "--max-new-tokens", "8",
            "--k", "auto"]
    monkeypatch.setattr(engine.run, "measure_step_times", lambda *a: COSTLY)
    out = tmp_path / "auto.jsonl"
    assert main([*base, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "K advisor (pilot alpha" in captured.err and "Decode plainly (K=0)" in captured.err
    assert "decoded plainly" in captured.out and not out.exists()
    monkeypatch.setattr(engine.run, "measure_step_times", lambda *a: CHEAP)
    assert main([*base, "--temperature", "0", "--out", str(out)]) == 0
    assert "trace written to" in capsys.readouterr().out and load_trace(out).k >= 1
    assert main([*base, "--tree", "static:2,1", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "use one of the two" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base[:-1], "many", "--out", str(tmp_path / "y.jsonl")])
    assert "neither a whole number nor auto" in capsys.readouterr().err


def test_the_live_runs_words_give_the_pilots_alpha_with_its_error_and_the_plans_sentence():
    from app.runs.live import advised_words
    plan = plan_from(0.5, NEAR, 4, 16, alpha_error=0.05)
    words = advised_words(plan)
    assert words.startswith(f"The K advisor chose K={plan.k} instead of 4 (pilot alpha 0.50 ± 0.05). ")
    assert words.endswith(plan.sentence)
