"""What running a workload costs against the same requests run one by one, model loading aside.

    python -m bench.workload_cost --preset tiny-shakespeare [--requests 20] [--repeats 3] [--max-new-tokens 32]

One loaded pair. "Workload": engine/workload/run.py's run_workload over N requests of the bundled
prompt set (it also encodes every prompt first and rewrites the manifest after each request).
"One by one": engine.run.run_to_trace per request into its own file, as N `engine run` commands
would do after loading. Both greedy; the two orders alternate over the repeats and the ratio of
wall times (workload / one by one) is reported per repeat with its spread. Each request's output
is checked equal between the two, and (on the first --exact requests) to plain greedy decoding.
Writes bench/results/workload-cost-PRESET-CPU.json and .md.
"""
import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import RESULTS, cpu_tag, machine_info, machine_words, write_results
from engine.config import SpecSettings
from engine.cycle.plain import target_generate
from engine.run import encode_prompt, load_preset, run_to_trace
from engine.workload.prompts import read_prompts
from engine.workload.run import run_workload

ROOT = Path(__file__).resolve().parents[1]
PROMPT_SET = ROOT / "assets" / "prompts" / "categories.jsonl"


def pick(requests: list, n: int) -> list:
    """n requests spread over the categories (the file lists them category by category)."""
    step = max(1, len(requests) // n)
    return requests[::step][:n]


def as_workload(pair, requests, s, work: Path) -> tuple[float, list[list[int]]]:
    folder = work / f"workload-{time.perf_counter_ns()}"
    start = time.perf_counter()
    workload = run_workload(pair, requests, s, folder)
    seconds = time.perf_counter() - start
    return seconds, [r.trace.summary["generated_token_ids"] for r in workload.runs()]


def one_by_one(pair, requests, s, work: Path) -> tuple[float, list[list[int]]]:
    folder = work / f"single-{time.perf_counter_ns()}"
    outputs, start = [], time.perf_counter()
    for i, r in enumerate(requests):
        trace = run_to_trace(pair, r.text, s, folder / f"{i}.jsonl", messages=r.messages)
        outputs.append(trace.summary["generated_token_ids"])
    return time.perf_counter() - start, outputs


def exact_against_plain(pair, requests, s, count: int) -> int:
    """How many of the first `count` requests' greedy outputs equal plain greedy decoding's."""
    same = 0
    for r in requests[:count]:
        ids = encode_prompt(pair.target.tokenizer, r.text, True, r.messages)
        plain = target_generate(pair.target, ids, s, pair.eos_ids)
        traced = run_to_trace(pair, r.text, s, Path(tempfile.mkdtemp()) / "t.jsonl", messages=r.messages)
        same += traced.summary["generated_token_ids"] == plain
    return same


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="tiny-shakespeare")
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--exact", type=int, default=5, help="requests also checked against plain greedy decoding")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    pair = load_preset(args.preset)
    requests = pick(read_prompts(PROMPT_SET), args.requests)
    s = SpecSettings(k=args.k, temperature=0.0, max_new_tokens=args.max_new_tokens)
    work = Path(tempfile.mkdtemp(prefix="speclab-workload-cost-"))
    run_to_trace(pair, requests[0].text, s, work / "warm.jsonl")  # first-call costs out of the way
    rounds = []
    for i in range(args.repeats):
        order = (("workload", as_workload), ("one by one", one_by_one))
        times, outputs = {}, {}
        for name, run in (order if i % 2 == 0 else order[::-1]):
            times[name], outputs[name] = run(pair, requests, s, work)
        assert outputs["workload"] == outputs["one by one"], "a request's output differs between the two"
        rounds.append({"workload_s": times["workload"], "one_by_one_s": times["one by one"],
                       "ratio": times["workload"] / times["one by one"]})
    exact = exact_against_plain(pair, requests, s, args.exact)
    shutil.rmtree(work, ignore_errors=True)
    ratios = [r["ratio"] for r in rounds]
    import torch
    machine = machine_info(torch.get_num_threads())
    result = {"machine": machine, "preset": args.preset, "requests": len(requests), "settings": s.to_dict(),
              "rounds": rounds, "median_ratio": statistics.median(ratios), "min_ratio": min(ratios),
              "max_ratio": max(ratios), "outputs_equal": True, "exact_vs_plain": f"{exact}/{min(args.exact, len(requests))}"}
    text = "\n".join([
        f"## Workload cost: {args.preset}, {len(requests)} requests, K={args.k}, greedy, {args.max_new_tokens} new tokens",
        f"Machine: {machine_words(machine)}", "",
        "| round | workload s | one by one s | ratio |", "|---:|---:|---:|---:|",
        *[f"| {i + 1} | {r['workload_s']:.2f} | {r['one_by_one_s']:.2f} | {r['ratio']:.3f} |" for i, r in enumerate(rounds)],
        "", f"Median ratio {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}); goal <= 1.05. "
        f"Every request's output was equal in both; {result['exact_vs_plain']} checked equal to plain greedy decoding."])
    write_results(Path(args.out), f"workload-cost-{args.preset}-{cpu_tag(machine)}", result, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
