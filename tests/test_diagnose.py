"""`engine diagnose`: paired effects with known answers, the experiment plan, and a planted cause found
on tiny real models (first in the ranking, its interval excluding zero)."""
import json
from dataclasses import replace
from pathlib import Path

import pytest

from engine.cli import main
from engine.config import SpecSettings
from engine.diagnose.experiments import ALTERNATIVE, CAUSE, PROPERTY, TUNING, Arm, Experiment, plan
from engine.diagnose.paired import RequestCounts, paired_effect, percentile
from engine.diagnose.report import Finding, as_dict, finding_of, format_findings, ranked
from engine.diagnose.verdict import Advice
from engine.drafters.registry import DrafterOptions
from tests.tiny import noisy_pair, save_tiny


def counts(rates: list[float], drafted: int = 100, prefix: str = "r") -> list[RequestCounts]:
    return [RequestCounts(f"{prefix}{i}", "c", f"{i}.jsonl", drafted, round(rate * drafted), 10, 20, 1.0)
            for i, rate in enumerate(rates)]


def test_a_shift_shared_by_every_request_is_found_with_a_tight_interval():
    base = counts([0.2, 0.5, 0.8, 0.3])
    better = [RequestCounts(r.id, r.category, r.file, r.drafted, r.accepted + 10, r.cycles, r.generated, r.seconds)
              for r in base]
    e = paired_effect("acceptance_rate", base, better)
    assert e.difference == pytest.approx(0.1) and e.interval == pytest.approx((0.1, 0.1)) and e.found


def test_changes_that_cancel_out_are_no_effect():
    base = counts([0.5, 0.5, 0.5, 0.5, 0.5, 0.5])
    mixed = counts([0.7, 0.3, 0.7, 0.3, 0.7, 0.3])
    e = paired_effect("acceptance_rate", base, mixed)
    assert e.difference == pytest.approx(0.0) and e.interval[0] < 0 < e.interval[1] and not e.found


def test_a_joint_interval_is_wider_so_a_small_effect_among_many_experiments_is_not_called_found():
    """Bonferroni: each of 8 comparisons at 1 - 0.05/8, so that all 8 intervals hold together at 95%."""
    base = counts([0.3, 0.5, 0.4, 0.6, 0.2, 0.5, 0.4, 0.3, 0.5, 0.4])
    nudged = counts([0.36, 0.48, 0.47, 0.62, 0.27, 0.49, 0.46, 0.31, 0.55, 0.37])
    alone, among_eight = paired_effect("acceptance_rate", base, nudged), paired_effect("acceptance_rate", base, nudged, joint=8)
    assert among_eight.difference == alone.difference
    assert among_eight.interval[0] < alone.interval[0] and among_eight.interval[1] > alone.interval[1]
    assert alone.found and not among_eight.found  # +0.028: up in 7 requests, down in 3
    assert alone.interval_words(2).startswith("95% interval") and among_eight.interval_words(2).startswith("95% joint")


def test_pairing_needs_the_same_requests_and_percentiles_interpolate():
    with pytest.raises(ValueError, match="same requests"):
        paired_effect("acceptance_rate", counts([0.5]), counts([0.5], prefix="q"))
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5 and percentile([5.0], 0.975) == 5.0


def base_arm(**settings) -> Arm:
    return Arm("baseline", DrafterOptions(), SpecSettings(**({"k": 4, "temperature": 0.0} | settings)))


def names(experiments: list[Experiment]) -> dict[str, str]:
    return {e.name: e.skipped for e in experiments}


def test_the_plan_runs_what_applies_and_says_why_the_rest_does_not():
    greedy = names(plan(base_arm(), has_template=False, has_eagle=False, prefix="x", best_k=None))
    assert greedy["chat template"] == "the target's tokenizer has no chat template"
    assert "no top-k or top-p" in greedy["sampling filters"]
    assert "no calibration" in greedy["draft depth"]
    assert greedy["drafter prompt-lookup"] == "" and "drafter eagle" not in greedy
    assert {"temperature 0.7", "temperature 1.0", "context length"} <= set(greedy)
    sampled = plan(base_arm(temperature=1.0, top_p=0.9, k=12), has_template=True, has_eagle=True, prefix="x",
                   best_k=5, plain_better=True)
    by_name = {e.name: e for e in sampled}
    assert by_name["sampling filters"].arm.drafter.draft_filters == "temperature only"
    assert by_name["chat template"].arm.drafter.draft_prompt == "raw"
    assert by_name["draft depth"].arm.settings.k == 5 and by_name["drafter eagle"].arm is not None
    assert by_name["context length"].arm.prefix == "x"
    assert "plain decoding beats every K" in by_name["draft depth"].change


def test_suffix_decoding_is_diagnosed_with_and_without_its_global_tree():
    assert "global tree" not in names(plan(base_arm(), has_template=False, has_eagle=False, prefix="x", best_k=None))
    base = Arm("baseline", DrafterOptions("suffix"), SpecSettings(k=4, temperature=0.0))
    by_name = {e.name: e for e in plan(base, has_template=True, has_eagle=False, prefix="x", best_k=None)}
    arm = by_name["global tree"].arm
    assert arm.drafter.kind == "suffix" and arm.drafter.suffix_cached_requests == 0 and arm.settings == base.settings
    assert by_name["global tree"].kind == PROPERTY and "own tree only" in by_name["global tree"].change
    assert by_name["chat template"].skipped and by_name["drafter prompt-lookup"].arm.drafter.kind == "prompt-lookup"


def found(name: str, diff: float, kind: str = CAUSE, faster: float = 0.0, step_faster: float | None = None) -> Finding:
    """A finding whose arm shifts every request's acceptance by `diff`, whose wall clock is `faster`
    (0.1: 10% more tokens/s) and whose cycles on the step times are `step_faster` (None: no step times)."""
    e = paired_effect("acceptance_rate", counts([0.3, 0.4]), counts([0.3 + diff, 0.4 + diff]))
    slow = [replace(r, committed=r.accepted, step_seconds=None if step_faster is None else 1.0 + i / 10)
            for i, r in enumerate(counts([0.3, 0.4]))]
    quick = [replace(r, seconds=r.seconds / (1 + faster),
                     step_seconds=None if step_faster is None else r.step_seconds / (1 + step_faster)) for r in slow]
    return Finding(Experiment(name, kind, "now", "changed", None), "f", e, paired_effect("tokens_per_s", slow, quick),
                   2, step_speed=paired_effect("step_tokens_per_s", slow, quick))


def test_causes_rank_by_acceptance_then_k_by_step_times_alternatives_by_speed_and_properties_last():
    order = [f.experiment.name for f in ranked([
        found("small", 0.05), found("temp", 0.4, PROPERTY), found("worse", -0.1), found("big", 0.2),
        found("none", 0.0), found("depth", 0.3, TUNING, faster=-0.5, step_faster=0.2),
        found("lookup", 0.5, ALTERNATIVE, faster=0.1), found("eagle", -0.2, ALTERNATIVE, faster=0.5)])]
    # gains first, then no effect, then what is set right already; K after every cause, however large
    # its acceptance gain (a shorter K gains by arithmetic); eagle: slower to accept, faster
    assert order == ["big", "small", "none", "worse", "depth", "eagle", "lookup", "temp"]


def test_what_to_change_first_is_the_fastest_change_and_never_a_k_the_advisor_beats_with_plain_decoding():
    depth = found("draft depth", 0.3, TUNING, faster=-0.2, step_faster=0.25)
    big = found("big", 0.2, faster=0.1)
    assert "tokens/s on this machine's step times" in depth.verdict() and "+0.3" not in depth.verdict().split(";")[0]
    # no advice: K's x1.25 on the step times beats the cause's x1.10 on the wall clock
    assert format_findings([found("worse", -0.1), depth, big]).startswith("FIRST TO CHANGE: draft depth: ")
    step = depth.step_speed.baseline
    plain = Advice(1, True, step * 1.5, step)  # the advisor: plain decoding x1.5, faster than every K
    report = format_findings([found("worse", -0.1), depth, big], plain, 2)
    assert report.startswith("FIRST TO CHANGE: plain decoding: tokens/s on this machine's step times")
    ranked_lines = [line for line in report.splitlines() if line.startswith("  ") and line[2].isdigit()]
    assert [line.split(":")[0].strip() for line in ranked_lines[:3]] == ["1. plain decoding", "2. draft depth", "3. big"]
    slower_k = found("draft depth", 0.3, TUNING, faster=0.5, step_faster=-0.2)  # wall clock is not what judges K
    assert "set right already" in found("worse", -0.1).verdict() and "set right" in slower_k.verdict()
    assert format_findings([slower_k]).startswith("FIRST TO CHANGE: nothing tried here was faster")


def test_a_finding_is_worded_the_same_from_its_dict():
    """The app words a diagnosis file's findings again from their numbers (app/ui/diagnoses.py)."""
    for f in [found("big", 0.2, faster=0.1), found("depth", 0.3, TUNING, faster=-0.2, step_faster=0.25),
              found("lookup", 0.5, ALTERNATIVE, faster=0.1)]:
        d = json.loads(json.dumps(as_dict(f)))
        assert finding_of(d).verdict() == f.verdict() == d["verdict"]
    assert "wall-clock tokens/s" in found("lookup", 0.5, ALTERNATIVE, faster=0.1).verdict()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return save_tiny(noisy_pair(2, noise=0.05), tmp_path_factory.mktemp("diagnose-models"))


def prompts(tmp_path) -> str:
    path = tmp_path / "p.jsonl"
    texts = ["the cat sat on a mat", "a dog ran far away", "the log and then it slept", "it sat on a log",
             "the dog slept on the mat", "a cat ran and then"]
    path.write_text("\n".join(json.dumps({"id": f"q{i}", "category": "ab"[i % 2], "prompt": t})
                              for i, t in enumerate(texts)))
    return str(path)


def test_a_draft_ignoring_top_k_is_found_first(folders, tmp_path, capsys):
    """Planted: the draft samples outside the request's top-k=1, which the target then rejects."""
    target, draft = folders
    code = main(["diagnose", "--target", target, "--draft", draft, "--prompts", prompts(tmp_path),
                 "--out", str(tmp_path / "d"), "--temperature", "1", "--top-k", "1", "--k", "3",
                 "--max-new-tokens", "16", "--draft-filters", "temperature only",
                 "--only", "sampling filters,drafter prompt-lookup", "--json"])
    assert code == 0
    found = json.loads(capsys.readouterr().out)
    first = found["findings"][0]
    assert first["experiment"] == "sampling filters" and first["acceptance_rate"]["found"]
    assert first["acceptance_rate"]["difference"] > 0 and first["requests"] == 6
    assert first["verdict"].startswith("sampling filters: the draft ignores the request's top-k/top-p: acceptance")
    assert (tmp_path / "d" / "baseline" / "manifest.json").is_file()  # the traces behind every figure
    assert json.loads((tmp_path / "d" / "diagnosis.json").read_text())["findings"][0] == first


def test_an_experiment_that_cannot_run_says_why_and_the_others_still_run(folders, tmp_path, capsys):
    target, draft = folders
    code = main(["diagnose", "--target", target, "--draft", draft, "--prompts", prompts(tmp_path),
                 "--out", str(tmp_path / "d"), "--temperature", "0", "--max-new-tokens", "8",
                 "--only", "chat template,drafter prompt-lookup,temperature 1.0"])
    out = capsys.readouterr().out
    assert code == 0
    assert "chat template: not run here (the target's tokenizer has no chat template)" in out
    assert "drafter prompt-lookup:" in out and "temperature 1.0:" in out


def test_the_probe_predicts_a_greedy_baseline(folders, tmp_path, capsys):
    """From the baseline's own greedy outputs; the last cycle of each request may draft past its
    output, which the probe cannot see, hence a tolerance rather than equality."""
    target, draft = folders
    assert main(["diagnose", "--target", target, "--draft", draft, "--prompts", prompts(tmp_path),
                 "--out", str(tmp_path / "d"), "--temperature", "0", "--k", "3", "--max-new-tokens", "24",
                 "--only", "probe", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    predicted = found["probe"]["overall"]["predicted_greedy_acceptance_rate"]
    assert abs(predicted - found["baseline"]["acceptance_rate"]) <= 0.05
    assert set(found["probe"]["categories"]) == {"a", "b"}


def test_an_arm_whose_drafter_cannot_load_is_reported_and_the_rest_still_run(folders, tmp_path):
    from engine.diagnose.diagnosis import diagnose
    from engine.models.errors import ModelLoadError
    from engine.run import load_with_drafter
    from engine.workload.prompts import read_prompts

    target, draft = folders

    def load(options: DrafterOptions):
        if options.kind == "prompt-lookup":
            raise ModelLoadError("no such drafter here (a test)")
        return load_with_drafter(target, DrafterOptions(draft_model=draft, **{
            f: getattr(options, f) for f in ("draft_prompt", "draft_filters")}))

    base = Arm("baseline", DrafterOptions(draft_model=draft), SpecSettings(k=2, temperature=0.0, max_new_tokens=6))
    result = diagnose(load, base, read_prompts(prompts(tmp_path)), tmp_path / "d", has_template=False,
                      has_eagle=False, context_prefix="the cat ", only={"drafter prompt-lookup", "context length"})
    by_name = {f.experiment.name: f for f in result.findings}
    assert by_name["drafter prompt-lookup"].error == "no such drafter here (a test)"
    assert "could not run (no such drafter here (a test))" in by_name["drafter prompt-lookup"].verdict()
    assert by_name["context length"].acceptance is not None and by_name["context length"].requests == 6


def test_arms_run_request_by_request_and_k_is_timed_on_the_baselines_step_times(folders, tmp_path, monkeypatch):
    """Interleaved, so a busy moment of the machine slows every arm alike; the depth arm comes after the
    baseline (its K comes from the baseline's acceptance) and records the baseline's calibration."""
    from engine.diagnose import diagnosis
    from engine.run import load_with_drafter
    from engine.workload.folder import open_folder
    from engine.workload.prompts import read_prompts

    target, draft = folders
    # K=1 whatever the tiny pair's timings say
    monkeypatch.setattr(diagnosis, "advice", lambda baseline: Advice(1, False, 10.0, 5.0))
    load = lambda options: load_with_drafter(target, DrafterOptions(  # noqa: E731
        kind=options.kind, draft_model=draft if options.kind == "model" else None))
    seen: list[str] = []
    base = Arm("baseline", DrafterOptions(draft_model=draft), SpecSettings(k=3, temperature=0.0, max_new_tokens=8))
    result = diagnosis.diagnose(load, base, read_prompts(prompts(tmp_path))[:3], tmp_path / "d", has_template=False,
                                has_eagle=False, context_prefix="", on_request=seen.append,
                                only={"drafter prompt-lookup", "draft depth"})
    assert seen == ["baseline", "drafter-prompt-lookup"] * 3 + ["k-1"] * 3
    depth = next(f for f in result.findings if f.experiment.name == "draft depth")
    calibration = result.baseline.workload.runs()[0].trace.header["calibration"]
    assert all(r.trace.header["calibration"] == calibration for r in open_folder(Path(depth.folder)).runs())
    assert depth.step_speed.difference is not None and depth.step_speed.baseline > 0
    assert [f.experiment.kind for f in result.findings] == [TUNING, ALTERNATIVE]
