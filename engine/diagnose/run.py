"""Run a diagnosis: the baseline arm, then every experiment's arm, each an ordinary workload folder.

FOLDER/baseline/ and FOLDER/<arm>/ are workload folders (engine/workload/), so every figure of the
report comes with the traces behind it, and the stepper opens each. An arm that cannot run (a model
that does not load, a drafter the pair does not support) is reported with its reason; the others
still run. Requests too long for the models (the context experiment lengthens them) are skipped and
each comparison uses the requests both arms finished.
"""
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from engine.config import SettingsError
from engine.cycle.pair import Pair
from engine.diagnose.experiments import Arm, Experiment
from engine.diagnose.paired import RequestCounts, counts_of
from engine.drafters.registry import DrafterOptions
from engine.mode import RunMode
from engine.models.errors import ModelLoadError, TokenizerMismatchError
from engine.workload.folder import Workload
from engine.workload.manifest import MANIFEST, WorkloadError
from engine.workload.prompts import Request
from engine.workload.run import run_workload

ARM_ERRORS = (SettingsError, ModelLoadError, TokenizerMismatchError, WorkloadError, ValueError, OSError)
LoadPair = Callable[[DrafterOptions], Pair]


@dataclass(frozen=True)
class ArmResult:
    arm: Arm
    folder: Path
    workload: Workload | None
    error: str | None = None

    @property
    def counts(self) -> list[RequestCounts]:
        return [counts_of(r) for r in self.workload.runs()] if self.workload else []


def with_prefix(r: Request, prefix: str) -> Request:
    """The request with `prefix` before what the user asks (the last user turn of a conversation)."""
    if not prefix:
        return r
    if r.prompt is not None:
        return replace(r, prompt=prefix + r.prompt)
    turns = list(r.messages)
    turns[-1] = (turns[-1][0], prefix + turns[-1][1])
    return replace(r, messages=tuple(turns))


def run_arm(load: LoadPair, arm: Arm, requests: list[Request], folder: Path, mode: RunMode, *,
            chat_template: bool, preset: str | None, resume: bool,
            on_request: Callable[[str], None] | None = None,
            on_cycle: Callable[[dict], None] | None = None, arm_prefix: str = "") -> ArmResult:
    """One arm as a workload in folder/<arm_prefix><arm name>; its error, in one line, if it cannot run."""
    out = folder / (arm_prefix + arm.name)
    try:
        pair = load(arm.drafter)
        workload = run_workload(pair, [with_prefix(r, arm.prefix) for r in requests], arm.settings, out, mode,
                                preset=preset, chat_template=chat_template, prompts_name="diagnosis",
                                resume=resume and (out / MANIFEST).is_file(), skip_too_long=True,
                                on_request=lambda e: on_request and on_request(arm.name), on_cycle=on_cycle)
    except ARM_ERRORS as err:
        return ArmResult(arm, out, None, " ".join(str(err).split()))
    return ArmResult(arm, out, workload)


def run_experiments(load: LoadPair, experiments: list[Experiment], requests: list[Request], folder: Path, *,
                    chat_template: bool, preset: str | None, resume: bool,
                    on_request: Callable[[str], None] | None = None,
                    on_cycle: Callable[[dict], None] | None = None, arm_prefix: str = "") -> dict[str, ArmResult]:
    """Every experiment that has an arm, keyed by the experiment's name."""
    return {e.name: run_arm(load, e.arm, requests, folder, RunMode(), chat_template=chat_template, preset=preset,
                            resume=resume, on_request=on_request, on_cycle=on_cycle, arm_prefix=arm_prefix)
            for e in experiments if e.arm is not None}
