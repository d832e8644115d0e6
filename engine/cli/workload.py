"""`python -m engine run --prompts FILE --out FOLDER`: a workload, with a progress bar over requests.

The prompt file is read and refused (by line and field) before any model loads; requests too
long for the models are refused by line once the tokenizer has loaded, before any runs. The
first Ctrl-C stops at the end of a cycle: the finished requests stay in FOLDER and the same
command with --resume continues (engine/workload/run.py). What --batch does not run with is
refused by the run mode (engine/mode.py), before any model loads.

May import everything in the engine, and engine/cli/run.py (the checks and loading `run` shares).
"""
import sys
from pathlib import Path

from engine.cli import run as cli_run
from engine.config import SettingsError
from engine.drafters.registry import check_before_loading, options_from_args
from engine.models.presets import PRESETS


def check_folder(out: str) -> None:
    """--out names a folder to create or (with --resume) to continue, never a file."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise SettingsError(f"--out {out}: with --prompts, --out names a folder (one trace per request and a manifest)")


def refuse_workload_options(args) -> None:
    if args.tree == "auto":
        raise SettingsError("--tree auto chooses per prompt: a workload runs one setting over all its requests; "
                            "name a tree or a K")
    if args.tp > 1:
        raise SettingsError("--tp does not run workloads yet: run them on one process")


def repeated_prompt(prompt: str, times: int):
    """`run --prompt P --batch B`: the prompt B times as a workload's requests (copy-1..copy-B), each with
    its own seed, as request i of any workload runs (seed * SEED_STRIDE + i)."""
    import json

    from engine.workload.prompts import parse_prompts
    lines = [json.dumps({"id": f"copy-{i + 1}", "category": "repeated", "prompt": prompt}) for i in range(times)]
    return parse_prompts("\n".join(lines).encode("utf-8"), "--prompt")


def cmd_workload(args) -> int:
    from engine.workload.batched import run_batched_workload
    from engine.workload.prompts import read_prompts
    from engine.workload.run import run_workload

    refuse_workload_options(args)
    args.drafter = cli_run.chosen_drafter(args)
    settings = cli_run.settings_from_args(args)
    mode = cli_run.run_mode_from_args(args)  # a batch's refusals are the mode's (engine/mode.py)
    mode.check_batch_settings(settings, args.resume)
    requests = read_prompts(args.prompts) if args.prompts else repeated_prompt(args.prompt, args.batch)
    prompts_name = Path(args.prompts).name if args.prompts else "--prompt"
    options = options_from_args(args)
    target, draft, preset = cli_run.resolve_models(args)
    check_folder(args.out)
    check_before_loading(options, settings, PRESETS[preset] if preset else None, draft)
    mode.check_drafter(options.kind, args.target_weights, options.mis_set, args.decoder)
    cli_run.check_device(args.device, args.dtype)
    cli_run.check_target_weights(args)
    pair, mode = cli_run.load_for_run(args, options, mode, target, draft, preset)
    if args.batch is not None:
        workload = run_with_progress(lambda on_request, on_cycle: run_batched_workload(
            pair, requests, settings, args.out, mode, preset=preset, chat_template=not args.no_chat_template,
            prompts_name=prompts_name, skip_too_long=args.skip_too_long, on_request=on_request,
            on_cycle=on_cycle), len(requests))
        report_workload(workload, args.out)
        return 0
    workload = run_with_progress(lambda on_request, on_cycle: run_workload(
        pair, requests, settings, args.out, mode, preset=preset, chat_template=not args.no_chat_template,
        prompts_name=prompts_name, resume=args.resume, skip_too_long=args.skip_too_long,
        on_request=on_request, on_cycle=on_cycle), len(requests), finished_before(args))
    report_workload(workload, args.out)
    return 0


def finished_before(args) -> int:
    """Requests a resumed workload has already finished or skipped (the bar starts there)."""
    from engine.workload.folder import open_folder
    from engine.workload.manifest import MANIFEST, PENDING, WorkloadError

    if not args.resume or not (Path(args.out) / MANIFEST).is_file():
        return 0
    try:
        return sum(e.status != PENDING for e in open_folder(Path(args.out)).entries)
    except WorkloadError:
        return 0  # run_workload refuses it with the reason


def run_with_progress(run, total: int, initial: int = 0):
    """Run with a bar over requests (tqdm's estimate of the time left) and Ctrl-C at cycle ends."""
    from tqdm import tqdm

    bar = tqdm(total=total, initial=initial, unit="req", desc="requests", file=sys.stderr)
    try:
        with cli_run.ctrl_c_at_cycle_ends() as stop_if_asked:
            def on_request(entry) -> None:
                bar.update(1)
                rate = entry.summary["acceptance_rate"] if entry.summary else None
                bar.set_postfix(request=entry.id, acceptance="skipped" if rate is None else f"{rate:.2f}")

            return run(on_request, lambda rec: stop_if_asked())
    finally:
        bar.close()


def report_workload(workload, out: str) -> None:
    from engine.workload.report import format_workload_stats
    from engine.workload.stats import workload_stats

    skipped = [e for e in workload.entries if e.status == "skipped"]
    runs = workload.runs()
    if runs:
        print(format_workload_stats(workload_stats(runs)))
    for e in skipped:
        print(f"skipped {e.id} (line {e.line}): {e.reason}")
    print(f"workload written to {out}: {len(runs)} requests done, {len(skipped)} skipped")
