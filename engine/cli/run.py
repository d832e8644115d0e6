"""`python -m engine run`: from the command line's options to a trace, one line for every refusal.

The cheap checks (prompt, --out, --device, the settings and the run mode, engine/mode.py) run
before any model loads. The trace streams into `OUT.partial` and becomes OUT only when the
run ends (engine/trace/format.py TraceWriter). Under torchrun (--tp) rank 0 runs and reports,
the others follow (engine/parallel/rank.py).

May import everything in the engine but the rest of engine.cli (workload.py and diagnose.py build on
this module's checks and loading).
"""
import os
import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from engine.config import CAPTURE_AUTO, SettingsError, SpecSettings, parse_tree, refuse_empty_prompt
from engine.drafters.registry import DRAFTERS, check_before_loading, options_from_args
from engine.mode import RunMode, refuse_tree_auto
from engine.models.presets import DEFAULT_PRESET, PRESETS, default_drafter
from engine.trace.format import Trace, drafted
from engine.trace.schema import DECODER_HF, DECODER_OWN, DRAFT_MODEL, GGUF_WEIGHTS

MAX_PROMPT_CHARS = 1_000_000  # far beyond any model's context; the token limit is checked after tokenizing
TREE_AUTO = "auto"  # --tree auto: the tree advisor chooses a static tree, a chain or plain decoding
K_AUTO = "auto"  # --k auto: the K advisor chooses K, or plain decoding (K=0)
K_AUTO_PILOT = 4  # the K its pilot runs at (engine/stats/plan.py): acceptance is measured there


def chosen_drafter(args) -> str:
    """--drafter, else the preset's default drafter (a draft model for models named by --target,
    and for a --tree run: trees are drafted by the draft model)."""
    if args.drafter is not None:
        return args.drafter
    if getattr(args, "tree", None) is not None:
        return DRAFT_MODEL
    return default_drafter("" if args.target is not None else args.preset)


def resolve_models(args) -> tuple[str, str, str | None]:
    """(target, draft, preset name) from --preset / --target / --draft."""
    spec = DRAFTERS[args.drafter]
    if spec.needs.draft is None and args.draft is not None:
        raise SettingsError(f"{spec.title} drafts without a model: drop --draft")
    if not spec.needs.same_tokens:  # the drafter's own draft, if any: --draft or the preset's
        if args.target is not None and args.preset:
            raise SettingsError("--preset cannot be combined with --target")
        if args.target is not None:
            return args.target, args.draft, None
        preset = PRESETS[args.preset or DEFAULT_PRESET]
        return str(preset.target_folder()), args.draft, preset.name
    if (args.target is None) != (args.draft is None):
        raise SettingsError("name both --target and --draft, or neither (to use a preset)")
    if args.target is not None:
        if args.preset:
            raise SettingsError("--preset cannot be combined with --target/--draft")
        return args.target, args.draft, None
    preset = PRESETS[args.preset or DEFAULT_PRESET]
    return str(preset.target_folder()), str(preset.draft_folder()), preset.name


def settings_from_args(args) -> SpecSettings:
    if args.k == K_AUTO:
        raise SettingsError("--k auto chooses K for one prompt (python -m engine run): name a K for a workload")
    temperature = args.temperature
    if temperature is None:
        temperature = PRESETS[args.preset or DEFAULT_PRESET].default_temperature if args.target is None else 1.0
    return SpecSettings(k=args.k, temperature=temperature, top_k=args.top_k, top_p=args.top_p,
                        seed=args.seed, max_new_tokens=args.max_new_tokens, trace_top_k=args.trace_top_k,
                        cache_layout=args.cache, block_size=args.block_size)


def tree_text(entry: dict) -> str:
    from engine.config import tree_from_header
    return tree_from_header(entry).text()


def format_metrics(trace: Trace) -> str:
    from engine.trace.metrics import drafts, trace_acceptance
    m = trace_acceptance(trace.cycles, trace.k)
    per_pos = " ".join(f"{p:.2f}" for p in m["per_position_acceptance"])
    tree = trace.header["settings"].get("tree")
    shape = f"tree: {tree_text(tree)}" if tree else f"K: {trace.k}"
    lines = [f"cycles: {m['num_cycles']}   {shape}   drafter: {trace.drafter_kind}",
             f"draft acceptance rate: {m['acceptance_rate']:.3f}  (accepted / drafted{' nodes' if tree else ''})",
             f"mean acceptance length: {m['mean_acceptance_length']:.3f}  (1 + accepted / drafts; "
             f"{drafts([drafted(c) for c in trace.cycles])} of the cycles drafted)",
             f"per-{'depth' if tree else 'position'} acceptance: {per_pos}"]
    if trace.summary:
        lines.append(f"generated tokens: {trace.summary['num_generated']}   "
                     f"tokens/s: {trace.summary['tokens_per_s']:.1f}   stop: {trace.summary['stop_reason']}")
    else:
        lines.append("INCOMPLETE trace: no summary (the run did not finish)")
    return "\n".join(lines)


def check_prompt(prompt: str) -> None:
    refuse_empty_prompt(prompt)
    if len(prompt) > MAX_PROMPT_CHARS:
        raise SettingsError(f"the prompt has {len(prompt):,} characters; at most {MAX_PROMPT_CHARS:,} are read")


def check_out(out: str) -> None:
    """--out must name a file we can create or replace, in a folder we can write."""
    path = Path(out)
    if path.is_dir():
        raise SettingsError(f"--out {out} is a folder: name a file such as {path / 'run.jsonl'}")
    if path.exists() and not os.access(path, os.W_OK):
        raise SettingsError(f"--out {out} exists and is read-only")
    folder = path.parent
    while not folder.exists():  # the writer creates missing folders under the nearest existing one
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise SettingsError(f"--out {out}: cannot write in {folder}")


def check_device(device: str | None, dtype: str | None) -> None:
    """A device torch knows and this machine has, and a dtype it supports (torch loads no model here)."""
    import torch

    from engine.models.device import pick_device, pick_dtype
    try:
        dev = pick_device(device)
    except RuntimeError:
        raise SettingsError(f"--device {device!r} is not a device torch knows: use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and (not torch.cuda.is_available() or (dev.index or 0) >= torch.cuda.device_count()):
        raise SettingsError(f"--device {device}: no such CUDA device on this machine")
    if dev.type not in ("cpu", "cuda") and dev.type != "mps":
        raise SettingsError(f"--device {device}: only cpu, cuda and mps are supported")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise SettingsError(f"--device {device}: MPS is not available on this machine")
    pick_dtype(dev, dtype)  # raises ValueError for half precision on the CPU


def check_target_weights(args) -> None:
    """int4 weights run on the CPU kernel (engine/models/gguf_linear.py): refuse other devices first."""
    if args.target_weights not in GGUF_WEIGHTS:
        return
    from engine.models.device import pick_device
    if pick_device(args.device).type != "cpu":
        raise SettingsError(f"--target-weights {args.target_weights} runs on the CPU (its kernel is a CPU kernel): "
                            "add --device cpu")


def run_mode_from_args(args) -> RunMode:
    """The run mode of `python -m engine run`, refused here when its options cannot go together. With
    --fast, the capture mode is settled once the target's device is known (cmd_run)."""
    tree = None if args.tree in (None, TREE_AUTO) else parse_tree(args.tree)
    if args.tree == TREE_AUTO:
        refuse_tree_auto(args.drafter, args.fast, args.calibrate, options_from_args(args).mis_set)
    if args.capture is not None and not args.fast:
        raise SettingsError("--capture chooses how the fast path's forwards run: add --fast")
    return RunMode(tree=tree, fast="none" if args.fast else None, tp_size=args.tp, calibrate=args.calibrate,
                   batch=getattr(args, "batch", None))


def cmd_run(args) -> int:
    from engine.parallel.world import check_launch, launched_rank
    from engine.run import run_to_trace

    if args.resume or args.skip_too_long:
        raise SettingsError("--resume and --skip-too-long go with --prompts (a workload)")
    args.drafter = chosen_drafter(args)
    k_auto = args.k == K_AUTO
    if k_auto:
        refuse_k_auto(args)
        args.k = K_AUTO_PILOT
    settings = settings_from_args(args)
    mode = run_mode_from_args(args)
    options = options_from_args(args)
    target, draft, preset = resolve_models(args)
    check_prompt(args.prompt)
    check_launch(args.tp)
    if launched_rank() in (None, 0):  # only rank 0 writes the trace
        check_out(args.out)
    check_before_loading(options, settings, PRESETS[preset] if preset else None, draft)
    mode.check_drafter(options.kind, args.target_weights, options.mis_set, args.decoder)
    if args.tp > 1:
        return cmd_run_parallel(args, settings, mode, options, target, draft, preset)
    check_device(args.device, args.dtype)
    check_target_weights(args)
    pair, mode = load_for_run(args, options, mode, target, draft, preset)
    if args.tree == TREE_AUTO:
        return run_tree_auto(args, pair, settings, preset)
    if k_auto:
        return run_k_auto(args, pair, settings, preset, mode)
    return generate_and_report(args, settings, lambda progress: run_to_trace(
        pair, args.prompt, settings, args.out, mode, preset=preset, chat_template=not args.no_chat_template,
        on_cycle=progress))


def load_for_run(args, options, mode: RunMode, target: str, draft: str | None, preset: str | None) -> tuple:
    """(the pair, the run mode with --fast's capture settled for the target's device), saying what loads."""
    from engine.run import load_preset, load_with_drafter

    print(f"loading target {target}\ndrafter: {options.kind}" + (f", draft {draft}" if draft else ""), file=sys.stderr)
    if preset:
        pair = load_preset(preset, args.device, args.dtype, options, args.target_weights, args.decoder)
    else:
        pair = load_with_drafter(target, options, args.device, args.trust_remote_code, args.dtype,
                                 args.target_weights, args.decoder)
    say_decoders(pair)
    if args.fast:
        mode = settle_fast_path(args, pair, mode)
    return pair, mode


def settle_fast_path(args, pair, mode: RunMode) -> RunMode:
    """--fast's capture for the loaded target's device, saying what runs; under --capture auto on the
    CPU, measured on this machine once for the pair and K (engine/cycle/capture_choice.py)."""
    from engine.cycle.fast import plan_fast_path

    capture, measured = args.capture, None
    if capture == CAPTURE_AUTO and pair.target.device.type == "cuda":
        capture = "graph"
    elif capture == CAPTURE_AUTO and pair.draft is None:
        capture = "none"  # nothing to measure: the fast path refuses a drafter without a draft model anyway
    elif capture == CAPTURE_AUTO:
        from engine.cycle.capture_choice import capture_times
        print("fast path: timing one cycle's forwards eager and compiled on this machine (the first time for this "
              "pair and K: it compiles both models)", file=sys.stderr)
        times = capture_times(pair.target, pair.draft, args.k)
        capture, measured = times.chosen(), times.describe()
        print(f"fast path: a cycle's forwards took {times.cycle_s['none'] * 1000:.1f} ms eager, "
              f"{times.cycle_s['compile'] * 1000:.1f} ms compiled: {'compiling' if capture == 'compile' else 'eager'}",
              file=sys.stderr)
    try:
        plan = plan_fast_path(pair.target.device, capture)
    except ValueError as err:
        raise SettingsError(str(err)) from None
    print(plan.message, file=sys.stderr)
    return replace(mode, fast=plan.capture, fast_measured=measured)


def say_decoders(pair) -> None:
    """Under --decoder own: which code each model runs on, and why a model the own decoder refuses
    does not (the trace header records the same)."""
    from engine.run import decoder_models

    for role, m in decoder_models(pair).items():
        if m.decoder_asked == DECODER_HF:
            continue
        if m.decoder == DECODER_OWN:
            print(f"decoder: {role} on the engine's own decoder", file=sys.stderr)
        else:
            print(f"decoder: {role} on Hugging Face's modules (the own decoder does not apply: {m.decoder_fallback})",
                  file=sys.stderr)


def refuse_k_auto(args) -> None:
    """--k auto runs engine/run.py run_advised (or run_fast_advised under --fast): one prompt, one process, a chain."""
    if args.tree is not None:
        raise SettingsError("--k auto chooses a chain's K; --tree names or chooses a tree (--tree auto chooses among "
                            "trees, chains and plain decoding): use one of the two")
    if args.tp > 1:
        raise SettingsError("--k auto measures on its own and runs in one process: drop --tp")


def report_advised(done, out) -> int:
    """What an advised run (--k auto, --tree auto) printed: its text, then its metrics and trace, or that it
    decoded plainly and wrote none."""
    print(done.text)
    if done.trace is None:
        print(f"decoded plainly ({done.tokens} tokens), as advised: no trace written")
        return 0
    print(format_metrics(done.trace))
    print(f"trace written to {out}")
    return 0


def run_k_auto(args, pair, settings: SpecSettings, preset: str | None, mode: RunMode) -> int:
    """--k auto: the K advisor measures this machine, runs a pilot, and runs its K; plain decoding writes no trace.
    Under --fast all three run on the fast path's own forwards."""
    from engine.run import run_advised, run_fast_advised

    chat = not args.no_chat_template
    if mode.fast is None:
        print(f"K advisor: timing both models by width and running a short pilot at K={settings.k}...", file=sys.stderr)
        done = run_advised(pair, args.prompt, settings, args.out, preset, chat)
    else:
        compiling = " (compiling each width once)" if mode.fast == "compile" else ""
        print(f"K advisor: timing the fast path's forwards of 1 to {settings.k + 1} positions{compiling} and running a "
              f"short pilot at K={settings.k} on them...", file=sys.stderr)
        done = run_fast_advised(pair, args.prompt, settings, args.out, mode, preset, chat)
    print(f"K advisor (pilot alpha {done.plan.alpha:.2f} +- {done.plan.alpha_error:.2f}): {done.plan.sentence}",
          file=sys.stderr)
    return report_advised(done, args.out)


def run_tree_auto(args, pair, settings: SpecSettings, preset: str | None) -> int:
    """--tree auto: the tree advisor measures, chooses and runs; plain decoding writes no trace."""
    from engine.run import run_tree_advised

    print("tree advisor: timing both models by width and running a short pilot...", file=sys.stderr)
    done = run_tree_advised(pair, args.prompt, settings, args.out, preset, not args.no_chat_template)
    print(f"tree advisor: {done.plan.sentence}", file=sys.stderr)
    return report_advised(done, args.out)


@contextmanager
def ctrl_c_at_cycle_ends():
    """While a run goes: the first Ctrl-C is noted, and raised as KeyboardInterrupt by the check this
    yields, which the run calls after each cycle. Why: Python raises it wherever the interpreter is,
    and where that is a finaliser (a __del__ or a weakref callback) it is printed and dropped. Under
    load on 2 cores a run went on past such a Ctrl-C. A second Ctrl-C interrupts at once."""
    pending: list[int] = []

    def note(signum, frame) -> None:
        if pending:
            raise KeyboardInterrupt
        pending.append(signum)

    def check() -> None:
        if pending:
            raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield check
        return
    previous = signal.signal(signal.SIGINT, note)
    try:
        yield check
    finally:
        signal.signal(signal.SIGINT, previous)
    check()  # a Ctrl-C after the last cycle still ends the command as one


def generate_and_report(args, settings: SpecSettings, run) -> int:
    """Run with a progress bar (`run(on_cycle)` returns the Trace), then print the text and the metrics."""
    from tqdm import tqdm

    bar = tqdm(total=settings.max_new_tokens, unit="tok", desc="generating", file=sys.stderr)

    try:
        with ctrl_c_at_cycle_ends() as stop_if_asked:
            def progress(rec: dict) -> None:
                bar.update(len(rec["committed_token_ids"]))
                bar.set_postfix(cycle=rec["cycle"], accepted=f"{rec['num_accepted']}/{drafted(rec)}")
                stop_if_asked()

            trace = run(progress)
    finally:
        bar.close()  # ends the progress line, so a message after it starts on its own line
    print(trace.summary["generated_text"])
    print(format_metrics(trace))
    print(f"trace written to {args.out}")
    return 0


def cmd_run_parallel(args, settings: SpecSettings, mode: RunMode, options, target: str, draft: str | None,
                     preset: str | None) -> int:
    """One rank of `torchrun ... -m engine run --tp N`: rank 0 runs and reports, the others follow."""
    from engine.models.device import pick_dtype
    from engine.parallel.failure import stop_on_sigterm
    from engine.parallel.rank import load_ranks, run_follower, run_lead
    from engine.parallel.sharding import check_shardable
    from engine.parallel.world import join_world, launched_rank, leave_world, rank_device

    # Before the ranks join: every rank checks the same command line and config, and fails alike
    # (the run mode's refusals ran in cmd_run).
    pick_dtype(rank_device(args.device), args.dtype)
    check_shardable(target, args.tp, args.trust_remote_code)
    lead = launched_rank() == 0
    if lead:
        stop_on_sigterm()  # torchrun stops the others' ranks with SIGTERM: rank 0 still writes its line
        print(f"loading target {target} sharded over {args.tp} ranks\ndrafter on rank 0: {options.kind}"
              + (f", draft {draft}" if draft else ""), file=sys.stderr)
    world = join_world(args.device, args.tp_timeout)
    models = load_ranks(world, target, options, args.dtype, args.trust_remote_code, preset)
    if not lead:
        code = run_follower(models)
        leave_world()
        return code
    code = generate_and_report(args, settings, lambda progress: run_lead(
        models, args.prompt, settings, args.out, mode, preset=preset, chat_template=not args.no_chat_template,
        on_cycle=progress))
    leave_world()
    return code
