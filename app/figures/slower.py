"""Why a run was slower than plain decoding: the one explanation behind every "Why?" beside a
speedup below 1 (the stepper's note on the open trace; the Workload page's headline and tables).

It splits the measured cycle into what the speed model counts (K draft steps, one verify pass,
both as this run timed them) and the rest, so a prediction far above the measurement (Leviathan's, which counts a verify
pass as one step and nothing else) is explained by the same numbers. Plain text with Markdown
emphasis only; every value is a number.
"""
from dataclasses import dataclass

from engine.stats.analysis import SpeedReport


@dataclass(frozen=True)
class SlowerRun:
    """The measured numbers the explanation reads, from one trace or a pooled group of requests."""

    k: int
    c: float  # one draft step, in target steps
    verify_in_steps: float  # one verify pass over K+1 positions, in target steps (the calibration's)
    leviathan: float  # the speedup Leviathan's formula predicts from alpha, K and c
    measured: float  # the measured speedup at the median cycle
    tokens_per_cycle: float  # tokens committed per cycle: the mean acceptance length
    # this run's own median verify pass, in target steps: the split's (c is this run's too). The calibration's
    # pass over the same positions can be slower (1.58 steps against 1.21 on chat-sampled-k6-hot-low-acceptance):
    # beside this run's draft steps it made the parts add up to more than the cycle they split.
    verify_measured: float | None = None

    @property
    def verify_steps(self) -> float:
        return self.verify_in_steps if self.verify_measured is None else self.verify_measured

    @classmethod
    def of_report(cls, r: SpeedReport, tokens_per_cycle: float) -> "SlowerRun":
        return cls(r.k, r.c, r.verify_in_steps, r.leviathan, r.measured, tokens_per_cycle,
                   r.verify_s / r.target_step_s)

    @classmethod
    def of_speedup(cls, speedup: dict, tokens_per_cycle: float) -> "SlowerRun":
        """From a workload group's "speedup" entry (engine/workload/stats.py)."""
        return cls(speedup["k"], speedup["c"], speedup["verify_in_steps"], speedup["leviathan"],
                   speedup["measured"], tokens_per_cycle, speedup.get("verify_measured"))

    @property
    def cycle_steps(self) -> float:
        """A cycle's measured cost in target steps: the tokens it committed over the speedup they gave."""
        return self.tokens_per_cycle / self.measured if self.measured > 0 else float("inf")


def why_slower(run: SlowerRun) -> str:
    """The reasons, in a few sentences: a cycle's cost against what it committed, and where the cost went."""
    steps, drafting = run.cycle_steps, run.k * run.c
    parts = drafting + run.verify_steps
    text = (f"Plain decoding makes one token per target step. Each cycle cost about {steps:.2f} target steps "
            f"and committed {run.tokens_per_cycle:.2f} tokens on average, so speculation loses here "
            f"({run.measured:.2f}×). K={run.k} draft steps at c = {run.c:.3f} each took {drafting:.2f} of them and "
            f"a verify pass over {run.k + 1} positions took {run.verify_steps:.2f} steps")
    if steps - parts >= 0.005:
        text += (f"; the other {steps - parts:.2f} went to the rest of the cycle (sampling, bookkeeping, the "
                 "draft's catch-up and the caches' rollback)")
    elif parts - steps >= 0.005:  # medians of the parts (and the calibration's verify) need not add up to the cycle's
        text += f"; together {parts:.2f}, a little more than the median cycle, as each is a median of its own"
    text += "."
    if run.leviathan >= 1:
        text += (f" Leviathan's formula counts only the draft steps and one step per verify pass, so it "
                 f"predicts {run.leviathan:.2f}×.")
    return text
