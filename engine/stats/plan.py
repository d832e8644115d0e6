"""K for a run about to start, chosen on this machine: K = 0 (decode plainly) included.

The advisor (analysis.advise_k) needs alpha, the draft step, the target's verify-cost curve and
what a cycle costs beyond its forwards. The curve and the draft step come from a calibration on the
loaded pair (for the fast path, of its own forwards: engine/stats/fast_calibrate.py); alpha and the
per-cycle overhead come from a short pilot on the path the run takes: the first PILOT_TOKENS tokens
of the same prompt at the requested K, whose output is thrown away (the run itself starts again
from the prompt with the same seed). Where even the best K is predicted slower than plain
decoding, the plan is K = 0, with the numbers that say why.
"""
from dataclasses import dataclass, replace

from engine.config import SpecSettings
from engine.cycle.fast import fast_generate
from engine.cycle.pair import Pair
from engine.cycle.reference import speculative_generate
from engine.stats.analysis import (
    NO_OVERHEAD,
    CycleOverhead,
    KAdvice,
    advice_sentence,
    advise_k,
    advised_k,
    advisor_ks,
    best_k,
    calibration_of,
    cycle_times,
    measured_alpha,
    overhead_of,
)
from engine.stats.fast_calibrate import FastForwards

PILOT_TOKENS = 16  # about 8 cycles at the presets' acceptance: alpha to within about +-0.15


@dataclass(frozen=True)
class KPlan:
    k: int  # what to run: 0 = plain decoding
    requested_k: int  # the K the user set (and the pilot ran at)
    alpha: float  # measured by the pilot
    pilot_tokens: int
    best: KAdvice  # the best speculative K: with k = 0, the measured reason
    sentence: str  # the advisor's words

    @property
    def plain(self) -> bool:
        return self.k == 0


def plan_from(alpha: float, calibration: dict, requested_k: int, pilot_tokens: int,
              overhead: CycleOverhead = NO_OVERHEAD) -> KPlan:
    """The advisor's choice for a measured alpha (and per-cycle overhead) and a calibration as a header stores it."""
    cal = calibration_of({"calibration": calibration})
    advice = advise_k(alpha, cal.draft_step_s, cal, advisor_ks(cal, requested_k), overhead)
    return KPlan(advised_k(advice).k, requested_k, alpha, pilot_tokens, best_k(advice), advice_sentence(advice))


def pilot_settings(s: SpecSettings, tokens: int = PILOT_TOKENS) -> SpecSettings:
    """The pilot's settings: the run's, for its first `tokens` tokens."""
    return replace(s, max_new_tokens=min(tokens, s.max_new_tokens))


def pilot_cycles(pair: Pair, prompt_ids: list[int], s: SpecSettings, tokens: int = PILOT_TOKENS) -> list[dict]:
    """The cycles of the first `tokens` tokens at the settings' K (nothing is written)."""
    return list(speculative_generate(pair, prompt_ids, pilot_settings(s, tokens)))


def plan_from_pilot(cycles: list[dict], calibration: dict, requested_k: int, tokens: int) -> KPlan:
    """The advisor's choice from a pilot's cycles (alpha and the per-cycle overhead) and a calibration."""
    return plan_from(measured_alpha(cycles), calibration, requested_k, tokens, overhead_of(cycles, cycle_times(cycles)))


def plan_k(pair: Pair, prompt_ids: list[int], s: SpecSettings, calibration: dict,
           tokens: int = PILOT_TOKENS) -> KPlan:
    return plan_from_pilot(pilot_cycles(pair, prompt_ids, s, tokens), calibration, s.k, tokens)


def plan_k_fast(pair: Pair, prompt_ids: list[int], s: SpecSettings, calibration: dict, forwards: FastForwards,
                tokens: int = PILOT_TOKENS) -> KPlan:
    """plan_k on the fast path: the pilot runs on the forwards the calibration timed (engine/stats/fast_calibrate.py)."""
    pilot = pilot_settings(s, tokens)
    cycles = list(fast_generate(pair, prompt_ids, pilot, True, forwards.capture, forwards.models_for(s.k)))
    return plan_from_pilot(cycles, calibration, s.k, pilot.max_new_tokens)
