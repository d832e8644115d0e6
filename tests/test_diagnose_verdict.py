"""What a diagnosis says to change first (engine/diagnose/verdict.py) never contradicts its own K advisor.

A property over every bundled diagnosis (assets/diagnoses/) and over generated ones: the verdict holds every
change measured faster and nothing else, the fastest first; no K comes before plain decoding where the
advisor says plain decoding beats every K; plain decoding or another drafter comes first when it is the
fastest. Four hand-built cases pin each kind of winner: plain decoding, another drafter, a cause, a K.
"""
import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from engine.diagnose.experiments import ALTERNATIVE, CAUSE, PROPERTY, TUNING
from engine.diagnose.verdict import PLAIN, Advice, Option, advisor, options, verdict
from engine.workload.folder import open_workload

SHIPPED = Path(__file__).resolve().parent.parent / "assets" / "diagnoses"
CASES = sorted(SHIPPED.glob("*.json"))


def effect(measure: str, baseline: float | None, variant: float | None, interval: tuple[float, float] | None,
           joint: int = 4) -> dict:
    difference = None if baseline is None or variant is None else variant - baseline
    found = interval is not None and (interval[0] > 0 or interval[1] < 0)
    return {"measure": measure, "baseline": baseline, "variant": variant, "difference": difference,
            "interval": None if interval is None else list(interval), "found": found, "joint": joint}


def finding(name: str, kind: str, wall: tuple[float, float, tuple] | None = None,
            step: tuple[float, float, tuple] | None = None, skipped: str | None = None) -> dict:
    """A finding as a diagnosis file holds it; wall / step: (baseline, variant, interval) in tokens/s."""
    return {"experiment": name, "arm": None if skipped else name.replace(" ", "-"), "kind": kind, "now": "now",
            "change": "changed", "skipped": skipped, "error": None, "requests": 20,
            "acceptance_rate": effect("acceptance_rate", 0.1, 0.12, (0.01, 0.03)),
            "tokens_per_s": None if wall is None else effect("tokens_per_s", *wall),
            "step_tokens_per_s": None if step is None else effect("step_tokens_per_s", *step), "verdict": name}


def assert_consistent(faster: list[Option], every: list[Option], advice: Advice | None) -> None:
    """The verdict's own rules, read off its output: what a reader of the page must never catch it out on."""
    plain_wins = advice is not None and advice.plain_better
    plain = next((o for o in faster if o.kind == PLAIN), None)
    dropped = [o for o in every if o.faster and o.kind == TUNING and plain_wins and plain is None]
    assert {o.name for o in faster} == {o.name for o in every if o.faster and o not in dropped}
    assert all(o.faster and o.kind in (PLAIN, CAUSE, TUNING, ALTERNATIVE) for o in faster)
    if not faster:
        return
    first = faster[0]
    if plain_wins:
        assert first.kind != TUNING, "a K recommended first while the advisor says plain decoding beats every K"
        if plain is not None:
            assert all(faster.index(plain) < faster.index(o) for o in faster if o.kind == TUNING)
    # the first is the fastest, a K aside where the advisor's plain decoding is ranked above it
    assert all(first.speedup >= o.speedup for o in faster if not (plain_wins and o.kind == TUNING))
    assert first.speedup > 1
    if plain is not None and first is not plain:
        assert first.kind != TUNING and first.speedup >= plain.speedup  # another drafter or a cause, faster still


def shipped_advice(d: dict) -> Advice:
    return Advice(**d["advisor"])


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_every_bundled_verdict_keeps_to_its_advisor(path):
    d = json.loads(path.read_text(encoding="utf-8"))
    advice = shipped_advice(d)
    # the file's advisor figures are what the engine reads off the baseline's shipped traces
    assert advisor(open_workload(SHIPPED / f"{path.stem}--baseline.zip").runs()) == advice
    faster = verdict(d["findings"], advice, d["baseline"]["requests"])
    assert_consistent(faster, options(d["findings"], advice, d["baseline"]["requests"]), advice)


def bundled(name: str) -> tuple[list[Option], Advice]:
    d = json.loads((SHIPPED / f"{name}.json").read_text(encoding="utf-8"))
    return verdict(d["findings"], shipped_advice(d), d["baseline"]["requests"]), shipped_advice(d)


def test_the_bundled_chat_cases_change_to_plain_decoding_or_prompt_lookup_never_to_a_k_first():
    """On this CPU the advisor finds plain decoding faster than every K for the chat pair."""
    for name in ("chat-draft-ignores-top-k", "chat-draft-without-chat-template", "chat-k-far-too-deep",
                 "chat-set-correctly"):
        faster, advice = bundled(name)
        assert advice.plain_better and faster[0].kind in (PLAIN, ALTERNATIVE), name
        assert [o.kind for o in faster].index(TUNING) > [o.kind for o in faster].index(PLAIN), name
    faster, _ = bundled("chat-draft-ignores-top-k")
    lookup = next(o for o in faster if o.name == "drafter prompt-lookup")
    filters = next(o for o in faster if o.name == "sampling filters")
    assert lookup.variant - lookup.baseline == pytest.approx(7.39, abs=0.01)  # +7.4 tokens/s
    assert filters.variant - filters.baseline == pytest.approx(0.76, abs=0.01)  # the planted cause: +0.8
    assert faster.index(filters) > faster.index(lookup) and faster[0].speedup >= lookup.speedup
    faster, _ = bundled("chat-set-correctly")
    assert faster[0].name == "drafter prompt-lookup"  # measured faster than the advisor's plain decoding
    faster, advice = bundled("tiny-shakespeare-set-correctly")
    assert not advice.plain_better and faster == []  # K=5's interval includes 0: nothing shown faster


def test_a_file_without_advisor_figures_is_ranked_from_its_traces_the_same_way():
    """An older diagnosis file: the app reads the advisor off the baseline's traces (app/ui/diagnoses.py)."""
    from app.ui import diagnoses
    for path in CASES:
        d = json.loads(path.read_text(encoding="utf-8"))
        old = {k: v for k, v in d.items() if k != "advisor"}
        choice = ("bundled", path.stem)
        assert diagnoses.verdict(choice, diagnoses.check(old, path.stem)) == \
            diagnoses.verdict(choice, diagnoses.check(d, path.stem))


ADVICE = Advice(best_k=2, plain_better=True, plain_tokens_per_s=20.0, baseline_step_tokens_per_s=10.0)


def names(faster: list[Option]) -> list[str]:
    return [o.name for o in faster]


def test_plain_decoding_wins_and_a_k_never_goes_before_it():
    findings = [finding("sampling filters", CAUSE, wall=(8.0, 9.0, (0.5, 1.5))),
                finding("draft depth", TUNING, step=(10.0, 25.0, (12.0, 18.0))),  # measured faster than plain
                finding("drafter prompt-lookup", ALTERNATIVE, wall=(8.0, 12.0, (2.0, 6.0)))]
    faster = verdict(findings, ADVICE, 20)
    assert names(faster) == [PLAIN, "draft depth", "drafter prompt-lookup", "sampling filters"]
    assert faster[0].speedup == 2.0 and faster[0].interval is None
    assert_consistent(faster, options(findings, ADVICE, 20), ADVICE)
    # the advisor's plain decoding beats every K but not these cycles: no K is recommended at all
    slow_plain = replace(ADVICE, plain_tokens_per_s=9.0)
    assert names(verdict(findings, slow_plain, 20)) == ["drafter prompt-lookup", "sampling filters"]


def test_another_drafter_wins():
    findings = [finding("draft depth", TUNING, step=(10.0, 12.0, (1.0, 3.0))),
                finding("drafter prompt-lookup", ALTERNATIVE, wall=(8.0, 24.0, (12.0, 20.0)))]
    faster = verdict(findings, ADVICE, 20)
    assert names(faster) == ["drafter prompt-lookup", PLAIN, "draft depth"]
    assert_consistent(faster, options(findings, ADVICE, 20), ADVICE)


def test_a_cause_wins():
    advice = replace(ADVICE, plain_better=False, plain_tokens_per_s=6.0)
    findings = [finding("chat template", CAUSE, wall=(8.0, 20.0, (10.0, 14.0))),
                finding("draft depth", TUNING, step=(10.0, 12.0, (1.0, 3.0))),
                finding("context length", PROPERTY, wall=(8.0, 30.0, (20.0, 24.0)))]  # not a change to make
    faster = verdict(findings, advice, 20)
    assert names(faster) == ["chat template", "draft depth"]
    assert_consistent(faster, options(findings, advice, 20), advice)


def test_a_k_wins_where_the_advisor_says_it_beats_plain_decoding():
    advice = replace(ADVICE, plain_better=False, plain_tokens_per_s=15.0)
    findings = [finding("sampling filters", CAUSE, wall=(8.0, 9.0, (0.5, 1.5))),
                finding("draft depth", TUNING, step=(10.0, 21.0, (9.0, 13.0))),
                finding("drafter prompt-lookup", ALTERNATIVE, wall=(8.0, 7.0, (-2.0, -0.5)))]
    faster = verdict(findings, advice, 20)
    assert names(faster) == ["draft depth", "sampling filters"]  # plain decoding (x1.5) is not the advisor's pick
    assert_consistent(faster, options(findings, advice, 20), advice)
    every = {o.name: o for o in options(findings, advice, 20)}
    assert not every[PLAIN].faster and not every["drafter prompt-lookup"].faster


def random_speed(rng: random.Random) -> tuple[float, float, tuple[float, float]] | None:
    if rng.random() < 0.1:
        return None
    base = rng.uniform(1, 100)
    variant = base * rng.uniform(0.3, 3.0)
    spread = abs(variant - base) * rng.uniform(0.1, 2.0) + rng.uniform(0, 1)
    d = variant - base
    return base, variant, (d - spread * rng.uniform(0.2, 1.0), d + spread * rng.uniform(0.2, 1.0))


def random_case(rng: random.Random) -> tuple[list[dict], Advice | None]:
    findings = []
    for i in range(rng.randint(0, 7)):
        kind = rng.choice([CAUSE, TUNING, ALTERNATIVE, PROPERTY])
        speed = random_speed(rng)
        skipped = "not here" if rng.random() < 0.1 else None
        findings.append(finding(f"{kind} {i}", kind, wall=speed if kind != TUNING else random_speed(rng),
                                step=speed if kind == TUNING else None, skipped=skipped))
    advice = None if rng.random() < 0.15 else Advice(rng.randint(1, 6), rng.random() < 0.6, rng.uniform(1, 100),
                                                     None if rng.random() < 0.1 else rng.uniform(1, 100))
    return findings, advice


def test_generated_verdicts_never_contradict_their_advisor():
    rng = random.Random(7)
    seen = set()
    for _ in range(3000):
        findings, advice = random_case(rng)
        faster = verdict(findings, advice, 20)
        assert_consistent(faster, options(findings, advice, 20), advice)
        if faster:
            seen.add((faster[0].kind, advice is not None and advice.plain_better))
    # every kind of winner came up, with and without the advisor preferring plain decoding
    assert {(PLAIN, True), (ALTERNATIVE, True), (CAUSE, True), (TUNING, False), (ALTERNATIVE, False),
            (CAUSE, False)} <= seen
