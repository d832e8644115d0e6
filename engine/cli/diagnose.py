"""`python -m engine diagnose`: why is acceptance low on this pair, these settings and these requests?

The same pair and sampling options as `engine run`. The target loads once; each drafter an
experiment needs is built around it. The runs go to --out as workload folders (one per arm) with
the findings in diagnosis.json; the report names the folder behind every figure.

This module holds the options and the printing only: the requests (engine/diagnose/requests.py),
the pairs (engine/diagnose/pairs.py) and the diagnosis itself (engine/diagnose/diagnosis.py) are
library code the app shares.

May import everything in the engine, and engine/cli/run.py (the checks `run` shares).
"""
import json
import sys
from pathlib import Path

from engine.cli import run as cli_run
from engine.config import SettingsError
from engine.diagnose.experiments import Arm, plan
from engine.diagnose.pairs import PairLoader
from engine.diagnose.requests import PROMPT_SET, context_prefix, per_category
from engine.drafters.registry import check_before_loading, options_from_args
from engine.models.presets import PRESETS
from engine.trace.schema import EAGLE
from engine.workload.prompts import read_prompts


def cmd_diagnose(args) -> int:
    from tqdm import tqdm

    from engine.diagnose.diagnosis import diagnose, format_diagnosis

    if args.tree is not None:
        raise SettingsError("diagnose compares chains: drop --tree")
    args.drafter = cli_run.chosen_drafter(args)
    settings = cli_run.settings_from_args(args)
    options = options_from_args(args)
    target, draft, preset = cli_run.resolve_models(args)
    requests = per_category(read_prompts(args.prompts or PROMPT_SET), args.per_category)
    check_before_loading(options, settings, PRESETS[preset] if preset else None, draft)
    cli_run.check_device(args.device, args.dtype)
    load = PairLoader(args, preset, target)
    pair = load(options)
    chat = not args.no_chat_template
    has_template = chat and bool(getattr(pair.target.tokenizer, "chat_template", None))
    has_eagle = bool(preset and PRESETS[preset].own_draft(EAGLE))
    base = Arm("baseline", options, settings)
    arms = 2 + sum(e.arm is not None for e in plan(base, has_template=has_template, has_eagle=has_eagle,
                                                   prefix="", best_k=None))
    bar = tqdm(total=arms * len(requests), unit="req", desc="diagnosis", file=sys.stderr)
    with cli_run.ctrl_c_at_cycle_ends() as stop_if_asked:
        try:
            result = diagnose(load, base, requests, args.out, has_template=has_template, has_eagle=has_eagle,
                              context_prefix=context_prefix(pair.target.tokenizer), chat_template=chat,
                              preset=preset, resume=args.resume, only=set(args.only.split(",")) if args.only else None,
                              on_request=lambda arm: bar.update(1) or bar.set_postfix(arm=arm),
                              on_cycle=lambda rec: stop_if_asked())
        finally:
            bar.close()
    found = result.as_dict()
    Path(args.out, "diagnosis.json").write_text(json.dumps(found, indent=1, ensure_ascii=False), encoding="utf-8")
    print(json.dumps(found, ensure_ascii=False) if args.json else format_diagnosis(result))
    return 0

