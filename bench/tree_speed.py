"""Chain against tree on one pair: tokens per cycle, draft forwards, verify cost and speed.

    python -m bench.tree_speed --preset tiny-shakespeare
    python -m bench.tree_speed --preset chat --trees static:2,2,1 dynamic:top_k=3,depth=3,nodes=8

Methods, each generating exactly --max-new-tokens tokens (no EOS stop) from the same prompt ids,
interleaved per repeat as bench/speed.py does (bench/common.interleaved_rates):
  chain      our engine, tracing on, a draft-model chain of K = the deepest tree's depth, so
             chain and tree make the same number of draft forwards per cycle (one per depth)
  tree:SPEC  our engine, tracing on, the tree SPEC (engine/tree/)
  d          Hugging Face plain decoding, target.generate without an assistant
  advised    with --advise: the tree (or chain) the tree advisor picks (engine/stats/tree_plan.py) from a
             calibration by width and a chain pilot on the first prompt, once per temperature; its
             predicted speedup over plain decoding is reported beside the measured one
Rates are end to end (prefill included), medians over repeats; ratios are paired within a repeat.
Tokens per cycle, nodes and verify milliseconds come from the traces the engine wrote.
Results: bench/results/tree-speed-NAME.json and .md.
"""
import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from bench import common, hf
from engine.config import SpecSettings, TreeSpec, parse_tree
from engine.cycle.pair import Pair
from engine.mode import RunMode
from engine.models.device import pick_device, timed
from engine.run import TREE_DRAFT_WIDTHS, encode_prompt, run_to_trace
from engine.stats.calibrate import TREE_WIDTHS, calibrate_widths
from engine.stats.tree_plan import plan_tree
from engine.trace.format import load_trace

DEFAULT_TREES = ("static:2,2,1", "static:3,2,1", "dynamic:top_k=3,depth=3,nodes=8")
CHAIN, PLAIN, ADVISED = "chain", "d", "advised"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.add_pair_arguments(p)
    p.add_argument("--name", help="results name (default: the preset)")
    p.add_argument("--trees", nargs="+", default=list(DEFAULT_TREES), help="tree specs, as engine run --tree takes")
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--out", default=str(common.RESULTS))
    p.add_argument("--note", default="", help="conditions of the run (e.g. other processes on the machine)")
    p.add_argument("--advise", action="store_true", help="also run the tree advisor's pick (method 'advised')")
    args = p.parse_args(argv)
    common.check_pair_arguments(p, args)
    return args


class TreeRunner:
    """Runs one method on one prompt; keeps the traces, per method, for the per-cycle figures."""

    def __init__(self, pair: Pair, preset: str | None, chat: bool, trees: dict[str, TreeSpec], folder: Path):
        self.pair, self.preset, self.chat, self.trees, self.folder = pair, preset, chat, trees, folder
        hf.no_eos(pair.target.model)
        self.traces: dict[str, list[Path]] = {m: [] for m in [CHAIN, *trees]}

    def run(self, method: str, prompt: str, ids: list[int], s: SpecSettings) -> tuple[int, float]:
        if method == PLAIN:
            torch.manual_seed(s.seed)
            return timed(lambda: len(hf.hf_generate(self.pair.target.model, ids, s)), self.pair.target.device)
        path = self.folder / f"{len(sum(self.traces.values(), []))}.jsonl"
        self.traces[method].append(path)
        tree = self.trees.get(method)
        return timed(lambda: run_to_trace(self.pair, prompt, s, path, RunMode(tree=tree), preset=self.preset,
                                          chat_template=self.chat).summary["num_generated"], self.pair.target.device)


def per_cycle(paths: list[Path]) -> dict:
    """Means over every cycle of a method's traces."""
    cycles = [c for p in paths for c in load_trace(p).cycles]
    return {"cycles": len(cycles),
            "tokens_per_cycle": statistics.mean(len(c["committed_token_ids"]) for c in cycles),
            "accepted_per_cycle": statistics.mean(c["num_accepted"] for c in cycles),
            "verify_positions": statistics.mean(c["verify_positions"] for c in cycles),
            "draft_forwards_per_cycle": statistics.mean(len(c["draft_step_times_s"]) for c in cycles),
            "verify_ms": 1000 * statistics.median(c["verify_time_s"] for c in cycles),
            "draft_ms": 1000 * statistics.median(c["draft_time_s"] for c in cycles),
            "cycle_ms": 1000 * statistics.median(c["cycle_time_s"] for c in cycles)}


def advised_tree(pair: Pair, ids: list[int], s: SpecSettings) -> tuple[TreeSpec | None, dict]:
    """The tree advisor's pick for these settings, measured on this machine (None: a chain or plain)."""
    calibration = calibrate_widths(pair, ids, s, TREE_WIDTHS, draft_widths=TREE_DRAFT_WIDTHS)
    plan = plan_tree(pair, ids, s, calibration)
    best = plan.advice.best
    return plan.tree, {"sentence": plan.sentence, "pick": best.text, "predicted_speedup": best.speedup,
                       "predicted_tokens_per_cycle": best.tokens_per_cycle, "k": plan.k}


def bench_temperature(pair: Pair, args, temperature: float, trees: dict[str, TreeSpec], chat: bool) -> dict:
    prompts = common.prompts_for(args.preset, args.prompts)
    ids = [encode_prompt(pair.target.tokenizer, p, chat) for p in prompts]
    advice = None
    if args.advise:
        base = SpecSettings(k=4, temperature=temperature, max_new_tokens=args.max_new_tokens, seed=0)
        tree, advice = advised_tree(pair, ids[0], base)
        print(f"  T={temperature}: {advice['sentence']}", flush=True)
        if tree is not None:
            trees = {**trees, ADVISED: tree}
    depth = max(t.max_depth for t in trees.values())
    s = SpecSettings(k=depth, temperature=temperature, max_new_tokens=args.max_new_tokens, seed=0)
    runner = TreeRunner(pair, args.preset, chat, trees, Path(tempfile.mkdtemp(prefix="speclab-tree-bench-")))
    methods = [CHAIN, *trees, PLAIN]
    for method in methods:  # warm-up: first calls pay for allocations and lazy imports
        runner.run(method, prompts[0], ids[0], s)
    runner.traces = {m: [] for m in runner.traces}
    rates = common.interleaved_rates(runner.run, methods, prompts, ids, s, args.repeats, f"T={temperature}")
    out = {"temperature": temperature, "chain_k": depth, "rates": rates, "advice": advice,
           "median_tokens_per_s": {m: statistics.median(r) for m, r in rates.items()},
           "x_plain": {m: common.paired_ratio(rates, m, PLAIN) for m in methods if m != PLAIN},
           "x_chain": {m: common.paired_ratio(rates, m, CHAIN) for m in trees},
           "per_cycle": {m: per_cycle(p) for m, p in runner.traces.items()}}
    chain_tpc = out["per_cycle"][CHAIN]["tokens_per_cycle"]
    out["tokens_per_cycle_x_chain"] = {m: out["per_cycle"][m]["tokens_per_cycle"] / chain_tpc for m in trees}
    return out


def report(name: str, machine: dict, args, results: list[dict]) -> str:
    lines = [f"## Chain against tree: {name} (bench/tree_speed.py)", "",
             f"Machine: {common.machine_words(machine)}; torch {machine['torch']}, transformers "
             f"{machine['transformers']}; {machine['date']}. {args.note}".rstrip(), "",
             f"{args.prompts} prompts x {args.repeats} repeats, {args.max_new_tokens} new tokens each, no EOS stop. "
             "tokens/s: medians over repeats, end to end; x plain and x chain: paired within a repeat.", ""]
    for r in results:
        lines += [f"### T={r['temperature']:g} (chain K={r['chain_k']})", "",
                  "| method | tokens/s | x HF plain | x chain | tokens/cycle | x chain tokens/cycle | verify positions "
                  "| draft forwards/cycle | verify ms | draft ms | cycle ms |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for m, pc in r["per_cycle"].items():
            x_chain = r["x_chain"].get(m)
            tpc_x = r["tokens_per_cycle_x_chain"].get(m)
            lines.append(f"| {m} | {r['median_tokens_per_s'][m]:.1f} | {r['x_plain'][m]:.2f} | "
                         f"{'' if x_chain is None else f'{x_chain:.2f}'} | {pc['tokens_per_cycle']:.2f} | "
                         f"{'' if tpc_x is None else f'{tpc_x:.2f}'} | {pc['verify_positions']:.1f} | "
                         f"{pc['draft_forwards_per_cycle']:.1f} | {pc['verify_ms']:.1f} | {pc['draft_ms']:.1f} | "
                         f"{pc['cycle_ms']:.1f} |")
        lines += [f"| {PLAIN} (HF plain) | {r['median_tokens_per_s'][PLAIN]:.1f} | 1.00 | | | | | | | | |", ""]
        if r["advice"]:
            a = r["advice"]
            measured = r["x_plain"].get(ADVISED)
            lines += [f"Tree advisor: {a['sentence']}", ""]
            if measured is not None:
                lines += [f"Advised {a['pick']}: predicted {a['predicted_speedup']:.2f}x plain decoding (the engine's own "
                          f"step), measured {measured:.2f}x HF plain: measured / predicted "
                          f"{measured / a['predicted_speedup']:.0%}.", ""]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    device = pick_device(None)
    pair, chat = common.load_bench_pair(args, str(device), None)
    trees = {f"tree:{t}": parse_tree(t) for t in args.trees}
    machine = common.machine_info(args.threads, device)
    results = [bench_temperature(pair, args, float(t), trees, chat) for t in args.temperatures.split(",")]
    name = args.name or args.preset or "custom"
    result = {"machine": machine, "note": args.note, "trees": args.trees, "results": results}
    common.write_results(Path(args.out), f"tree-speed-{name}", result, report(name, machine, args, results))
    print(report(name, machine, args, results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
