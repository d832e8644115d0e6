"""Command line: `python -m engine run ...` writes a trace; `python -m engine stats FILE` reads one;
`python -m engine metrics FILE...` explains a vLLM, SGLang or TensorRT-LLM server's metrics.

Every error is one line on stderr and exit code 2; Ctrl-C is one line and exit code 130.
The cheap checks (prompt, --out, --device, settings) run before any model loads. The trace
streams into `OUT.partial` and becomes OUT only when the run ends, so a failed or killed
run never destroys an earlier OUT and leaves its finished cycles under a clearly named file.
"""
import argparse
import os
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

from engine.config import SettingsError, SpecSettings, parse_tree
from engine.drafters.registry import DRAFTERS, all_flags, check_before_loading, options_from_args
from engine.models.loading import ModelLoadError, TokenizerMismatchError
from engine.models.presets import DEFAULT_PRESET, PRESETS, default_drafter
from engine.trace.format import Trace, TraceError, drafted, load_trace, partial_path
from engine.trace.schema import DRAFT_MODEL, LAYOUTS, MAX_K, TARGET_WEIGHTS, WEIGHTS_FLOAT32, WEIGHTS_INT4

MAX_PROMPT_CHARS = 1_000_000  # far beyond any model's context; the token limit is checked after tokenizing
DEFAULT_TP_TIMEOUT_S = 600  # engine/parallel/world.py DEFAULT_TIMEOUT_S (not imported: the parser loads no torch)
TREE_AUTO = "auto"  # --tree auto: the tree advisor chooses a static tree, a chain or plain decoding


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description="Speculative decoding with per-cycle traces.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="generate text speculatively and write a trace")
    run.add_argument("--prompt", required=True)
    run.add_argument("--preset", choices=sorted(PRESETS), default=None,
                     help=f"offline model pair (default {DEFAULT_PRESET} when no models are named)")
    run.add_argument("--target", help="target model: hub id, local folder, or folder with a .gguf file")
    run.add_argument("--draft", help="draft model, same forms as --target (with --drafter other-tokenizer: "
                                     "a draft with its own tokenizer)")
    run.add_argument("--drafter", choices=list(DRAFTERS), default=None,
                     help="what proposes tokens (default: the preset's default drafter; a draft model when "
                          f"--target names the models): {drafters_in_words()}")
    for flag in all_flags():  # each drafter kind's own options (engine/drafters/registry.py)
        run.add_argument(flag.name, type=int, default=flag.default, help=flag.help)
    run.add_argument("--k", type=int, default=4, help="draft tokens per cycle")
    run.add_argument("--tree", default=None,
                     help="draft a token tree instead of a chain (with the draft model, or the EAGLE head under "
                          "--drafter eagle): static:B1,B2,... (B_d children per node at depth d, as in Medusa) or "
                          "dynamic:top_k=K,depth=D,nodes=N (EAGLE-2's expand-and-rerank); K becomes the tree's depth; "
                          "or auto (draft model only): the tree advisor times both models on this machine and runs the "
                          "tree, chain or plain decoding it predicts fastest (docs/trees.md)")
    run.add_argument("--temperature", type=float, default=None, help="0 = greedy (default: the preset's)")
    run.add_argument("--top-k", type=int, default=0)
    run.add_argument("--top-p", type=float, default=1.0)
    run.add_argument("--max-new-tokens", type=int, default=64)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--trace-top-k", type=int, default=10, help="entries of each distribution kept for charts")
    run.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    run.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                     help="weights and compute (default float32: half precision can flip near-tie argmaxes, "
                          "so greedy speculation may part from plain greedy decoding; GPU only)")
    run.add_argument("--target-weights", choices=TARGET_WEIGHTS, default=WEIGHTS_FLOAT32,
                     help="what the target's linear layers run on: float32 (the model as loaded) or int4 (its GGUF "
                          "file's Q4_1 blocks, a Q8_0 output layer, as stored; CPU, float32 activations; a C "
                          "compiler builds the kernel once). Each is its own target distribution")
    run.add_argument("--cache", choices=LAYOUTS, default="dynamic",
                     help="KV-cache layout of both models: dynamic (HF DynamicCache, crop the tail), static "
                          "(preallocated buffer, move the write position) or paged (vLLM-style blocks, free whole blocks)")
    run.add_argument("--block-size", type=int, default=16, help="slots per block of the paged layout")
    run.add_argument("--no-chat-template", action="store_true", help="feed the prompt as raw text")
    run.add_argument("--trust-remote-code", action="store_true", help="allow model code from the model folder")
    run.add_argument("--out", required=True, help="trace file to write (.jsonl)")
    run.add_argument("--fast", action="store_true",
                     help="fast path (engine/cycle/fast.py): static caches, the cycle kept on the device, CUDA graphs "
                          "on CUDA; elsewhere the same cycle runs eagerly (the reason is printed)")
    run.add_argument("--calibrate", action="store_true",
                     help="also time single steps and verify widths of both models (needed for c and speedups in stats)")
    run.add_argument("--tp", type=int, default=1,
                     help="shard the target over this many ranks with transformers' tensor-parallel plan; start one "
                          "process per rank with torchrun --nproc-per-node N -m engine run --tp N (docs/tensor-parallel.md)")
    run.add_argument("--tp-timeout", type=float, default=DEFAULT_TP_TIMEOUT_S,
                     help="under --tp: seconds a rank waits for the others before the run ends with an error "
                          "(a rank that died or hangs); it must cover rank 0 loading the draft")
    stats = sub.add_parser("stats", help="print acceptance, cost and speed statistics of a trace file")
    stats.add_argument("trace")
    stats.add_argument("--prometheus", action="store_true",
                       help="print the trace's acceptance as vLLM's Prometheus counters instead")
    metrics = sub.add_parser("metrics", help="explain a server's speculative-decoding metrics (vLLM, SGLang, "
                                             "TensorRT-LLM); two vLLM /metrics scrapes give the time between")
    metrics.add_argument("files", nargs="+", help="one metrics file, or two Prometheus scrapes, earlier first")
    metrics.add_argument("--k", type=int, default=None, help="draft tokens per cycle, where the input gives none")
    metrics.add_argument("--c", type=float, default=None, help="cost ratio: one draft step / one target step")
    metrics.add_argument("--verify-steps", type=float, default=1.0,
                         help="one verify pass over K+1 positions, in target steps (default 1, Leviathan's assumption)")
    metrics.add_argument("--trace", default=None,
                         help="a trace to compare with; its calibration gives c and the verify cost unless --c is given")
    return parser


def drafters_in_words() -> str:
    """The drafter kinds as the registry describes them: "a, b, c, or d"."""
    words = [spec.description for spec in DRAFTERS.values()]
    return ", ".join(words[:-1]) + ", or " + words[-1]


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
    from engine.trace.metrics import acceptance_metrics
    m = acceptance_metrics([c["num_accepted"] for c in trace.cycles], trace.k, [drafted(c) for c in trace.cycles])
    per_pos = " ".join(f"{p:.2f}" for p in m["per_position_acceptance"])
    tree = trace.header["settings"].get("tree")
    shape = f"tree: {tree_text(tree)}" if tree else f"K: {trace.k}"
    lines = [f"cycles: {m['num_cycles']}   {shape}   drafter: {trace.drafter_kind}",
             f"draft acceptance rate: {m['acceptance_rate']:.3f}  (accepted / drafted{' nodes' if tree else ''})",
             f"mean acceptance length: {m['mean_acceptance_length']:.3f}  (1 + accepted / cycles)",
             f"per-{'depth' if tree else 'position'} acceptance: {per_pos}"]
    if trace.summary:
        lines.append(f"generated tokens: {trace.summary['num_generated']}   "
                     f"tokens/s: {trace.summary['tokens_per_s']:.1f}   stop: {trace.summary['stop_reason']}")
    else:
        lines.append("INCOMPLETE trace: no summary (the run did not finish)")
    return "\n".join(lines)


def check_prompt(prompt: str) -> None:
    if not prompt.strip():
        raise SettingsError("the prompt is empty or only whitespace: give the model some text to continue")
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
    """int4 weights run on the CPU in float32 (engine/models/gguf_linear.py): refuse other devices first."""
    if args.target_weights != WEIGHTS_INT4:
        return
    from engine.models.device import pick_device
    if pick_device(args.device).type != "cpu":
        raise SettingsError("--target-weights int4 runs on the CPU (float32 activations): add --device cpu")


def cmd_run(args) -> int:
    from engine.parallel.world import check_launch, launched_rank
    from engine.run import load_preset, load_with_drafter, run_to_trace

    args.drafter = chosen_drafter(args)
    settings = settings_from_args(args)
    tree = None if args.tree in (None, TREE_AUTO) else parse_tree(args.tree)
    if args.tree is not None and args.tp > 1:
        raise SettingsError("--tree does not run with --tp yet; drop one of the two")
    if args.tree == TREE_AUTO and args.drafter != DRAFT_MODEL:
        raise SettingsError(f"--tree auto sizes trees from the draft model's costs and ranks; with --drafter "
                            f"{args.drafter} name the tree (static:3,2,1 or dynamic:top_k=3,depth=4,nodes=12)")
    options = options_from_args(args)
    target, draft, preset = resolve_models(args)
    check_prompt(args.prompt)
    check_launch(args.tp)
    if launched_rank() in (None, 0):  # only rank 0 writes the trace
        check_out(args.out)
    check_before_loading(options, settings, PRESETS[preset] if preset else None, draft)
    if args.tp > 1:
        if args.target_weights != WEIGHTS_FLOAT32:
            raise SettingsError("--target-weights int4 runs on one CPU process: drop --tp")
        return cmd_run_parallel(args, settings, options, target, draft, preset)
    check_device(args.device, args.dtype)
    check_target_weights(args)
    print(f"loading target {target}\ndrafter: {options.kind}" + (f", draft {draft}" if draft else ""), file=sys.stderr)
    if preset:
        pair = load_preset(preset, args.device, args.dtype, options, args.target_weights)
    else:
        pair = load_with_drafter(target, options, args.device, args.trust_remote_code, args.dtype,
                                 args.target_weights)
    fast = None
    if args.fast:
        from engine.cycle.fast import plan_fast_path
        plan = plan_fast_path(pair.target.device)
        print(plan.message, file=sys.stderr)
        fast = plan.capture
    if args.tree == TREE_AUTO:
        return run_tree_auto(args, pair, settings, preset)
    return generate_and_report(args, settings, lambda progress: run_to_trace(
        pair, args.prompt, settings, args.out, preset, chat_template=not args.no_chat_template, on_cycle=progress,
        calibrate=args.calibrate, fast=fast, tree=tree))


def run_tree_auto(args, pair, settings: SpecSettings, preset: str | None) -> int:
    """--tree auto: the tree advisor measures, chooses and runs; plain decoding writes no trace."""
    from engine.run import run_tree_advised

    if args.fast or args.calibrate:
        raise SettingsError("--tree auto measures on its own and runs the reference cycle: drop --fast and --calibrate")
    print("tree advisor: timing both models by width and running a short pilot...", file=sys.stderr)
    done = run_tree_advised(pair, args.prompt, settings, args.out, preset, not args.no_chat_template)
    print(f"tree advisor: {done.plan.sentence}", file=sys.stderr)
    print(done.text)
    if done.trace is None:
        print(f"decoded plainly ({done.tokens} tokens), as advised: no trace written")
        return 0
    print(format_metrics(done.trace))
    print(f"trace written to {args.out}")
    return 0


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


def cmd_run_parallel(args, settings: SpecSettings, options, target: str, draft: str | None,
                     preset: str | None) -> int:
    """One rank of `torchrun ... -m engine run --tp N`: rank 0 runs and reports, the others follow."""
    from engine.models.device import pick_dtype
    from engine.parallel.failure import stop_on_sigterm
    from engine.parallel.sharding import check_shardable
    from engine.parallel.world import join_world, launched_rank, leave_world, rank_device
    from engine.parallel_run import load_ranks, refuse_unsupported, run_follower, run_lead

    # Before the ranks join: every rank checks the same command line and config, and fails alike.
    refuse_unsupported(options.kind, args.fast)
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
        models, args.prompt, settings, args.out, preset, not args.no_chat_template, progress, args.calibrate))
    leave_world()
    return code


def cmd_stats(args) -> int:
    trace = load_trace(args.trace, allow_incomplete=True)
    if args.prometheus:
        from engine.servers.export import prometheus_text
        print(prometheus_text(trace), end="")
        return 0
    from engine.stats.report import format_stats
    print(format_stats(trace))
    return 0


def read_metrics_files(files: list[str]) -> list[str]:
    """The files' text, each refused above the readers' size limit before it is read whole."""
    from engine.servers.read import decode
    from engine.servers.record import MAX_INPUT_BYTES, check_text_size
    texts = []
    for name in files:
        with open(name, "rb") as f:
            data = f.read(MAX_INPUT_BYTES + 1)
        check_text_size(data, name)
        texts.append(decode(data, name))
    return texts


def cmd_metrics(args) -> int:
    from engine.servers.explain import calibrated_costs, entered_costs, explain
    from engine.servers.read import read_texts
    from engine.servers.report import format_report
    from engine.stats.analysis import trace_stats

    if args.k is not None and not 1 <= args.k <= MAX_K:
        raise SettingsError(f"--k {args.k}: K must be 1 to {MAX_K}")
    record = read_texts(read_metrics_files(args.files))
    trace = trace_stats(load_trace(args.trace, allow_incomplete=True)) if args.trace else None
    k = args.k or record.k
    costs = None
    if args.c is not None:
        costs = entered_costs(args.c, args.verify_steps)
    elif trace is not None and trace.calibration is not None and k:
        costs = calibrated_costs(trace.calibration, k)
    print(format_report(explain(record, args.k, costs, args.verify_steps), trace))
    return 0


COMMANDS = {"run": cmd_run, "stats": cmd_stats, "metrics": cmd_metrics}


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def kept_cycles(args) -> str:
    """Where a stopped run's finished cycles are, if it wrote any."""
    if args.command != "run" or os.environ.get("RANK", "0") != "0":  # under torchrun only rank 0 writes a trace
        return ""
    partial = partial_path(args.out)
    return f" (the cycles it finished are in {partial})" if partial.is_file() else ""


def report(err: BaseException, line: str) -> None:
    """Print one line on stderr, unless another rank of a torchrun group reports this failure
    (engine/parallel/failure.py: rank 0 speaks for the group, another rank only of its own errors)."""
    if os.environ.get("RANK") is not None and os.environ.get("LOCAL_RANK") is not None:  # under torchrun
        from engine.parallel.failure import quiet_sigterm, speaker
        prefix = speaker(err)
        if prefix is None:
            return
        if not prefix:
            quiet_sigterm()  # torchrun's SIGTERM must not cut the line off
        line = prefix + line.lstrip("\n") if prefix else line
    print(line, file=sys.stderr)


def known_errors() -> tuple:
    """Errors whose message is the whole story: printed without their type's name."""
    base = (SettingsError, ModelLoadError, TokenizerMismatchError, TraceError, ValueError, OSError)
    if "engine.parallel.failure" not in sys.modules:
        return base
    from engine.parallel.failure import GroupError, RankError
    return (*base, GroupError, RankError)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt as err:
        report(err, f"\ninterrupted{kept_cycles(args)}")
        return 130
    except Exception as err:  # noqa: BLE001 - the command line shows one line, never a traceback
        if isinstance(err, known_errors()):
            report(err, f"error: {one_line(err)}{kept_cycles(args)}")
            return 2
        if os.environ.get("SPECLAB_DEBUG"):
            raise
        report(err, f"error: {type(err).__name__}: {one_line(err)}{kept_cycles(args)} "
                    "(set SPECLAB_DEBUG=1 for the traceback)")
        return 2
