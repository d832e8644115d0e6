"""engine/stats/repeats.py on hand-made numbers: median, spread, the 30% refusal, and the words."""
import pytest

from engine.stats.repeats import MAX_SPREAD, Repeated, disagreement_words, repeat_timed


def test_median_and_interquartile_spread():
    r = Repeated((1.0, 1.1, 0.9, 1.0, 5.0, 1.05, 0.95))  # one outlier: the spread ignores it
    assert r.median_s == 1.0
    assert r.low_s == pytest.approx(0.975) and r.high_s == pytest.approx(1.075)
    assert r.spread == pytest.approx(0.1) and r.trustworthy
    assert "1000.00 ms" in r.describe() and "7 repeats" in r.describe()


def test_repeats_that_disagree_are_not_trusted():
    assert MAX_SPREAD == 0.30
    assert not Repeated((1.0, 2.0, 3.0, 1.2, 2.5)).trustworthy
    assert not Repeated((1.0, 1.0)).trustworthy  # too few to judge
    few = Repeated((1.0, 1.2, 1.1))  # under four: the full range counts
    assert few.spread == pytest.approx(0.2 / 1.1) and few.trustworthy


def test_repeat_timed_warms_up_then_times_each_repeat():
    calls = []
    r = repeat_timed(lambda: calls.append(1), repeats=5, warmup=2)
    assert len(calls) == 7 and len(r.times_s) == 5 and all(t >= 0 for t in r.times_s)


def test_disagreement_is_said_only_beyond_the_noise():
    assert disagreement_words("x", 1.10, 1.0, 0.2) is None
    words = disagreement_words("Refined prediction", 2.0, 1.0, 0.2)
    assert words.startswith("Refined prediction: the prediction (2.00) is 100% above the measurement (1.00)")
    assert "below" in disagreement_words("x", 0.5, 1.0, 0.1)
    assert disagreement_words("x", 1.04, 1.0, 0.0) is None  # 5% is always allowed as noise
