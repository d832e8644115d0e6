"""A diagnosis's verdict: what to change first, ranked by the tokens/s each change gives on this machine.

Every change is set against the baseline on one clock, so that its gain is a ratio of like with like:
- a cause (the chat template, the sampling filters) and another drafter: the wall-clock tokens/s of the
  paired, interleaved runs;
- K: tokens/s of the cycles on the baseline's calibrated step times (report.py says why not the wall clock);
- plain decoding: the K advisor's own figure, one target step a token on the same calibration, against the
  baseline's cycles on those step times. It is not an arm: the advisor predicts it from measured step times.

A change is recommended when it is faster: a measured one when its interval lies above zero, plain decoding
when the advisor says it beats every K and it beats the baseline's cycles. The recommended changes are ranked
by that ratio, the largest first, except that no K goes before plain decoding when the advisor says plain
decoding beats every K: a K measured faster than that goes right after it (and where plain decoding does
not beat the baseline's cycles, no K is recommended at all).

Reads findings as the diagnosis file holds them (report.py as_dict), so the app ranks an old file the same way.
"""
from dataclasses import dataclass

from engine.diagnose.experiments import ALTERNATIVE, CAUSE, TUNING
from engine.diagnose.paired import counts_of, step_tokens_per_s
from engine.stats.timings import calibration_of
from engine.workload.requests import RequestRun
from engine.workload.stats import workload_stats

PLAIN = "plain decoding"  # an option's name and kind when the option is to stop speculating
WALL, STEP = "wall clock", "step times"  # the clock an option's tokens/s are on
CLOCK_WORDS = {WALL: "wall-clock tokens/s", STEP: "tokens/s on this machine's step times"}
CHANGES = (CAUSE, TUNING, ALTERNATIVE)  # the kinds that are changes to make (a property is not)


@dataclass(frozen=True)
class Advice:
    """The K advisor on the baseline's pooled acceptance and this machine's calibration."""

    best_k: int  # the fastest K of 1 and more it predicts
    plain_better: bool  # whether it predicts plain decoding faster than every K
    plain_tokens_per_s: float  # plain decoding on the calibration: 1 / the target's step time
    baseline_step_tokens_per_s: float | None  # the baseline's cycles on the same step times


@dataclass(frozen=True)
class Option:
    """One change, with the tokens/s the baseline and the change give on one clock."""

    name: str  # the experiment's name, or PLAIN
    kind: str  # the experiment's kind, or PLAIN
    now: str  # what the baseline does, in words ("" for plain decoding)
    change: str  # what the change does, in words
    clock: str  # WALL or STEP
    baseline: float  # tokens/s
    variant: float  # tokens/s; plain decoding's is predicted from the step times
    interval: tuple[float, float] | None  # of variant - baseline; None for plain decoding (no arm)
    joint: int  # comparisons the interval holds jointly with
    requests: int
    faster: bool  # measured faster (interval above 0), or, for plain decoding, the advisor's verdict

    @property
    def speedup(self) -> float:
        return self.variant / self.baseline


def advisor(runs: list[RequestRun]) -> Advice | None:
    """The advice on these runs (engine/workload/stats.py's pooled figures, the first calibration among
    them); None where they carry no calibration or no K to advise."""
    overall = workload_stats(runs, bootstrap_samples=0)["overall"] if runs else {}
    if overall.get("best_k") is None:
        return None
    cal = next(c for c in (calibration_of(r.trace.header) for r in runs) if c)
    return Advice(overall["best_k"], overall["advised_k"] == 0, 1.0 / cal.target_step_s,
                  step_tokens_per_s([counts_of(r) for r in runs]))


def measured_option(f: dict) -> Option | None:
    """A finding (report.py as_dict's form) as a change, with its tokens/s on its kind's clock; None for
    what is not a change, did not run, or has no tokens/s to compare."""
    if f["kind"] not in CHANGES or f["skipped"] or f["error"]:
        return None
    clock = STEP if f["kind"] == TUNING else WALL
    e = f["step_tokens_per_s" if clock == STEP else "tokens_per_s"]
    if e is None or e["difference"] is None or not e["baseline"] or e["baseline"] <= 0 or e["variant"] is None:
        return None
    iv = None if e["interval"] is None else tuple(e["interval"])
    return Option(f["experiment"], f["kind"], f["now"], f["change"], clock, e["baseline"], e["variant"], iv,
                  e.get("joint", 1), f["requests"], iv is not None and iv[0] > 0 and e["variant"] > e["baseline"])


def plain_option(advice: Advice | None, requests: int) -> Option | None:
    """Plain decoding against the baseline's cycles, both on the calibrated step times."""
    if advice is None or not advice.baseline_step_tokens_per_s:
        return None
    b, v = advice.baseline_step_tokens_per_s, advice.plain_tokens_per_s
    return Option(PLAIN, PLAIN, "", "with the target alone", STEP, b, v, None, 1, requests,
                  advice.plain_better and v > b)


def options(findings: list[dict], advice: Advice | None, requests: int) -> list[Option]:
    """Every change measured, plain decoding first (where there is advice), then the findings' order."""
    found = [plain_option(advice, requests), *(measured_option(f) for f in findings)]
    return [o for o in found if o is not None]


def verdict(findings: list[dict], advice: Advice | None, requests: int) -> list[Option]:
    """The changes that are faster, the fastest first; no K before plain decoding where the advisor
    says plain decoding beats every K. Empty: nothing tried is faster by what these requests can tell."""
    ranked = sorted((o for o in options(findings, advice, requests) if o.faster), key=lambda o: -o.speedup)
    if advice is None or not advice.plain_better:
        return ranked
    plain = next((i for i, o in enumerate(ranked) if o.kind == PLAIN), None)
    if plain is None:  # the advisor's plain decoding beats every K, yet not these cycles: recommend no K
        return [o for o in ranked if o.kind != TUNING]
    early = [o for o in ranked[:plain] if o.kind == TUNING]  # measured faster than the advisor's plain decoding
    rest = [o for o in ranked if o not in early]
    at = rest.index(ranked[plain]) + 1
    return rest[:at] + early + rest[at:]


def basis_words(o: Option, digits: int = 1) -> str:
    """What an option's figure rests on: its difference and interval, or the advisor's prediction."""
    if o.interval is None:
        return "the K advisor's figure: one target step a token" + (", faster than every K" if o.faster else "")
    name = "95% joint interval" if o.joint > 1 else "95% interval"
    return f"{o.variant - o.baseline:+.{digits}f}, {name} {o.interval[0]:+.{digits}f} to {o.interval[1]:+.{digits}f}"


def option_words(o: Option, digits: int = 1) -> str:
    """`name: now: <clock> a -> b change (x ratio, over n requests; basis)`: the figures it is ranked by."""
    return (f"{o.name}: " + (f"{o.now}: " if o.now else "") + f"{CLOCK_WORDS[o.clock]} {o.baseline:.{digits}f} -> "
            f"{o.variant:.{digits}f} {o.change} (x{o.speedup:.2f}, over {o.requests} requests; {basis_words(o, digits)})")
