"""Run one prompt at several K and measure speed and acceptance at each.

The K advisor predicts speedup against K from one trace; a sweep checks those
predictions on the same machine: plain target decoding once, then one speculative run
per K with the same prompt, settings and seed. Speeds count decoding only (the sum of
cycle times, or the timed plain-decoding loop), so prefill is left out of both sides.
"""
import statistics
from dataclasses import dataclass, replace
from typing import Callable

from engine.config import SpecSettings
from engine.cycle.pair import Pair
from engine.cycle.plain import decode_plain, target_step
from engine.cycle.reference import speculative_generate
from engine.kv.ops import prefill
from engine.models.device import timed
from engine.models.loading import LoadedModel
from engine.stats.analysis import Calibration, advise_k, calibration_of, measured_alpha
from engine.stats.calibrate import DEFAULT_MAX_POSITIONS, calibrate
from engine.trace.metrics import decoding_tokens_per_s, trace_acceptance

Progress = Callable[[float, str], None]  # (fraction done, what is running)


@dataclass(frozen=True)
class SweepPoint:
    k: int
    cycles: int
    tokens: int
    decode_s: float
    tokens_per_s: float
    alpha: float  # mean recorded beta of this run
    acceptance_rate: float
    mean_acceptance_length: float
    draft_step_s: float  # median draft step time of this run (as c is defined)


@dataclass(frozen=True)
class SweepResult:
    points: list[SweepPoint]
    plain_tokens_per_s: float  # the target alone, one token per step
    calibration: dict  # engine.stats.calibrate.calibrate() output

    @property
    def alpha(self) -> float:
        """Alpha over all runs together, weighted by drafted positions."""
        drafted = [p.k * p.cycles for p in self.points]
        return sum(p.alpha * d for p, d in zip(self.points, drafted)) / sum(drafted)

    @property
    def draft_step_s(self) -> float:
        return sum(p.draft_step_s for p in self.points) / len(self.points)

    def cal(self) -> Calibration:
        return calibration_of({"calibration": self.calibration})

    def predicted_tokens_per_s(self) -> dict[str, list[float]]:
        """Tokens/s each formula predicts at each swept K, from the pooled alpha and draft step."""
        advice = advise_k(self.alpha, self.draft_step_s, self.cal(), [p.k for p in self.points])
        plain = 1 / self.cal().target_step_s
        return {"leviathan": [a.leviathan * plain for a in advice],
                "refined": [a.refined * plain for a in advice],
                "mean_acceptance_length": [a.expected_tokens for a in advice]}


def plain_decode(target: LoadedModel, prompt_ids: list[int], s: SpecSettings,
                 eos_ids: set[int]) -> tuple[int, float]:
    """The target alone (target_generate's loop): tokens made and seconds, prefill not timed."""
    step = target_step(target, prefill(target, prompt_ids), s)
    tokens, seconds = timed(lambda: decode_plain(step, prompt_ids[-1], s.max_new_tokens, lambda t: t in eos_ids))
    return len(tokens), seconds


def run_point(pair: Pair, prompt_ids: list[int], s: SpecSettings) -> SweepPoint:
    cycles = list(speculative_generate(pair, prompt_ids, s))
    decode_s = sum(c["cycle_time_s"] for c in cycles)
    tokens = sum(len(c["committed_token_ids"]) for c in cycles)
    m = trace_acceptance(cycles, s.k)  # the trace's own definition: a lookup that found nothing is no draft
    steps = [t for c in cycles for t in c["draft_step_times_s"]]
    return SweepPoint(s.k, len(cycles), tokens, decode_s, decoding_tokens_per_s(cycles), measured_alpha(cycles),
                      m["acceptance_rate"], m["mean_acceptance_length"], statistics.median(steps))


def k_sweep(pair: Pair, prompt_ids: list[int], s: SpecSettings, ks: list[int],
            on_progress: Progress | None = None) -> SweepResult:
    """Calibrate, decode plainly once, then run every K in `ks` with otherwise equal settings."""
    if not ks:
        raise ValueError("choose at least one K to sweep")
    report = on_progress or (lambda fraction, text: None)
    steps = len(ks) + 2
    report(0.0, "timing single steps and verify widths")
    cal = calibrate(pair, prompt_ids, s, max_positions=max(DEFAULT_MAX_POSITIONS, max(ks) + 1))
    report(1 / steps, "plain target decoding")
    count, seconds = plain_decode(pair.target, prompt_ids, s, pair.eos_ids)
    points = []
    for i, k in enumerate(ks):
        report((i + 2) / steps, f"speculative decoding at K={k}")
        points.append(run_point(pair, prompt_ids, replace(s, k=k)))
    report(1.0, "done")
    return SweepResult(points, count / seconds, cal)
