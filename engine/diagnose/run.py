"""Run a diagnosis's arms, each an ordinary workload folder, interleaved request by request.

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
from engine.diagnose.experiments import Arm
from engine.diagnose.paired import RequestCounts, counts_of
from engine.drafters.registry import DrafterOptions
from engine.mode import RunMode
from engine.models.errors import ModelLoadError, TokenizerMismatchError
from engine.workload.folder import Workload, open_folder
from engine.workload.manifest import MANIFEST, WorkloadError
from engine.workload.prompts import Request
from engine.workload.run import StartedWorkload, start_workload

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


@dataclass(frozen=True)
class ArmRun:
    """An arm to run and how: the baseline is calibrated, the others record its calibration."""

    arm: Arm
    mode: RunMode


def start_arm(load: LoadPair, run: ArmRun, requests: list[Request], folder: Path, *, chat_template: bool,
              preset: str | None, resume: bool, on_request: Callable[[str], None] | None,
              on_cycle: Callable[[dict], None] | None, arm_prefix: str) -> StartedWorkload | ArmResult:
    """The arm's workload, started; or, if it cannot start, its result with the reason in one line."""
    arm, out = run.arm, folder / (arm_prefix + run.arm.name)
    try:
        return start_workload(load(arm.drafter), [with_prefix(r, arm.prefix) for r in requests], arm.settings,
                              out, run.mode, preset=preset, chat_template=chat_template, prompts_name="diagnosis",
                              resume=resume and (out / MANIFEST).is_file(), skip_too_long=True,
                              on_request=lambda e: on_request and on_request(arm.name), on_cycle=on_cycle)
    except ARM_ERRORS as err:
        return ArmResult(arm, out, None, " ".join(str(err).split()))


def run_interleaved(load: LoadPair, runs: list[ArmRun], requests: list[Request], folder: Path, *,
                    chat_template: bool, preset: str | None, resume: bool,
                    on_request: Callable[[str], None] | None = None,
                    on_cycle: Callable[[dict], None] | None = None, arm_prefix: str = "") -> dict[str, ArmResult]:
    """Every arm, request by request: request 1 in each arm, then request 2 in each, ... So a busy
    moment of the machine slows every arm alike instead of whichever arm ran then, and the tokens/s of
    two arms compare. Keyed by arm name; an arm that fails stops there, with its reason, and the others go on."""
    started = {r.arm.name: start_arm(load, r, requests, folder, chat_template=chat_template, preset=preset,
                                     resume=resume, on_request=on_request, on_cycle=on_cycle, arm_prefix=arm_prefix)
               for r in runs}
    failed = {name: s for name, s in started.items() if isinstance(s, ArmResult)}
    for i in range(len(requests)):
        for run in runs:
            name = run.arm.name
            if name in failed:
                continue
            try:
                started[name].run_request(i)
            except ARM_ERRORS as err:
                failed[name] = ArmResult(run.arm, started[name].folder, None, " ".join(str(err).split()))
    return {r.arm.name: failed.get(r.arm.name) or ArmResult(r.arm, started[r.arm.name].folder,
                                                             open_folder(started[r.arm.name].folder))
            for r in runs}


def run_arm(load: LoadPair, arm: Arm, requests: list[Request], folder: Path, mode: RunMode, *,
            chat_template: bool, preset: str | None, resume: bool,
            on_request: Callable[[str], None] | None = None,
            on_cycle: Callable[[dict], None] | None = None, arm_prefix: str = "") -> ArmResult:
    """One arm as a workload in folder/<arm_prefix><arm name>; its error, in one line, if it cannot run."""
    return run_interleaved(load, [ArmRun(arm, mode)], requests, folder, chat_template=chat_template, preset=preset,
                           resume=resume, on_request=on_request, on_cycle=on_cycle, arm_prefix=arm_prefix)[arm.name]
