"""`diagnose`: the baseline, the experiments it leads to, the probe, the draft vocabulary's coverage,
and the ranked findings.

The baseline runs calibrated (the K advisor needs this machine's step times), interleaved request by
request with every experiment that does not depend on it; then the draft-depth experiment, at the K
the advisor picks from the baseline's acceptance. Every arm runs with the baseline's settings and
seed, changing one thing (engine/diagnose/experiments.py).
"""
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

from engine.config import SpecSettings
from engine.diagnose import experiments as ex
from engine.diagnose.paired import acceptance_rate, tokens_per_s
from engine.diagnose.probe import workload_probe
from engine.diagnose.report import Finding, as_dict, finding, format_findings, ranked
from engine.diagnose.run import ArmResult, ArmRun, LoadPair, run_interleaved
from engine.diagnose.trained_length import trained_length_report
from engine.diagnose.verdict import Advice, advisor
from engine.diagnose.vocab import coverage, draft_vocab
from engine.kv.prefix import PrefixReuse
from engine.mode import RunMode
from engine.run import run_to_trace
from engine.trace.schema import DRAFT_MODEL, EAGLE, EAGLE3
from engine.workload.prompts import Request


@dataclass(frozen=True)
class Diagnosis:
    baseline: ArmResult
    findings: list[Finding]
    probe: dict | None
    advice: Advice | None = None  # the K advisor on the baseline: what the verdict weighs plain decoding by
    vocab: dict | None = None  # a head with a reduced vocabulary: how much of the output it can never draft
    trained_length: dict | None = None  # a head that says its trained length: the drafts past it, per arm

    def as_dict(self) -> dict:
        counts = self.baseline.counts
        return {"baseline": {"arm": "baseline", "folder": str(self.baseline.folder), "requests": len(counts),
                             "acceptance_rate": acceptance_rate(counts), "tokens_per_s": tokens_per_s(counts)},
                "advisor": None if self.advice is None else asdict(self.advice),
                "findings": [as_dict(f) for f in self.findings], "probe": self.probe, "draft_vocab": self.vocab,
                "trained_length": self.trained_length}


def advice(baseline: ArmResult) -> Advice | None:
    """The K advisor on the baseline's pooled acceptance and calibration (verdict.py advisor), if it has one."""
    return advisor(baseline.workload.runs()) if baseline.workload else None


def calibration(baseline: ArmResult) -> dict | None:
    runs = baseline.workload.runs() if baseline.workload else []
    return runs[0].trace.header.get("calibration") if runs else None


def warm_up(pair, request: Request, s: SpecSettings, folder: Path) -> None:
    """One short untimed run first: the first calls into each model pay one-off costs (kernels chosen,
    memory mapped) that would otherwise fall on the baseline's first requests and on its tokens/s alone."""
    out = folder / ".warm-up.jsonl"
    run_to_trace(pair, request.text, replace(s, max_new_tokens=min(8, s.max_new_tokens)), out,
                 messages=request.messages)
    out.unlink(missing_ok=True)


def arm_mode(e: ex.Experiment) -> RunMode:
    """How an experiment's arm runs. The context experiment's requests all begin with the same passage,
    so each request reuses the K/V of that start from the previous one (engine/kv/prefix.py), as a
    server with prefix caching would: its prefill would otherwise be most of the diagnosis's time."""
    return RunMode(prefix_reuse=PrefixReuse()) if e.name == ex.CONTEXT else RunMode()


def diagnose(load: LoadPair, base: ex.Arm, requests: list[Request], folder: str | Path, *, has_template: bool,
             has_eagle: bool, context_prefix: str, chat_template: bool = True, preset: str | None = None,
             resume: bool = False, only: set[str] | None = None,
             on_request: Callable[[str], None] | None = None,
             on_cycle: Callable[[dict], None] | None = None, arm_prefix: str = "") -> Diagnosis:
    """Run the baseline and every experiment (those named in `only`, if given) on `requests`, each arm
    a workload folder FOLDER/<arm_prefix><arm name> (the app keeps its arms beside its other workloads)."""
    folder = Path(folder)
    warm_up(load(base.drafter), requests[0], base.settings, folder)
    wanted = [e for e in ex.plan(base, has_template=has_template, has_eagle=has_eagle, prefix=context_prefix,
                                 best_k=None) if e.name != ex.DEPTH and (only is None or e.name in only)]
    first = [ArmRun(base, RunMode(calibrate=True))] + [ArmRun(e.arm, arm_mode(e)) for e in wanted if e.arm]
    common = dict(chat_template=chat_template, preset=preset, resume=resume, on_request=on_request,
                  on_cycle=on_cycle, arm_prefix=arm_prefix)
    results = run_interleaved(load, first, requests, folder, **common)
    baseline = results.pop(base.name)
    if baseline.error:
        raise ValueError(f"the baseline could not run: {baseline.error}")
    advised = advice(baseline)
    best_k, plain_better = (advised.best_k, advised.plain_better) if advised else (None, False)
    depth = ex.depth_experiment(base, best_k, plain_better)
    if depth.arm is not None and (only is None or depth.name in only):
        # K is known only now, from the baseline's acceptance; the depth arm records the baseline's
        # calibration so both arms' cycles are timed on the same step times
        mode = RunMode(calibration=calibration(baseline))
        results |= run_interleaved(load, [ArmRun(depth.arm, mode)], requests, folder, **common)
    planned = [e for e in ex.plan(base, has_template=has_template, has_eagle=has_eagle, prefix=context_prefix,
                                  best_k=best_k, plain_better=plain_better) if only is None or e.name in only]
    # one family of comparisons: every experiment that ran, so its intervals hold together at 95%
    joint = max(1, sum(e.arm is not None and not results[e.arm.name].error for e in planned))
    findings = ranked([finding(e, baseline.counts, results.get(e.arm.name) if e.arm else None, joint=joint)
                       for e in planned])
    probe = None
    if base.drafter.kind == DRAFT_MODEL and (only is None or "probe" in only):
        greedy = baseline if base.settings.temperature == 0 else next(
            (results[e.arm.name] for e in planned if e.name == "temperature 0.0" and not results[e.arm.name].error), None)
        probe = workload_probe(load(base.drafter), baseline.workload.runs(), base.settings,
                               greedy.workload.runs() if greedy is not None else None)
    heads = base.drafter.kind in (EAGLE, EAGLE3)  # the drafters with a vocabulary of their own
    return Diagnosis(baseline, findings, probe, advised, vocab_coverage(load(base.drafter), baseline) if heads else None,
                     trained_length_of(baseline, results) if heads else None)


def trained_length_of(baseline: ArmResult, results: dict[str, ArmResult]) -> dict | None:
    """The baseline's drafts and the longer-context arm's against the head's trained length, if it says one."""
    context = next((r for r in results.values() if r.arm.name == ex.CONTEXT_ARM and r.workload), None)
    arms = {"baseline": baseline.workload.runs() if baseline.workload else []}
    if context is not None:
        arms[ex.CONTEXT] = context.workload.runs()
    return trained_length_report(arms)


def vocab_coverage(pair, baseline: ArmResult) -> dict | None:
    """The baseline's output against the head's draft vocabulary (None: the drafter has no reduced one)."""
    vocab = draft_vocab(pair.drafter)
    if vocab is None or not baseline.workload:
        return None
    return coverage(vocab, baseline.workload.runs(), lambda t: pair.target.tokenizer.decode([t]))


def greedy_measured(d: Diagnosis) -> float | None:
    """A greedy run's acceptance rate on the probe's requests: the baseline's if greedy, else the
    temperature-0 experiment's (what the probe's prediction is to be read against)."""
    if d.baseline.arm.settings.temperature == 0:
        return acceptance_rate(d.baseline.counts)
    greedy = next((f for f in d.findings if f.experiment.name == "temperature 0.0" and f.acceptance), None)
    return None if greedy is None else greedy.acceptance.variant


def format_diagnosis(d: Diagnosis) -> str:
    b = d.as_dict()["baseline"]
    step = d.advice.baseline_step_tokens_per_s if d.advice else None
    lines = [f"BASELINE: {b['requests']} requests, acceptance rate {b['acceptance_rate']:.3f}, "
             f"{b['tokens_per_s']:.1f} wall-clock tokens/s"
             + ("" if step is None else f" ({step:.1f} on this machine's step times)") + f"; traces: {b['folder']}",
             "", format_findings(d.findings, d.advice, b["requests"])]
    if d.probe:
        o = d.probe["overall"]
        lines += ["", "DRAFT AGREEMENT, measured without speculating (one teacher-forced forward of each model "
                      "over the target's greedy continuation)",
                  f"  overall: top-1 agreement {o['top1_agreement']:.3f}, sum min(p, q) {o['mean_overlap']:.3f}, "
                  f"predicted greedy acceptance rate {o['predicted_greedy_acceptance_rate']:.3f} "
                  f"({d.probe['seconds']:.1f} s)"]
        lines += [f"  {name:<16} top-1 {g['top1_agreement']:.3f}  overlap {g['mean_overlap']:.3f}  "
                  f"predicted {g['predicted_greedy_acceptance_rate']:.3f}" for name, g in d.probe["categories"].items()]
        measured = greedy_measured(d)
        if measured is not None:
            lines.append(f"  measured greedy acceptance rate of the same requests: {measured:.3f}")
    if d.vocab and d.vocab["tokens"]:
        v = d.vocab
        missed = ", ".join(f"{m['text']!r} x{m['count']}" for m in v["most_missed"])
        lines += ["", f"DRAFT VOCABULARY: every one of the baseline's {v['tokens']:,} output tokens is among the head's "
                      f"{v['draft_vocab_size']:,} draft tokens" if not v["outside"] else
                      f"DRAFT VOCABULARY: {v['outside']:,} of the baseline's {v['tokens']:,} output tokens "
                      f"({v['outside_share']:.1%}) lie outside the head's {v['draft_vocab_size']:,} draft tokens: it can "
                      f"never draft them, so a draft at each is a certain rejection; most often {missed}"]
    if d.trained_length:
        lines += ["", trained_length_words(d.trained_length)]
    return "\n".join(lines)


def trained_length_words(t: dict) -> str:
    def rate(accepted: int, drafted: int) -> str:
        return f"{accepted / drafted:.3f}" if drafted else "-"

    parts = [f"{name}: {a['drafted_past']:,} of {a['drafted_within'] + a['drafted_past']:,} draft tokens past it "
             f"in {a['requests_past']} of {a['requests']} requests (acceptance {rate(a['accepted_past'], a['drafted_past'])}"
             f" past, {rate(a['accepted_within'], a['drafted_within'])} within)" for name, a in t["arms"].items()]
    return (f"TRAINED LENGTH: the head was trained on sequences of at most {t['trained_positions']:,} tokens; "
            + "; ".join(parts))
