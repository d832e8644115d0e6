"""One CPU against the "K+1 positions for the price of one" goals, in one run, for the chat target.

    python -m bench.cpu_report --threads 2
    python -m bench.cpu_report --threads 2 --llama-python VENV/bin/python   # adds llama.cpp on the same GGUF
    python -m bench.cpu_report --parts forwards --repeats 10                # the forward table alone

Parts (`--parts`, default all):
  forwards  one target forward over 1..6 positions against the memory limit (weight bytes / measured copy
            bandwidth), for float32, bfloat16 (where the CPU computes in it or the rows kernel builds) and the
            int4 GGUF blocks, with float32 activations (int4) and 8-bit ones (int4-a8): every linear path at
            every width (bench/step_limit.py's timing, eager, --decoder), and the per-width choice the engine
            would make (the fastest path at that width). A verify of w positions is then that forward's time over
            the 1-position one, in steps.
  int4      bench.speed on the int4 blocks, greedy: the engine's plain decoding (e) against llama.cpp's of the
            same file (f, with --llama-python), and speculation at the advisor's K (a/e).
  chat      bench.speed in float32, greedy, --k auto: a/e at the advisor's K. Where the advisor says plain
            decoding (K=0) the engine decodes plainly, so a/e at the advisor's choice is 1.0 by construction;
            the file also keeps the best K's measured a/e.

The goals it is read against (docs/benchmarks.md): a float32 step at most 2x its memory limit; a verify of up
to 5 positions at most 1.2 steps; int4 plain at least llama.cpp's; a/e at the advisor's K at least 1.0.

Writes RESULTS/cpu-report-CPU.json and .md; the speed parts also leave bench.speed's own files beside them.
"""
import argparse
import json
import time
from pathlib import Path

import torch

from bench import common, speed
from bench.fast_bench import measured_bandwidth_gbs, weight_bytes
from bench.step_limit import time_dynamic
from engine.models import f32_rows_kernel, linear_paths
from engine.models.machine import cpu_features, load_average
from engine.run import load_preset
from engine.trace.schema import (
    AS_LOADED,
    DECODER_HF,
    DECODERS,
    GGUF_WEIGHTS,
    PACKED,
    ROWS,
    WEIGHTS_FLOAT32,
    WEIGHTS_INT4,
    WEIGHTS_INT4_A8,
)

PARTS = ("forwards", "int4", "chat")
WIDTHS = range(1, 7)  # a decode step and verifies of K = 1..5
INT4, INT4_A8 = "int4", "int4-a8"
GGUF_KINDS = {INT4: WEIGHTS_INT4, INT4_A8: WEIGHTS_INT4_A8}  # weights kind -> the target weights it loads
GOAL_STEP = 2.0  # x the memory limit
GOAL_VERIFY = 1.2  # steps, for up to 5 positions


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=20, help="forwards per path and width (medians)")
    p.add_argument("--decoder", choices=DECODERS, default=DECODER_HF, help="the code the forwards run on")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    p.add_argument("--llama-python", default=None, help="a Python with llama-cpp-python (bench/build_llama_cpp.sh)")
    p.add_argument("--speed-repeats", type=int, default=3)
    p.add_argument("--note", default="", help="conditions of the run")
    p.add_argument("--out", default=str(common.RESULTS))
    args = p.parse_args(argv)
    args.parts = [x for x in args.parts.split(",") if x]
    unknown = set(args.parts) - set(PARTS)
    if unknown:
        p.error(f"unknown parts {sorted(unknown)}: choose from {', '.join(PARTS)}")
    return args


def kinds_here() -> list[str]:
    """float32, int4 and int4-a8 everywhere; bfloat16 where the CPU computes in it natively or the rows kernel reads it
    (widening each weight to float32); elsewhere torch emulates it, slower than float32, which says nothing
    about the weights read."""
    features = cpu_features()
    bf16 = "avx512_bf16" in features or "amx_tile" in features or f32_rows_kernel.unavailable() is None
    return ["float32", *(["bfloat16"] if bf16 else []), INT4, INT4_A8]


def paths_for(target) -> list[str]:
    if target.weights in GGUF_WEIGHTS:
        return [AS_LOADED]  # int4 has its one kernel
    rows = [ROWS] if f32_rows_kernel.unavailable() is None else []
    return [AS_LOADED, *([PACKED] if target.dtype == torch.float32 else []), *rows]  # packing takes float32


def forwards(kind: str, args) -> dict:
    """Every path at every width for one weights kind, with the per-width choice and the memory limit."""
    weights = GGUF_KINDS.get(kind, WEIGHTS_FLOAT32)
    pair = load_preset("chat", device="cpu", dtype_name=None if kind in GGUF_KINDS else kind, target_weights=weights,
                       decoder=args.decoder)
    target = pair.target
    step_bytes = target.gguf_weights.weight_bytes if kind in GGUF_KINDS else weight_bytes(target.model)
    bandwidth = measured_bandwidth_gbs(torch.device("cpu"), False)
    # the rows kernel's variant per width as the engine chooses it here (its measurement, kept per machine)
    variants = (linear_paths.settle(target) or {}).get("rows_variants", {}) if weights == WEIGHTS_FLOAT32 else {}
    by_width = {}
    for width in WIDTHS:
        by_width[width] = {path: time_dynamic(target, path, width, args.repeats) for path in paths_for(target)}
    target.linear_paths = None
    chosen = {w: min(paths, key=lambda p: paths[p]["median_s"]) for w, paths in by_width.items()}
    step_s = by_width[1][chosen[1]]["median_s"]
    return {"kind": kind, "decoder": target.decoder, "weight_bytes": step_bytes, "bandwidth_gbs": bandwidth,
            "rows_variants": variants,
            "memory_limit_s": step_bytes / (bandwidth * 1e9), "by_width": by_width, "chosen": chosen,
            "verify_steps": {w: by_width[w][chosen[w]]["median_s"] / step_s for w in WIDTHS}}


def speed_part(extra: list[str], args, out: Path) -> dict:
    """bench.speed's chat run with `extra` arguments, greedy; its result file read back."""
    # named by CPU, so one machine's figures never overwrite another's
    argv = ["--preset", "chat", "--temperatures", "0", "--k", "auto", "--threads", str(args.threads),
            "--repeats", str(args.speed_repeats), "--out", str(out), "--name", f"chat-{args.cpu}", *extra]
    speed.main(argv)
    name = speed.results_name(speed.parse_args(argv))
    result = json.loads((out / f"speed-{name}.json").read_text())
    s = result["settings"][0]
    advised = (s.get("pilot") or {}).get("advised_k")
    a_over_e = s["ratios"].get("a/e")
    return {"file": f"speed-{name}.md", "k": s["k"], "advised_k": advised, "alpha": s["alpha"],
            "tokens_per_s": s["tokens_per_s"], "a_over_e": a_over_e,
            "a_over_e_at_advised": 1.0 if advised == 0 else a_over_e, "e_over_f": s["ratios"].get("e/f"),
            "anchor": result.get("anchor"), "anchor_skipped": result.get("anchor_skipped")}


def measure(args) -> dict:
    torch.set_num_threads(args.threads)
    args.cpu = common.cpu_tag(common.machine_info(args.threads))
    out = Path(args.out)
    started = time.perf_counter()
    result = {"machine": common.machine_info(args.threads), "repeats": args.repeats, "note": args.note,
              "forwards": [], "int4_speed": None, "chat_speed": None}
    if "forwards" in args.parts:
        result["forwards"] = [forwards(kind, args) for kind in kinds_here()]
    if "int4" in args.parts:
        llama = ["--llama-python", args.llama_python] if args.llama_python else []
        result["int4_speed"] = speed_part(["--target-weights", "int4", "--decoder", args.decoder, *llama], args, out)
    if "chat" in args.parts:
        result["chat_speed"] = speed_part(["--decoder", args.decoder], args, out)
    return result | {"wall_s": time.perf_counter() - started, "load_after": load_average()}


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def forwards_markdown(f: dict) -> list[str]:
    limit = f["memory_limit_s"]
    paths = list(f["by_width"][1])
    lines = [f"### {f['kind']} ({f['weight_bytes'] / 1e6:.0f} MB; memory limit {ms(limit)} ms at "
             f"{f['bandwidth_gbs']:.1f} GB/s; {f['decoder']} decoder, eager)", "",
             "| positions | " + " | ".join(f"{p} (ms)" for p in paths) + " | chosen | x memory limit | steps |",
             "|---|" + "---|" * (len(paths) + 3)]
    for w, times in f["by_width"].items():
        cells = " | ".join(f"{ms(times[p]['median_s'])} ({ms(times[p]['low_s'])}-{ms(times[p]['high_s'])})"
                           for p in paths)
        best = times[f["chosen"][w]]["median_s"]
        lines.append(f"| {w} | {cells} | {f['chosen'][w]} | {best / limit:.2f} | {f['verify_steps'][w]:.2f} |")
    step = f["by_width"][1][f["chosen"][1]]["median_s"] / limit
    worst = max(f["verify_steps"][w] for w in range(2, 6))
    judged = f" (goal {GOAL_STEP:g}x: {'met' if step <= GOAL_STEP else 'not met'})" if f["kind"] == "float32" else ""
    lines += ["", f"Step: {step:.2f}x its memory limit{judged}. Verify of 2-5 positions: at most {worst:.2f} steps "
                  f"(goal {GOAL_VERIFY:g}: {'met' if worst <= GOAL_VERIFY else 'not met'}).", ""]
    if f.get("rows_variants"):
        chosen = ", ".join(f"{w}: {v}" for w, v in f["rows_variants"].items() if int(w) in f["by_width"])
        lines += [f"The rows kernel's variant per width, as the engine measured and chose it here: {chosen}.", ""]
    return lines


def speed_markdown(title: str, s: dict | None) -> list[str]:
    if s is None:
        return []
    rates = ", ".join(f"{m} {v:.1f}" for m, v in s["tokens_per_s"].items())
    lines = [f"### {title} (`{s['file']}`)", "", f"tokens/s: {rates} (bench/speed.py's methods).",
             f"K run: {s['k']} (the advisor's pick: {'plain decoding, K=0' if s['advised_k'] == 0 else s['advised_k']}); "
             f"alpha {s['alpha']:.2f}; a/e {s['a_over_e']:.2f} at K={s['k']}, "
             f"{s['a_over_e_at_advised']:.2f} at the advisor's choice."]
    if s["e_over_f"] is not None:
        lines.append(f"Engine plain against llama.cpp plain on the same GGUF (e/f): {s['e_over_f']:.2f}.")
    elif s.get("anchor_skipped") and s["file"].endswith("-int4.md"):  # llama.cpp runs the GGUF file only
        lines.append(f"llama.cpp did not run: {s['anchor_skipped']}")
    return lines + [""]


def markdown(r: dict) -> str:
    m = r["machine"]
    lines = ["## The chat target on this CPU (bench/cpu_report.py)", "",
             f"Machine: {common.machine_words(m)}; torch {m['torch']}; {m['date']}. 1-minute load {r['load_after']} "
             f"at the end; {r['wall_s'] / 60:.0f} minutes in all." + (f" {r['note']}" if r["note"] else ""), "",
             f"Forwards: medians of {r['repeats']} after 3 warm-ups, middle half in brackets, 64 cached positions. "
             "`chosen` is the fastest path at that width (what the engine's per-width choice picks when its own "
             "measurement agrees); `steps` is the chosen forward over the chosen 1-position one.", ""]
    for f in r["forwards"]:
        lines += forwards_markdown(f)
    lines += speed_markdown("int4 blocks: plain against llama.cpp, and speculation", r["int4_speed"])
    lines += speed_markdown("float32 chat speculation at the advisor's K", r["chat_speed"])
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    result = measure(args)
    text = markdown(result)
    common.write_results(Path(args.out), f"cpu-report-{common.cpu_tag(result['machine'])}", result, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
