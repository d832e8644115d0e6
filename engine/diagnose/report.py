"""A diagnosis's findings: each experiment's effect against the baseline, ranked, in plain words.

Ranked: the causes (a setting of this drafter: the chat template, the sampling filters, K), the
largest gain in acceptance first; an effect whose interval includes zero says "no effect found".
Then the alternatives (another drafter), the largest gain in tokens/s first; then what describes
the pair rather than a setting (temperature, context length); then what could not run and why.
"""
from dataclasses import asdict, dataclass

from engine.diagnose.experiments import ALTERNATIVE, CAUSE, PROPERTY, Experiment
from engine.diagnose.paired import Effect, RequestCounts, paired_effect
from engine.diagnose.run import ArmResult

KINDS = (CAUSE, ALTERNATIVE, PROPERTY)


@dataclass(frozen=True)
class Finding:
    experiment: Experiment
    folder: str | None = None  # the arm's workload folder: the traces behind the figures
    acceptance: Effect | None = None
    speed: Effect | None = None
    requests: int = 0  # compared: finished in both arms
    error: str | None = None

    @property
    def rank_key(self) -> tuple:
        kind = self.experiment.kind
        e = self.speed if kind == ALTERNATIVE else self.acceptance  # what an experiment of its kind is ranked by
        measured = e is not None and e.difference is not None
        return (KINDS.index(kind), not measured, not (measured and e.found), -(e.difference if measured else 0.0))

    def verdict(self) -> str:
        x = self.experiment
        if x.skipped:
            return f"{x.name}: not run here ({x.skipped})"
        if self.error:
            return f"{x.name}: could not run ({self.error})"
        e, s = self.acceptance, self.speed
        if e is None or e.difference is None:
            return f"{x.name}: nothing to compare (no drafted tokens in one of the arms)"
        if x.kind == ALTERNATIVE and s is not None and s.difference is not None:  # judged by speed
            main = f"tokens/s {s.baseline:.1f} -> {s.variant:.1f} {x.change}"
            interval = f"{s.difference:+.1f}, 95% interval {s.interval[0]:+.1f} to {s.interval[1]:+.1f}"
            other, found = f"; acceptance {e.baseline:.2f} -> {e.variant:.2f}", s.found
        else:
            main = f"acceptance {e.baseline:.2f} -> {e.variant:.2f} {x.change}"
            interval = f"{e.difference:+.2f}, 95% interval {e.interval[0]:+.2f} to {e.interval[1]:+.2f}"
            other = f"; tokens/s {s.baseline:.1f} -> {s.variant:.1f}" if s and s.difference is not None else ""
            found = e.found
        if not found:
            return f"{x.name}: no effect found ({x.now}: {main}, {interval}: includes 0){other}"
        return f"{x.name}: {x.now}: {main} ({interval}){other}"


def common(a: list[RequestCounts], b: list[RequestCounts]) -> tuple[list[RequestCounts], list[RequestCounts]]:
    """The requests both arms finished, in the prompt file's order (an arm may skip a request too long)."""
    ids = {r.id for r in a} & {r.id for r in b}
    return [r for r in a if r.id in ids], [r for r in b if r.id in ids]


def finding(experiment: Experiment, baseline: list[RequestCounts], result: ArmResult | None, seed: int = 0) -> Finding:
    if result is None:
        return Finding(experiment)
    if result.error:
        return Finding(experiment, str(result.folder), error=result.error)
    a, b = common(baseline, result.counts)
    if not a:
        return Finding(experiment, str(result.folder), error="no request finished in both arms")
    return Finding(experiment, str(result.folder), paired_effect("acceptance_rate", a, b, seed=seed),
                   paired_effect("tokens_per_s", a, b, seed=seed), len(a))


def ranked(findings: list[Finding]) -> list[Finding]:
    """Causes first, measured before not, found before not, the largest gain first."""
    return sorted(findings, key=lambda f: f.rank_key)


def as_dict(f: Finding) -> dict:
    x = f.experiment
    return {"experiment": x.name, "arm": x.arm.name if x.arm else None, "kind": x.kind, "now": x.now,
            "change": x.change, "skipped": x.skipped or None,
            "error": f.error, "folder": f.folder, "requests": f.requests,
            "acceptance_rate": None if f.acceptance is None else asdict(f.acceptance) | {"found": f.acceptance.found},
            "tokens_per_s": None if f.speed is None else asdict(f.speed) | {"found": f.speed.found},
            "verdict": f.verdict()}


SECTIONS = {CAUSE: "CAUSES, LARGEST GAIN IN ACCEPTANCE FIRST (each a paired run of the same requests and seeds)",
            ALTERNATIVE: "OTHER DRAFTERS, LARGEST GAIN IN TOKENS/S FIRST",
            PROPERTY: "WHAT THE PAIR DOES (not settings to change)"}


def format_findings(findings: list[Finding]) -> str:
    ran = [f for f in findings if not f.experiment.skipped and not f.error]
    lines = []
    for kind, title in SECTIONS.items():
        these = [f for f in ran if f.experiment.kind == kind]
        if these or kind == CAUSE:
            lines += ([""] if lines else []) + [title]
            lines += [f"  {i}. {f.verdict()}" + (f"\n     traces: {f.folder}" if f.folder else "")
                      for i, f in enumerate(these, 1)] or ["  (none ran)"]
    rest = [f for f in findings if f.experiment.skipped or f.error]
    if rest:
        lines += ["", "NOT RUN"] + [f"  - {f.verdict()}" for f in rest]
    return "\n".join(lines)
