"""engine/teaching/power.py on hand-built distributions: the large-sample power agrees with
seeded simulations of the lab's own test, and the sample count it picks reaches the power."""
import pytest
import torch

from engine.teaching.exactness import chi2_survival
from engine.teaching.power import (
    DEFAULT_SAMPLES,
    LAB_POWER,
    SAMPLE_COUNTS,
    SIGNIFICANCE,
    approximate_power,
    critical_value,
    default_samples,
    samples_for_power,
    simulated_power,
)

ALPHA = 0.01
TARGET = torch.tensor([0.4, 0.3, 0.2, 0.07, 0.03])
SHIFTED = torch.tensor([0.34, 0.3, 0.24, 0.09, 0.03])  # total variation 0.08 from TARGET
# Simulated power from 2000 seeded runs has a standard error of at most 0.011; the large-sample
# law is off by a few hundredths at these sizes. 0.05 is about 4 standard errors plus that.
AGREE = 0.05


@pytest.mark.parametrize("dof", [1, 4, 30])
def test_the_critical_value_has_the_significance_level_above_it(dof):
    assert chi2_survival(critical_value(dof, ALPHA), dof) == pytest.approx(ALPHA, rel=1e-6)


def test_a_correct_rule_is_rejected_only_at_the_significance_level():
    assert approximate_power(TARGET, TARGET, 500, ALPHA) == pytest.approx(ALPHA, rel=1e-6)
    assert simulated_power(TARGET, TARGET, 500, ALPHA, runs=4000) < 3 * ALPHA
    assert samples_for_power(TARGET, TARGET) is None  # no sample count catches what is not wrong


@pytest.mark.parametrize("n", [100, 300, 800])
def test_the_large_sample_power_agrees_with_simulating_the_test(n):
    approx, simulated = approximate_power(SHIFTED, TARGET, n, ALPHA), simulated_power(SHIFTED, TARGET, n, ALPHA)
    assert abs(approx - simulated) < AGREE, (approx, simulated)


def test_power_grows_with_the_samples():
    powers = [approximate_power(SHIFTED, TARGET, n, ALPHA) for n in (50, 100, 200, 400, 800, 1600)]
    assert powers == sorted(powers) and powers[0] < 0.5 < 0.99 < powers[-1]


def test_the_chosen_sample_count_reaches_the_power_and_a_smaller_one_does_not():
    n = samples_for_power(SHIFTED, TARGET, power=0.99, alpha=ALPHA)
    assert approximate_power(SHIFTED, TARGET, n, ALPHA) >= 0.99
    assert approximate_power(SHIFTED, TARGET, int(n * 0.96), ALPHA) < 0.99  # found to within 2%
    assert simulated_power(SHIFTED, TARGET, n, ALPHA) >= 0.99 - AGREE


def test_samples_where_the_target_gives_probability_zero_are_caught():
    """A rule that emits a token the target never would: one such sample is enough."""
    target = torch.tensor([0.5, 0.5, 0.0])
    broken = torch.tensor([0.45, 0.45, 0.1])
    assert approximate_power(broken, target, 60, ALPHA) >= 1 - 0.9 ** 60
    assert simulated_power(broken, target, 60, ALPHA) >= 1 - 0.9 ** 60 - AGREE
    assert samples_for_power(broken, target) == 50  # the smallest count already catches it


def test_the_lab_default_is_the_first_choice_that_reaches_the_power():
    n = default_samples(SHIFTED, TARGET)
    assert n in SAMPLE_COUNTS and approximate_power(SHIFTED, TARGET, n, SIGNIFICANCE) >= LAB_POWER
    smaller = [c for c in SAMPLE_COUNTS if c < n]
    assert smaller and approximate_power(SHIFTED, TARGET, smaller[-1], SIGNIFICANCE) < LAB_POWER
    assert default_samples(TARGET, TARGET) == DEFAULT_SAMPLES  # the correct rule: nothing to catch
    close = torch.tensor([0.39, 0.3, 0.21, 0.07, 0.03])  # caught 13% of the time even at 5000
    assert default_samples(close, TARGET) == SAMPLE_COUNTS[-1]  # the most the lab offers
