"""Run a workload: every request of a prompt file through one loaded pair, one trace each.

Each request is an ordinary run (engine/run.py run_to_trace) with the workload's settings and its
own seed (request i: seed * SEED_STRIDE + i, engine/workload/manifest.py), so its trace is the one a
single `engine run --seed` of that prompt with that seed writes. The manifest is
rewritten (atomically) after each request: a killed workload keeps its finished requests, and
`resume=True` runs only those still pending, after checking that the pair, the settings and the
requests are the ones the folder was started with.
"""
import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from engine.config import SpecSettings
from engine.cycle.pair import Pair
from engine.mode import DEFAULT_MODE, RunMode
from engine.models.machine import cpu_features, cpu_model
from engine.run import check_prompt_fits, describe_model, encode_prompt, run_to_trace
from engine.stats.calibrate import calibrate as measure_step_times
from engine.stats.fast_calibrate import calibrate_fast, forwards_capacity
from engine.workload import manifest as mf
from engine.workload.folder import Workload, open_folder
from engine.workload.manifest import MANIFEST, WorkloadError
from engine.workload.prompts import BUNDLED_PROMPT_SET, PromptFileError, Request, read_prompts


def machine_fields(pair: Pair) -> dict:
    import torch
    return {"cpu": cpu_model(), "features": cpu_features(), "threads": torch.get_num_threads(),
            "device": str(pair.target.device), "dtype": str(pair.target.dtype).removeprefix("torch.")}


def new_manifest(pair: Pair, s: SpecSettings, mode: RunMode, preset: str | None, chat: bool,
                 requests: list[Request], prompts_name: str) -> dict:
    """The manifest of a workload about to start: every request pending. `s`: the settings the mode's
    cycle kind runs with (mode.prepare), as each trace's header records them."""
    settings = s.to_dict() | ({} if mode.tree is None else {"tree": mode.tree.describe()})
    entries = [mf.Entry(i, r.line, r.id, r.category, r.fingerprint(), mf.request_file(i), mf.PENDING, None, None)
               for i, r in enumerate(requests)]
    return {"type": "manifest", "format": mf.FORMAT, "version": mf.VERSION,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "prompts": {"file": prompts_name, "requests": len(requests)},
            "settings": settings, "seed_stride": mf.SEED_STRIDE, "chat_template": chat,
            "pair": {"preset": preset, "target": describe_model(pair.target), "draft": pair.drafter.describe(),
                     "drafter": pair.drafter.settings()},
            "machine": machine_fields(pair), "requests": [mf.as_dict(e) for e in entries]}


def write_manifest(folder: Path, manifest: dict) -> None:
    """Replace the manifest in one step: a kill leaves the old one or the new one, never half."""
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, ensure_ascii=False, indent=1), encoding="utf-8")
    os.replace(tmp, folder / MANIFEST)


def same_run(old: dict, new: dict) -> str | None:
    """What differs between the manifest a folder holds and the one this command would write, if anything."""
    for key in ("settings", "chat_template"):
        if old.get(key) != new[key]:
            return key
    for role in ("target", "draft", "drafter"):
        if old["pair"].get(role) != new["pair"][role]:
            return f"pair.{role}"
    if [r["fingerprint"] for r in old["requests"]] != [r["fingerprint"] for r in new["requests"]]:
        return "the requests (the prompt file changed)"
    return None


def start_folder(folder: Path, manifest: dict, resume: bool) -> dict:
    """The manifest to continue from: the new one, or with --resume the folder's, checked against it."""
    held = folder / MANIFEST
    if not resume:
        if folder.exists() and any(folder.iterdir()):
            what = "holds a workload: add --resume to continue it" if held.exists() else "is not empty"
            raise WorkloadError(f"--out {folder} {what}, or name a new folder")
        folder.mkdir(parents=True, exist_ok=True)
        write_manifest(folder, manifest)
        return manifest
    if not held.is_file():
        raise WorkloadError(f"--resume: {folder} holds no {MANIFEST} to continue")
    old = open_folder(folder).manifest
    differs = same_run(old, manifest)
    if differs:
        raise WorkloadError(f"--resume: {folder} was started with other {differs}; run it in a new folder")
    return old


def encode_requests(pair: Pair, requests: list[Request], s: SpecSettings, chat: bool, source: str,
                    skip_too_long: bool) -> list[list[int] | str]:
    """Each request's prompt ids, or (skip_too_long) why it cannot run; a request too long for the
    models is refused by line before anything runs."""
    encoded: list[list[int] | str] = []
    for r in requests:
        ids = encode_prompt(pair.target.tokenizer, r.text, chat, r.messages)
        try:
            check_prompt_fits(pair, len(ids), s)
        except ValueError as err:
            if not skip_too_long:
                raise PromptFileError(f"{source} line {r.line}: request {r.id!r}: {err} (or add --skip-too-long)") from None
            encoded.append(str(err))
            continue
        encoded.append(ids)
    return encoded


def fitting_ids(pair: Pair, requests: list[Request], given_ids: list[list[int]], s: SpecSettings,
                source: str) -> list[list[int] | str]:
    """Prompt ids given with the requests, each checked to fit the models (a request too long is refused)."""
    for r, ids in zip(requests, given_ids, strict=True):
        try:
            check_prompt_fits(pair, len(ids), s)
        except ValueError as err:
            raise PromptFileError(f"{source}: request {r.id!r}: {err}") from None
    return [list(ids) for ids in given_ids]


def bundled_prompt_ids(pair: Pair, count: int, s: SpecSettings) -> list[list[int]]:
    """The first `count` requests of the bundled prompt set, encoded for the pair's target (in its chat template
    when it has one), each checked to fit the models with `s`'s budget (batch sweeps run them)."""
    chat = bool(getattr(pair.target.tokenizer, "chat_template", None))
    requests = read_prompts(BUNDLED_PROMPT_SET)[:count]
    return encode_requests(pair, requests, s, chat, BUNDLED_PROMPT_SET.name, skip_too_long=False)


def calibrated(pair: Pair, mode: RunMode, s: SpecSettings, prompt_ids: list[list[int] | str]) -> RunMode:
    """Time the models once, on the first request that runs, and record that calibration in every trace. On the
    fast path, time its own forwards (engine/stats/fast_calibrate.py), built for the longest request, and keep
    them for every request: each width is built (or compiled) once for the workload."""
    if not mode.calibrate or mode.calibration is not None:
        return mode
    runnable = [ids for ids in prompt_ids if isinstance(ids, list)]
    if not runnable:
        return mode
    if mode.fast is None:
        return replace(mode, calibration=measure_step_times(pair, runnable[0], s))
    capacity = max(forwards_capacity(ids, s) for ids in runnable)
    calibration, forwards = calibrate_fast(pair, runnable[0], s, mode.fast, capacity=capacity)
    return replace(mode, calibration=calibration, fast_models=forwards.models_for(s.k))


@dataclass
class StartedWorkload:
    """A workload folder ready to run: its manifest, each request's prompt ids (or why it is skipped),
    and what every request's run needs. `run_request(i)` runs one pending request, so a caller can
    interleave several workloads request by request (a diagnosis does: its arms then share the
    machine's quiet and busy moments alike)."""

    pair: Pair
    requests: list[Request]
    s: SpecSettings
    folder: Path
    mode: RunMode
    manifest: dict
    prompt_ids: list[list[int] | str]
    preset: str | None
    chat_template: bool
    on_request: Callable[[mf.Entry], None] | None
    on_cycle: Callable[[dict], None] | None

    def run_request(self, i: int) -> None:
        entry, r, ids = self.manifest["requests"][i], self.requests[i], self.prompt_ids[i]
        if entry["status"] != mf.PENDING:
            return
        if isinstance(ids, str):
            entry |= {"status": mf.SKIPPED, "reason": ids}
        else:
            s = replace(self.s, seed=mf.request_seed(self.s.seed, i, self.manifest.get("seed_stride")))
            trace = run_to_trace(self.pair, r.text, s, self.folder / entry["file"], self.mode,
                                 preset=self.preset, chat_template=self.chat_template, on_cycle=self.on_cycle,
                                 messages=r.messages, request={"id": r.id, "category": r.category},
                                 prompt_ids=ids)
            entry |= {"status": mf.DONE, "summary": mf.summary_of(trace.summary, len(ids))}
        write_manifest(self.folder, self.manifest)
        if self.on_request:
            self.on_request(mf.entry_of(entry))


def start_workload(pair: Pair, requests: list[Request], s: SpecSettings, folder: str | Path,
                   mode: RunMode = DEFAULT_MODE, *, preset: str | None = None, chat_template: bool = True,
                   prompts_name: str = "prompts", resume: bool = False, skip_too_long: bool = False,
                   on_request: Callable[[mf.Entry], None] | None = None,
                   on_cycle: Callable[[dict], None] | None = None,
                   given_ids: list[list[int]] | None = None) -> StartedWorkload:
    """Check everything, write (or, resuming, check) the manifest and calibrate: nothing runs yet.
    `given_ids`: each request's prompt ids as given (a server's, engine/replica/), checked to fit
    the models but never encoded from its text."""
    folder = Path(folder)
    chat = chat_template and bool(getattr(pair.target.tokenizer, "chat_template", None))
    prepared = mode.prepare(pair, s).settings  # refuses what the mode or the pair cannot run, before anything is written
    manifest = new_manifest(pair, prepared, mode, preset, chat, requests, prompts_name)
    if given_ids is None:
        prompt_ids = encode_requests(pair, requests, prepared, chat, prompts_name, skip_too_long)
    else:
        prompt_ids = fitting_ids(pair, requests, given_ids, prepared, prompts_name)
    manifest = start_folder(folder, manifest, resume)
    return StartedWorkload(pair, requests, s, folder, calibrated(pair, mode, s, prompt_ids), manifest, prompt_ids,
                           preset, chat_template, on_request, on_cycle)


def run_workload(pair: Pair, requests: list[Request], s: SpecSettings, folder: str | Path,
                 mode: RunMode = DEFAULT_MODE, *, preset: str | None = None, chat_template: bool = True,
                 prompts_name: str = "prompts", resume: bool = False, skip_too_long: bool = False,
                 on_request: Callable[[mf.Entry], None] | None = None,
                 on_cycle: Callable[[dict], None] | None = None) -> Workload:
    """Run every pending request of `folder`, writing its trace and then the manifest."""
    started = start_workload(pair, requests, s, folder, mode, preset=preset, chat_template=chat_template,
                             prompts_name=prompts_name, resume=resume, skip_too_long=skip_too_long,
                             on_request=on_request, on_cycle=on_cycle)
    for i in range(len(requests)):
        started.run_request(i)
    return open_folder(started.folder)
