"""The command line, `python -m engine`: `main` and the argument parser; one module per command.

- run.py: `run --prompt` (one trace; under torchrun with --tp, one rank of it, engine/parallel/rank.py).
- workload.py: `run --prompts` and `run --batch` (a workload folder).
- diagnose.py: `diagnose` (the options and the printing; the diagnosis itself is engine/diagnose/).
- stats.py: `stats` (a trace or a workload) and `metrics` (a server's speculative-decoding metrics).
- client.py: `client` (a prompt file sent to a live server, into a server workload folder).
- replica.py: `replica` (a server workload run again through the engine, compared step by step).

Every error is one line on stderr and exit code 2; Ctrl-C is one line and exit code 130.
The cheap checks (prompt, --out, --device, settings, the run mode) run before any model loads.
The trace streams into `OUT.partial` and becomes OUT only when the run ends, so a failed or
killed run never destroys an earlier OUT and leaves its finished cycles under a clearly named file.

May import everything in the engine. Nothing imports engine.cli but engine/__main__.py (and tests,
scripts): the library and the app never do.
"""
import argparse
import os
import sys

from engine.cli.client import add_client_parser
from engine.cli.run import K_AUTO, K_AUTO_PILOT, cmd_run, ctrl_c_at_cycle_ends  # noqa: F401 - ctrl_c_at_cycle_ends: the run's Ctrl-C rule
from engine.cli.stats import cmd_metrics, cmd_stats
from engine.config import CAPTURE_AUTO, CAPTURE_MODES, SettingsError
from engine.drafters.registry import DRAFTERS, all_flags
from engine.models.loading import ModelLoadError, TokenizerMismatchError
from engine.models.presets import DEFAULT_PRESET, PRESETS
from engine.trace.format import TraceError, partial_path
from engine.trace.schema import DECODER_HF, DECODERS, LAYOUTS, TARGET_WEIGHTS, WEIGHTS_FLOAT32

DEFAULT_TP_TIMEOUT_S = 600  # engine/parallel/world.py DEFAULT_TIMEOUT_S (not imported: the parser loads no torch)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description="Speculative decoding with per-cycle traces.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="generate text speculatively and write a trace")
    request = run.add_mutually_exclusive_group(required=True)
    request.add_argument("--prompt")
    request.add_argument("--prompts", metavar="FILE",
                         help="run a workload: every request of FILE (JSON Lines of {\"prompt\"} or {\"messages\"} "
                              "with optional \"id\" and \"category\", or plain text, one prompt a line), one trace "
                              "each, into the folder --out names, with a manifest (docs/workloads.md)")
    add_pair_and_sampling(run)
    run.add_argument("--out", required=True, help="trace file to write (.jsonl); with --prompts, the workload's folder")
    run.add_argument("--resume", action="store_true",
                     help="with --prompts: continue the workload in --out, running only the requests not yet done")
    run.add_argument("--batch", type=int, default=None, metavar="B",
                     help="run B requests at a time through the batched cycle (engine/batch/, chains of the draft "
                          "model); a row whose request finishes takes the next (continuous batching). --out is then a "
                          "workload folder, plus batch.jsonl (docs/batching.md); with --prompt, the prompt runs B "
                          "times, each with its own seed")
    run.add_argument("--skip-too-long", action="store_true",
                     help="with --prompts: skip (and list in the manifest) requests too long for the models' context "
                          "instead of refusing the file")
    run.add_argument("--fast", action="store_true",
                     help="fast path (engine/cycle/fast.py): static caches, the cycle kept on the device, CUDA graphs "
                          "on CUDA; elsewhere the same cycle runs eagerly (the reason is printed)")
    run.add_argument("--capture", choices=(*CAPTURE_MODES, CAPTURE_AUTO), default=None,
                     help="with --fast, how its fixed-shape forwards run: graph (CUDA graphs, the default on CUDA), "
                          "compile (torch.compile; on the CPU inductor's C++ with the weights frozen in, a compile "
                          "per model first), none (eager, the default elsewhere) or auto (on the CPU, whichever of "
                          "none and compile this machine measured faster for the pair and K, measured once and kept; "
                          "engine/cycle/capture_choice.py)")
    run.add_argument("--calibrate", action="store_true",
                     help="also time single steps and verify widths of both models (needed for c and speedups in stats)")
    run.add_argument("--tp", type=int, default=1,
                     help="shard the target over this many ranks with transformers' tensor-parallel plan; start one "
                          "process per rank with torchrun --nproc-per-node N -m engine run --tp N (docs/tensor-parallel.md)")
    run.add_argument("--tp-timeout", type=float, default=DEFAULT_TP_TIMEOUT_S,
                     help="under --tp: seconds a rank waits for the others before the run ends with an error "
                          "(a rank that died or hangs); it must cover rank 0 loading the draft")
    diagnose = sub.add_parser("diagnose", help="find why acceptance is low: paired runs of the same requests, each "
                                                "changing one thing (docs/diagnose.md)")
    add_pair_and_sampling(diagnose)
    diagnose.add_argument("--prompts", metavar="FILE", default=None,
                          help="the requests (a prompt file, as `run --prompts`; default: the bundled prompt set)")
    diagnose.add_argument("--per-category", type=int, default=None,
                          help="only the first N requests of each category (a quicker diagnosis)")
    diagnose.add_argument("--out", required=True, help="folder for the runs: one workload folder per arm")
    diagnose.add_argument("--resume", action="store_true", help="continue a diagnosis in --out")
    diagnose.add_argument("--only", default=None,
                          help="comma-separated experiments to run (names as the report prints them; "
                               "'probe' for the agreement probe)")
    diagnose.add_argument("--json", action="store_true", help="print the findings as one JSON object")
    # the intervals are over requests: many short requests tell more than a few long ones, for the same time
    diagnose.set_defaults(max_new_tokens=16)
    stats = sub.add_parser("stats", help="print acceptance, cost and speed statistics of a trace file, or of a "
                                         "workload (its folder or a zip of it)")
    stats.add_argument("trace", help="a trace (.jsonl), a workload folder, a zip of one, or a server workload folder "
                                     "(`engine client`: also the requests' sum against the server's counters)")
    stats.add_argument("--json", action="store_true",
                       help="print a workload's statistics as one JSON object (docs/workloads.md has its shape)")
    stats.add_argument("--prometheus", action="store_true",
                       help="print the trace's acceptance as vLLM's Prometheus counters instead")
    add_client_parser(sub)
    metrics = sub.add_parser("metrics", help="explain a server's speculative-decoding metrics (vLLM, SGLang, "
                                             "TensorRT-LLM); two vLLM /metrics scrapes give the time between; "
                                             "per-request output (responses) is also shown request by request")
    metrics.add_argument("files", nargs="+", help="one metrics file, or two Prometheus scrapes, earlier first")
    metrics.add_argument("--k", type=int, default=None, help="draft tokens per cycle, where the input gives none")
    metrics.add_argument("--c", type=float, default=None, help="cost ratio: one draft step / one target step")
    metrics.add_argument("--verify-steps", type=float, default=1.0,
                         help="one verify pass over K+1 positions, in target steps (default 1, Leviathan's assumption)")
    metrics.add_argument("--trace", default=None,
                         help="a trace to compare with; its calibration gives c and the verify cost unless --c is given")
    replica = sub.add_parser("replica", help="run a server workload's requests (`engine client`) through the lab's "
                                             "engine from the server's prompt ids, and compare step by step")
    replica.add_argument("folder", help="a server-workload folder (manifest.json, answers.jsonl)")
    replica.add_argument("--out", default=None,
                         help="the replica's workload folder, new or empty (default FOLDER/replica); under the app's "
                              "live runs' folder (runs/live/workloads/NAME) the Workload page lists it")
    return parser


def add_pair_and_sampling(run: argparse.ArgumentParser) -> None:
    """The pair, drafter, sampling and cache options `run` and `diagnose` share."""
    run.add_argument("--preset", choices=sorted(PRESETS), default=None,
                     help=f"offline model pair (default {DEFAULT_PRESET} when no models are named)")
    run.add_argument("--target", help="target model: hub id, local folder, or folder with a .gguf file")
    run.add_argument("--draft", help="draft model, same forms as --target (with --drafter other-tokenizer: "
                                     "a draft with its own tokenizer)")
    run.add_argument("--drafter", choices=list(DRAFTERS), default=None,
                     help="what proposes tokens (default: the preset's default drafter; a draft model when "
                          f"--target names the models): {drafters_in_words()}")
    for flag in all_flags():  # each drafter kind's own options (engine/drafters/registry.py)
        run.add_argument(flag.name, type=flag.type, choices=flag.choices or None, default=flag.default, help=flag.help)
    run.add_argument("--k", type=k_argument, default=4,
                     help="draft tokens per cycle, or auto (one prompt, a chain): the K advisor times both "
                          f"models on this machine, runs a short pilot at K={K_AUTO_PILOT} to measure acceptance, and runs "
                          "the K it predicts fastest, or decodes plainly (K=0) when no K beats plain decoding, saying why; "
                          "with --fast it times, pilots and runs the fast path's own forwards")
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
                          "so greedy speculation may part from plain greedy decoding; GPU only, but bfloat16 also on a CPU, "
                          "where it halves the bytes a step reads: with avx512_bf16 or AMX in hardware, elsewhere through "
                          "the engine's rows kernel (it needs a C compiler); best with --fast --capture compile, measured "
                          "in bench/step_limit.py)")
    run.add_argument("--target-weights", choices=TARGET_WEIGHTS, default=WEIGHTS_FLOAT32,
                     help="what the target's linear layers run on: float32 (the model as loaded), int4 (its GGUF "
                          "file's Q4_1 blocks, a Q8_0 output layer, as stored; CPU, float32 activations; a C "
                          "compiler builds the kernel once) or int4-a8 (the same blocks, each block of 32 "
                          "activations rounded to 8 bits first, as llama.cpp multiplies: faster, further from "
                          "float32). Each is its own target distribution")
    run.add_argument("--decoder", choices=DECODERS, default=DECODER_HF,
                     help="the code the target and a draft model run on: hf (Hugging Face's modules) or own (the "
                          "engine's own Llama-family decoder on the same weights, engine/models/llama.py; a model it "
                          "does not implement runs on hf and the trace says why). The EAGLE head keeps its own "
                          "module; not with --target-weights int4 or --tp")
    run.add_argument("--cache", choices=LAYOUTS, default="dynamic",
                     help="KV-cache layout of both models: dynamic (HF DynamicCache, crop the tail), static "
                          "(preallocated buffer, move the write position) or paged (vLLM-style blocks, free whole blocks)")
    run.add_argument("--block-size", type=int, default=16, help="slots per block of the paged layout")
    run.add_argument("--no-chat-template", action="store_true", help="feed the prompt as raw text")
    run.add_argument("--trust-remote-code", action="store_true", help="allow model code from the model folder")


def k_argument(text: str) -> int | str:
    """--k: a whole number, or auto (engine/cli/run.py run_k_auto)."""
    if text == K_AUTO:
        return K_AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a whole number nor {K_AUTO}") from None


def drafters_in_words() -> str:
    """The drafter kinds as the registry describes them: "a, b, c, or d"."""
    words = [spec.description for spec in DRAFTERS.values()]
    return ", ".join(words[:-1]) + ", or " + words[-1]


def cmd_run_or_workload(args) -> int:
    """`run --prompt` writes a trace (engine/cli/run.py), `run --prompts` a workload (engine/cli/workload.py),
    and so does `run --prompt --batch B` (the prompt B times, each with its own seed)."""
    if args.prompts or args.batch is not None:
        from engine.cli.workload import cmd_workload
        return cmd_workload(args)
    return cmd_run(args)


def cmd_diagnose(args) -> int:
    from engine.cli.diagnose import cmd_diagnose as run_diagnosis
    return run_diagnosis(args)


def cmd_client(args) -> int:
    from engine.cli.client import cmd_client as run_client
    return run_client(args)


def cmd_replica(args) -> int:
    from engine.cli.replica import cmd_replica as run_replica
    return run_replica(args)


COMMANDS = {"run": cmd_run_or_workload, "diagnose": cmd_diagnose, "stats": cmd_stats, "metrics": cmd_metrics,
            "client": cmd_client, "replica": cmd_replica}


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def kept_cycles(args, interrupted: bool = False) -> str:
    """Where a stopped run's finished cycles (or an interrupted client's finished requests) are, if it wrote any.
    A client's own failures say it themselves (engine/servers/client.py), its refusals before sending must not."""
    if args.command == "client":
        from engine.servers.server_workload import MANIFEST
        held = interrupted and os.path.isfile(os.path.join(args.out, MANIFEST))
        return f" (the finished requests are kept in {args.out}: the same command with --resume continues)" if held else ""
    if args.command != "run" or os.environ.get("RANK", "0") != "0":  # under torchrun only rank 0 writes a trace
        return ""
    if args.prompts or getattr(args, "batch", None) is not None:
        from engine.workload.manifest import MANIFEST
        held = os.path.isfile(os.path.join(args.out, MANIFEST))
        return f" (the finished requests are kept in {args.out}: the same command with --resume continues)" if held else ""
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
        report(err, f"\ninterrupted{kept_cycles(args, interrupted=True)}")
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
