"""A live diagnosis from the Diagnose page: `engine diagnose` on a shipped pair, on a worker thread.

The same code as the command line: its pair loader (engine/diagnose/pairs.py), the context prefix
(engine/diagnose/requests.py), and how engine/cli/diagnose.py decides whether the chat-template
and EAGLE experiments apply. The target is the one
every live run shares (app/runs/live.py cached_preset); each drafter an experiment needs is built
around it. Each arm is an ordinary live workload <name>-<arm>, so the Workload page opens it too;
the findings go to <live runs>/diagnoses/<name>.json (app/ui/diagnoses.py reads them).
"""
import json
import os
from pathlib import Path
from types import SimpleNamespace

from app.runs.live import cached_preset
from app.ui import diagnoses, state
from engine.diagnose.diagnosis import diagnose
from engine.diagnose.experiments import Arm, plan
from engine.diagnose.pairs import PairLoader
from engine.diagnose.requests import context_prefix
from engine.drafters.registry import DrafterOptions
from engine.models.presets import PRESETS
from engine.trace.schema import EAGLE, WEIGHTS_FLOAT32
from engine.workload.prompts import Request


class SharedTargetLoader(PairLoader):
    """engine/diagnose/pairs.py's loader, started from the preset's pair that live runs share."""

    def __init__(self, preset: str) -> None:
        args = SimpleNamespace(device=None, dtype=None, target_weights=WEIGHTS_FLOAT32, trust_remote_code=False)
        super().__init__(args, preset, "")  # a preset's target: never loaded from a folder here
        self.pairs[DrafterOptions()] = cached_preset(preset)


def has_template(pair) -> bool:
    """As the command line decides it (the app always renders with the chat template where there is one)."""
    return bool(getattr(pair.target.tokenizer, "chat_template", None))


def has_eagle(preset: str) -> bool:
    return bool(PRESETS[preset].own_draft(EAGLE))


def expected_runs(base: Arm, requests: int, template: bool, eagle: bool) -> int:
    """Request runs the diagnosis will make at most: the baseline, each experiment that applies, and the
    draft-depth arm (whether it runs depends on the baseline's advice), as the command line's bar counts."""
    arms = 2 + sum(e.arm is not None for e in plan(base, has_template=template, has_eagle=eagle, prefix="",
                                                   best_k=None))
    return arms * requests


def write_json(found: dict, name: str) -> Path:
    """<live runs>/diagnoses/<name>.json, whole or not at all (a reader never sees half a file)."""
    out = diagnoses.live_dir() / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(found, indent=1, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, out)
    return out


def loader(preset: str) -> SharedTargetLoader:
    """On the script thread (the shared pair loads there once, as live runs' pairs do)."""
    return SharedTargetLoader(preset)


def run(load: SharedTargetLoader, preset: str, options: DrafterOptions, settings, requests: list[Request],
        name: str, report) -> tuple[str, str]:
    """The whole diagnosis (on the worker thread); returns its (kind, name) for the page to open."""
    pair = load(options)
    template, eagle = has_template(pair), has_eagle(preset)
    base = Arm("baseline", options, settings)
    total = max(1, expected_runs(base, len(requests), template, eagle))
    done: list[str] = []
    words = ["warming up"]

    def on_request(arm: str) -> None:
        done.append(arm)
        words[0] = f"{arm}: {len(done)} of about {total} request runs"
        report(min(len(done) / total, 0.99), words[0])

    folder = state.workloads_dir("run")
    folder.mkdir(parents=True, exist_ok=True)
    result = diagnose(load, base, requests, folder, has_template=template, has_eagle=eagle,
                      context_prefix=context_prefix(pair.target.tokenizer), chat_template=True, preset=preset,
                      on_request=on_request, on_cycle=lambda record: report(min(len(done) / total, 0.99), words[0]),
                      arm_prefix=f"{name}-")
    report(1.0, "writing the report")
    write_json(result.as_dict(), name)
    return ("run", name)
