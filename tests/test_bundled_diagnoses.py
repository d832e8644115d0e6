"""The shipped diagnoses (assets/diagnoses/): every figure of a case is what engine/diagnose computes from
the arms' shipped traces, every arm opens as a checked workload, and on each case mis-set on purpose the
report ranks the planted cause first among the drafter's settings and K, with an interval that excludes
zero (what to change first is the verdict's, by tokens/s: tests/test_diagnose_verdict.py)."""
import json
from pathlib import Path

import pytest

from engine.diagnose.paired import counts_of, paired_effect
from engine.workload.folder import open_workload

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "assets" / "diagnoses"
CASES = sorted(SHIPPED.glob("*.json"))
JUDGED_BY = {"cause": "acceptance_rate", "tuning": "step_tokens_per_s", "alternative": "tokens_per_s",
             "property": "acceptance_rate"}
PLANTED = {"chat-draft-without-chat-template": "chat template", "chat-draft-ignores-top-k": "sampling filters",
           "chat-k-far-too-deep": "draft depth", "chat-eagle3-without-aux-states": "auxiliary states"}


def case(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_both_presets_and_four_planted_causes_are_shipped():
    names = {p.stem for p in CASES}
    assert {"chat-set-correctly", "tiny-shakespeare-set-correctly", *PLANTED} <= names
    for name, planted in PLANTED.items():
        assert case(SHIPPED / f"{name}.json")["case"]["planted"] == planted


def helps(f: dict) -> bool:
    e = f[JUDGED_BY[f["kind"]]]
    return not f["error"] and not f["skipped"] and e is not None and e["found"] and e["difference"] > 0


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_the_planted_cause_ranks_first_among_the_settings(name):
    d = case(SHIPPED / f"{name}.json")
    first = next(f for f in d["findings"] if f["kind"] in ("cause", "tuning") and helps(f))
    assert first["experiment"] == PLANTED[name]
    low, high = first[JUDGED_BY[first["kind"]]]["interval"]
    assert low > 0 and high > low
    assert first["verdict"].startswith(f"{PLANTED[name]}: ")


def arm(name: str, arm_name: str):
    return open_workload(SHIPPED / f"{name}--{arm_name}.zip")


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_every_figure_is_recomputed_from_the_shipped_traces(path):
    """The same requests, the same bootstrap seed and the same family size: the engine's own functions on
    the shipped traces give the shipped numbers (only float summation order could differ)."""
    from app.ui import diagnoses
    d = case(path)
    diagnoses.check(d, path.stem)  # what the page will accept
    baseline = [counts_of(r) for r in arm(path.stem, "baseline").runs()]
    assert len(baseline) == d["baseline"]["requests"]
    assert sum(r.accepted for r in baseline) / sum(r.drafted for r in baseline) == \
        pytest.approx(d["baseline"]["acceptance_rate"], abs=1e-12)
    ran = [f for f in d["findings"] if f["arm"] and not f["error"]]
    assert ran, "a case with no arm"
    for f in ran:
        variant = {r.id: r for r in (counts_of(x) for x in arm(path.stem, f["arm"]).runs())}
        both = [r for r in baseline if r.id in variant]
        assert len(both) == f["requests"]
        for measure in ("acceptance_rate", "tokens_per_s", "step_tokens_per_s"):
            shipped = f[measure]
            got = paired_effect(measure, both, [variant[r.id] for r in both], joint=shipped["joint"])
            if shipped["difference"] is None:  # step times: only the baseline and the depth arm are calibrated
                assert got.difference is None
                continue
            assert got.difference == pytest.approx(shipped["difference"], abs=1e-9), (f["experiment"], measure)
            if shipped["interval"] is not None:
                assert list(got.interval) == pytest.approx(shipped["interval"], abs=1e-9), (f["experiment"], measure)
                assert got.found == shipped["found"]


def test_the_trained_length_counts_are_the_engine_s_on_the_shipped_traces():
    """The EAGLE-3 case: the drafts past the head's trained length, recomputed from its baseline and context arm."""
    from engine.diagnose.experiments import CONTEXT, CONTEXT_ARM
    from engine.diagnose.trained_length import trained_length_report
    name = "chat-eagle3-without-aux-states"
    shipped = case(SHIPPED / f"{name}.json")["trained_length"]
    got = trained_length_report({"baseline": arm(name, "baseline").runs(), CONTEXT: arm(name, CONTEXT_ARM).runs()})
    assert got == shipped
    assert shipped["trained_positions"] == 206 and shipped["arms"][CONTEXT]["drafted_within"] == 0  # all past it
