"""A diagnosis's findings: each experiment's effect against the baseline, ranked, in plain words.

Ranked: first the causes (a setting of this drafter: the chat template, the sampling filters): those
that raise acceptance, the largest gain first; then those with no effect found (the interval includes
zero); then those set right already (changing them lowered acceptance). Then K, judged by tokens/s on
the calibrated step times: it is tuned once the causes are fixed, since the best K depends on the
acceptance they change. Then the alternatives (another drafter), the largest gain in tokens/s first;
then what describes the pair rather than a setting (temperature, context length); then what could
not run and why. What to change first is not this order but the verdict (verdict.py): every change
ranked by the tokens/s it gives on this machine, plain decoding included.
"""
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from engine.diagnose.experiments import ALTERNATIVE, CAUSE, PROPERTY, TUNING, Experiment
from engine.diagnose.paired import Effect, RequestCounts, paired_effect
from engine.diagnose.verdict import Advice, option_words, verdict

if TYPE_CHECKING:  # run.py loads the models' code: the app words a file's findings without it
    from engine.diagnose.run import ArmResult

KINDS = (CAUSE, TUNING, ALTERNATIVE, PROPERTY)
GAIN, NO_EFFECT, LOSS = 0, 1, 2  # how a measured effect stands, in the order the report lists them


def standing(e: Effect | None) -> int | None:
    """GAIN, NO_EFFECT or LOSS for a measured effect (the change helps, cannot be told, hurts); None if unmeasured."""
    if e is None or e.difference is None:
        return None
    return NO_EFFECT if not e.found else GAIN if e.difference > 0 else LOSS


@dataclass(frozen=True)
class Finding:
    experiment: Experiment
    folder: str | None = None  # the arm's workload folder: the traces behind the figures
    acceptance: Effect | None = None
    speed: Effect | None = None  # wall-clock tokens/s (the arms ran interleaved, request by request)
    requests: int = 0  # compared: finished in both arms
    error: str | None = None
    step_speed: Effect | None = None  # tokens/s of the cycles on the calibrated step times

    @property
    def judged_by(self) -> Effect | None:
        """The effect an experiment of its kind is ranked and worded by."""
        kind = self.experiment.kind
        return self.step_speed if kind == TUNING else self.speed if kind == ALTERNATIVE else self.acceptance

    @property
    def rank_key(self) -> tuple:
        e, stand = self.judged_by, standing(self.judged_by)
        return (KINDS.index(self.experiment.kind), stand is None, stand or 0, -(e.difference if stand is not None else 0.0))

    def verdict(self) -> str:
        x = self.experiment
        if x.skipped:
            return f"{x.name}: not run here ({x.skipped})"
        if self.error:
            return f"{x.name}: could not run ({self.error})"
        e, s = self.acceptance, self.speed
        if e is None or e.difference is None:
            return f"{x.name}: nothing to compare (no drafted tokens in one of the arms)"
        judged, stand = self.judged_by, standing(self.judged_by)
        if judged is None or stand is None:
            return f"{x.name}: nothing to compare (no step times in one of the arms)"
        if judged is e:
            main = f"acceptance {e.baseline:.2f} -> {e.variant:.2f} {x.change}"
            interval = f"{e.difference:+.2f}, {e.interval_words(2)}"
            other = f"; wall-clock tokens/s {s.baseline:.1f} -> {s.variant:.1f}" if s and s.difference is not None else ""
        else:
            what = "tokens/s on this machine's step times" if judged is self.step_speed else "wall-clock tokens/s"
            main = f"{what} {judged.baseline:.1f} -> {judged.variant:.1f} {x.change}"
            interval = f"{judged.difference:+.1f}, {judged.interval_words(1)}"
            other = f"; acceptance {e.baseline:.2f} -> {e.variant:.2f}"
            if judged is self.step_speed and s is not None and s.difference is not None:
                other += f"; wall-clock tokens/s {s.baseline:.1f} -> {s.variant:.1f}"
        if stand == NO_EFFECT:
            return f"{x.name}: no effect found ({x.now}: {main}, {interval}: includes 0){other}"
        right = "set right already: " if stand == LOSS and x.kind in (CAUSE, TUNING) else ""
        return f"{x.name}: {right}{x.now}: {main} ({interval}){other}"


def common(a: list[RequestCounts], b: list[RequestCounts]) -> tuple[list[RequestCounts], list[RequestCounts]]:
    """The requests both arms finished, in the prompt file's order (an arm may skip a request too long)."""
    ids = {r.id for r in a} & {r.id for r in b}
    return [r for r in a if r.id in ids], [r for r in b if r.id in ids]


def finding(experiment: Experiment, baseline: list[RequestCounts], result: "ArmResult | None", seed: int = 0,
            joint: int = 1) -> Finding:
    if result is None:
        return Finding(experiment)
    if result.error:
        return Finding(experiment, str(result.folder), error=result.error)
    a, b = common(baseline, result.counts)
    if not a:
        return Finding(experiment, str(result.folder), error="no request finished in both arms")
    effect = {m: paired_effect(m, a, b, seed=seed, joint=joint) for m in ("acceptance_rate", "tokens_per_s",
                                                                          "step_tokens_per_s")}
    return Finding(experiment, str(result.folder), effect["acceptance_rate"], effect["tokens_per_s"], len(a),
                   step_speed=effect["step_tokens_per_s"])


def ranked(findings: list[Finding]) -> list[Finding]:
    """Causes, K, other drafters, properties; in each, gains (the largest first), no effect, losses."""
    return sorted(findings, key=lambda f: f.rank_key)


def as_dict(f: Finding) -> dict:
    x = f.experiment
    return {"experiment": x.name, "arm": x.arm.name if x.arm else None, "kind": x.kind, "now": x.now,
            "change": x.change, "skipped": x.skipped or None,
            "error": f.error, "folder": f.folder, "requests": f.requests,
            "acceptance_rate": None if f.acceptance is None else asdict(f.acceptance) | {"found": f.acceptance.found},
            "tokens_per_s": None if f.speed is None else asdict(f.speed) | {"found": f.speed.found},
            "step_tokens_per_s": None if f.step_speed is None else asdict(f.step_speed) | {"found": f.step_speed.found},
            "verdict": f.verdict()}


def effect_of(d: dict | None) -> Effect | None:
    """An effect as as_dict wrote it (`found` is recomputed from the interval)."""
    if d is None:
        return None
    interval = None if d["interval"] is None else tuple(d["interval"])
    return Effect(d["measure"], d["baseline"], d["variant"], d["difference"], interval, d.get("joint", 1))


def finding_of(d: dict) -> Finding:
    """A finding as as_dict wrote it, to be worded again from its numbers (its arm is not needed)."""
    x = Experiment(d["experiment"], d["kind"], d["now"], d["change"], None, d["skipped"] or "")
    return Finding(x, d.get("folder"), effect_of(d["acceptance_rate"]), effect_of(d["tokens_per_s"]),
                   d["requests"], d["error"], effect_of(d.get("step_tokens_per_s")))


SECTIONS = {CAUSE: "CAUSES, LARGEST GAIN IN ACCEPTANCE FIRST (each a paired run of the same requests and seeds)",
            TUNING: "DRAFT DEPTH, BY TOKENS/S ON THIS MACHINE'S STEP TIMES (tune K once the causes above are fixed)",
            ALTERNATIVE: "OTHER DRAFTERS, LARGEST GAIN IN TOKENS/S FIRST",
            PROPERTY: "WHAT THE PAIR DOES (not settings to change)"}


def format_verdict(findings: list[Finding], advice: Advice | None, requests: int) -> list[str]:
    """What to change, the fastest first (verdict.py), each with the figures it is ranked by."""
    faster = verdict([as_dict(f) for f in findings], advice, requests)
    if not faster:
        return ["FIRST TO CHANGE: nothing tried here was faster by what these requests can tell; keep these settings"]
    return ([f"FIRST TO CHANGE: {option_words(faster[0])}", "",
             "WHAT TO CHANGE, FASTEST FIRST (tokens/s against the baseline's on the same clock)"]
            + [f"  {i}. {option_words(o)}" for i, o in enumerate(faster, 1)])


def format_findings(findings: list[Finding], advice: Advice | None = None, requests: int = 0) -> str:
    ran = [f for f in findings if not f.experiment.skipped and not f.error]
    lines = format_verdict(findings, advice, requests) + [""]
    for kind, title in SECTIONS.items():
        these = [f for f in ran if f.experiment.kind == kind]
        if these or kind == CAUSE:
            lines += ([""] if lines[-1] else []) + [title]
            lines += [f"  {i}. {f.verdict()}" + (f"\n     traces: {f.folder}" if f.folder else "")
                      for i, f in enumerate(these, 1)] or ["  (none ran)"]
    rest = [f for f in findings if f.experiment.skipped or f.error]
    if rest:
        lines += ["", "NOT RUN"] + [f"  - {f.verdict()}" for f in rest]
    return "\n".join(lines)
