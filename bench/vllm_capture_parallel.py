"""The capture plugin under vLLM's parallel settings, on this machine's CPU: which process writes, and whether
the traces equal a single process's.

    python -m bench.vllm_capture_parallel                    # 10 bundled prompts, 48 tokens, n-gram K=3

For each setting (one process; tensor parallel 2 and 3; pipeline parallel 2, with the capture on and off; data
parallel 2) vLLM serves the chat
target with n-gram speculation and SPECLAB_CAPTURE_DIR set, `engine client` sends the prompts greedy, and the
server is stopped. Then: every captured folder opens as a workload (every trace checked by load_trace); each
request's captured drafts and accepted counts equal the server's own per-step metrics; the committed tokens
equal the answers'; and the answers equal the single process's. A setting vLLM refuses on this machine is
reported with the line it printed. Results: bench/results/vllm-capture-parallel-<cpu>.json and .md.
"""
import argparse
import json
import re
import time
from pathlib import Path

import torch

from bench.common import RESULTS, cpu_tag, machine_info, machine_words, write_results
from bench.vllm_replica import matches_server
from engine.cli import main as engine_main
from engine.models.presets import smollm2_folder
from engine.replica.server_workload import read_server_workload
from engine.servers.launch import NGRAM_K3, ServerStartError, start_vllm
from engine.workload.folder import open_folder

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "assets" / "prompts" / "categories.jsonl"
# vLLM's CPU build binds each worker's threads to a NUMA node of its own unless told which cores each takes
# (VLLM_CPU_OMP_THREADS_BIND, one list per worker, split by "|"); this machine has one node. The chat target
# has 9 attention heads: tensor parallelism needs a size that divides 9, so 3 (two workers share a core here).
SETTINGS = {"one process": ([], {}),
            "tensor parallel 2": (["--tensor-parallel-size", "2"], {}),
            "tensor parallel 3": (["--tensor-parallel-size", "3"], {"VLLM_CPU_OMP_THREADS_BIND": "0|1|1"}),
            "pipeline parallel 2": (["--pipeline-parallel-size", "2"], {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}),
            "pipeline parallel 2, capture off": (["--pipeline-parallel-size", "2"],
                                                 {"VLLM_CPU_OMP_THREADS_BIND": "0|1", "SPECLAB_CAPTURE_DIR": ""}),
            "data parallel 2": (["--data-parallel-size", "2"], {"VLLM_CPU_OMP_THREADS_BIND": "0|1"})}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=10, help="the first N prompts of the bundled set")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--work", type=Path, default=Path("/tmp/speclab-vllm-capture-parallel"))
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--only", action="append", choices=list(SETTINGS), help="run only these settings")
    return p.parse_args(argv)


def first_error(log: Path) -> str | None:
    """The first exception the server's log names at the start of a line (`SomethingError: why`, vLLM's prefix
    cut), with the line after it when that says why (pydantic's "Value error, ...")."""
    lines = [re.sub(r"^\(.*?\) ERROR .*?\] ", "", line).strip() for line in log.read_text(errors="replace").splitlines()]
    for i, line in enumerate(lines):
        if re.match(r"[\w.]*Error: ", line):
            more = lines[i + 1] if i + 1 < len(lines) and lines[i + 1].startswith("Value error") else ""
            return f"{line} {more}".strip()[:300]
    return None


def serve(name: str, extra: list[str], env: dict, work: Path, prompts: Path, max_tokens: int) -> dict:
    folder, captured = work / name.replace(" ", "-"), work / name.replace(" ", "-") / "captured"
    folder.mkdir(parents=True)
    started = time.perf_counter()
    try:
        server = start_vllm(smollm2_folder(), NGRAM_K3, model_name="smollm2", log=folder / "server.log",
                            extra_args=extra, env={"SPECLAB_CAPTURE_DIR": str(captured)} | env)
    except ServerStartError as err:
        return {"started": False, "why": first_error(folder / "server.log") or " ".join(str(err).split())[-300:]}
    up_s = time.perf_counter() - started
    try:
        code = engine_main(["client", "--url", server.url, "--prompts", str(prompts), "--out", str(folder / "served"),
                            "--max-tokens", str(max_tokens), "--temperature", "0", "--concurrency", "2",
                            "--speculative-config", json.dumps(NGRAM_K3)])
    finally:
        server.stop()
    if code != 0:
        return {"started": True, "up_s": up_s, "client_exit": code}
    return {"started": True, "up_s": up_s} | check(folder / "served", captured)


def check(served_folder: Path, captured: Path) -> dict:
    """Each answer against its captured trace (matched by prompt ids): drafts, accepted counts, tokens."""
    served = read_server_workload(served_folder)
    traces, listed = {}, 0
    if (captured / "manifest.json").is_file():  # none with the capture off
        workload = open_folder(captured)  # every trace checked, as any workload's
        traces = {tuple(t.header["prompt_token_ids"]): t for t in (workload.trace(e) for e in workload.done)}
        listed = len(workload.entries)
    equal = 0
    for a in served.answers:
        t = traces.get(tuple(a.prompt_ids))
        if t is None:
            continue
        equal += matches_server(t, a)
    return {"requests": len(served.answers), "captured": len(traces), "listed": listed,
            "equal_to_server": equal, "answers": {a.request.id: a.token_ids for a in served.answers}}


def report(result: dict) -> str:
    lines = ["# The vLLM capture plugin under parallel settings (n-gram K=3, greedy)", "",
             machine_words(result["machine"]), "",
             f"vLLM {result['vllm']} on the chat target's float32 copy, the capture on; {result['requests']} bundled "
             f"prompts, at most {result['max_tokens']} tokens, two at a time (`engine client`).", "",
             "| setting | started | up in | traces listed | captured | equal to the server's metrics "
             "| answers equal one process's |",
             "|---|---|---|---|---|---|---|"]
    one = result["settings"].get("one process", {}).get("answers")
    for name, r in result["settings"].items():
        if not r.get("started"):
            lines.append(f"| {name} | no | - | - | - | - | - |")
            continue
        if "captured" not in r:
            lines.append(f"| {name} | yes | {r['up_s']:.0f} s | - | client exit {r.get('client_exit')} | - | - |")
            continue
        same = "-" if one is None else ("yes" if r["answers"] == one else "no")
        lines.append(f"| {name} | yes | {r['up_s']:.0f} s | {r['listed']} | "
                     f"{r['captured']} of {r['requests']} | {r['equal_to_server']} of {r['requests']} | {same} |")
    refused = [(n, r["why"]) for n, r in result["settings"].items() if not r.get("started")]
    if refused:
        lines += ["", "Settings vLLM did not start here, with the first exception its log names:", ""]
        lines += [f"- {n}: `{why}`" for n, why in refused]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    args = parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=False)
    lines = [line for line in PROMPTS.read_text().splitlines() if line.strip()][: args.requests]
    prompts = args.work / "prompts.jsonl"
    prompts.write_text("\n".join(lines) + "\n")
    settings = {}
    for name in args.only or SETTINGS:
        print(f"{name} ...", flush=True)
        settings[name] = serve(name, *SETTINGS[name], args.work, prompts, args.max_tokens)
        print(f"{name}: {json.dumps({k: v for k, v in settings[name].items() if k != 'answers'})}", flush=True)
    result = {"machine": machine_info(torch.get_num_threads()), "vllm": "vllm-cpu 0.32.0", "requests": len(lines),
              "max_tokens": args.max_tokens, "speculative_config": NGRAM_K3, "settings": settings}
    write_results(args.out, f"vllm-capture-parallel-{cpu_tag(result['machine'])}", result, report(result))
    print(report(result))


if __name__ == "__main__":
    main()
