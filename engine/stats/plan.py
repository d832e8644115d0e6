"""K for a run about to start, chosen on this machine: K = 0 (decode plainly) included.

The advisor (analysis.advise_k) needs alpha, the draft step, the target's verify-cost curve and
what a cycle costs beyond its forwards. The curve and the draft step come from a calibration on the
loaded pair (for the fast path, of its own forwards: engine/stats/fast_calibrate.py); alpha and the
per-cycle overhead come from a short pilot on the path the run takes: the first PILOT_TOKENS tokens
of the same prompt at the requested K, whose output is thrown away (the run itself starts again
from the prompt with the same seed). Where even the best K is predicted slower than plain
decoding, the plan is K = 0, with the numbers that say why.

A pilot of 16 tokens measures alpha to about +-0.1, and near the break-even point that is the
difference between a K that wins and one that loses: on the compiled fast path with the int4-a8 chat
target (AMD EPYC, bench/results/fast-advisor-chat-int4-a8-*), pilots that saw alpha 0.40-0.57 predicted
K=3 at 1.16-1.21x plain decoding, and the runs at K=3 went at 0.84-0.89x. So a K is chosen only if it
still beats plain decoding at alpha one standard error below the pilot's (ALPHA_MARGIN): plain
decoding cannot lose to itself, and a K that wins only on the pilot's luck is no advice.
"""
from dataclasses import dataclass, replace

from engine.config import SpecSettings
from engine.cycle.fast import fast_generate
from engine.cycle.pair import Pair
from engine.cycle.reference import speculative_generate
from engine.stats.analysis import (
    NO_OVERHEAD,
    PLAIN,
    CycleOverhead,
    KAdvice,
    advice_sentence,
    advise_k,
    advised_k,
    advisor_ks,
    alpha_standard_error,
    best_k,
    calibration_of,
    cycle_times,
    measured_alpha,
    overhead_of,
)
from engine.stats.fast_calibrate import FastForwards

PILOT_TOKENS = 16  # about 8 cycles at the presets' acceptance: alpha to within about +-0.15
ALPHA_MARGIN = 1.0  # standard errors below the pilot's alpha at which a chosen K must still beat plain decoding


@dataclass(frozen=True)
class KPlan:
    k: int  # what to run: 0 = plain decoding
    requested_k: int  # the K the user set (and the pilot ran at)
    alpha: float  # measured by the pilot
    pilot_tokens: int
    best: KAdvice  # the best speculative K at the pilot's alpha: with k = 0, the measured reason
    sentence: str  # the advisor's words
    alpha_error: float = 0.0  # the pilot's alpha's standard error (analysis.alpha_standard_error)

    @property
    def plain(self) -> bool:
        return self.k == 0


def plan_from(alpha: float, calibration: dict, requested_k: int, pilot_tokens: int,
              overhead: CycleOverhead = NO_OVERHEAD, alpha_error: float = 0.0) -> KPlan:
    """The advisor's choice for a measured alpha (known to +- alpha_error) and per-cycle overhead, and a
    calibration as a header stores it: the K predicted fastest at alpha among those that still beat plain
    decoding at alpha - ALPHA_MARGIN x alpha_error; K = 0 where none does."""
    cal = calibration_of({"calibration": calibration})
    ks = advisor_ks(cal, requested_k)
    advice = advise_k(alpha, cal.draft_step_s, cal, ks, overhead)
    low = max(0.0, alpha - ALPHA_MARGIN * alpha_error)
    at_low = {a.k: a for a in advise_k(low, cal.draft_step_s, cal, ks, overhead)}
    safe = [a for a in advice if at_low[a.k].refined >= 1.0]
    chosen = advised_k(safe) if safe else PLAIN
    sentence = advice_sentence(advice)
    if chosen.k != advised_k(advice).k:
        sentence = margin_sentence(advice, chosen, at_low, alpha, low)
    return KPlan(chosen.k, requested_k, alpha, pilot_tokens, best_k(advice), sentence, alpha_error)


def margin_sentence(advice: list[KAdvice], chosen: KAdvice, at_low: dict[int, KAdvice], alpha: float,
                    low: float) -> str:
    """Why the plan is not the K predicted fastest at the pilot's alpha: that K loses at the low end."""
    best = advised_k(advice)
    head = (f"At the pilot's alpha {alpha:.2f} K={best.k} is predicted at {best.refined:.2f}x plain decoding, but "
            f"a pilot this short measures alpha only to +-{alpha - low:.2f}, and at {low:.2f} K={best.k} is "
            f"predicted at {at_low[best.k].refined:.2f}x.")
    if chosen.k == 0:
        return f"Decode plainly (K=0): {head} No K beats plain decoding there, and plain decoding cannot lose."
    return (f"K = {chosen.k}: {head} K={chosen.k} still beats plain decoding there ({at_low[chosen.k].refined:.2f}x; "
            f"{chosen.refined:.2f}x at {alpha:.2f}).")


def pilot_settings(s: SpecSettings, tokens: int = PILOT_TOKENS) -> SpecSettings:
    """The pilot's settings: the run's, for its first `tokens` tokens."""
    return replace(s, max_new_tokens=min(tokens, s.max_new_tokens))


def pilot_cycles(pair: Pair, prompt_ids: list[int], s: SpecSettings, tokens: int = PILOT_TOKENS) -> list[dict]:
    """The cycles of the first `tokens` tokens at the settings' K (nothing is written)."""
    return list(speculative_generate(pair, prompt_ids, pilot_settings(s, tokens)))


def plan_from_pilot(cycles: list[dict], calibration: dict, requested_k: int, tokens: int) -> KPlan:
    """The advisor's choice from a pilot's cycles (alpha and the per-cycle overhead) and a calibration."""
    return plan_from(measured_alpha(cycles), calibration, requested_k, tokens, overhead_of(cycles, cycle_times(cycles)),
                     alpha_standard_error(cycles))


def plan_k(pair: Pair, prompt_ids: list[int], s: SpecSettings, calibration: dict,
           tokens: int = PILOT_TOKENS) -> KPlan:
    return plan_from_pilot(pilot_cycles(pair, prompt_ids, s, tokens), calibration, s.k, tokens)


def plan_k_fast(pair: Pair, prompt_ids: list[int], s: SpecSettings, calibration: dict, forwards: FastForwards,
                tokens: int = PILOT_TOKENS) -> KPlan:
    """plan_k on the fast path: the pilot runs on the forwards the calibration timed (engine/stats/fast_calibrate.py)."""
    pilot = pilot_settings(s, tokens)
    cycles = list(fast_generate(pair, prompt_ids, pilot, True, forwards.capture, forwards.models_for(s.k)))
    return plan_from_pilot(cycles, calibration, s.k, pilot.max_new_tokens)
