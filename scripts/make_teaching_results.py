"""Precompute the slow teaching pages' results for the bundled tiny-shakespeare pair.

    python -m scripts.make_teaching_results            # writes assets/teaching/results.json

Runs the real engine at each page's default settings (the rollback demo's three runs, and its
tree section's two tree runs on the default tree; the exactness lab for every acceptance rule,
with and without a greedy draft, at the sample count the page sets for it, plus the full
2000-sample chi-square for each rule) and stores the results with the time each took.
`--only-rollback` and `--only-tree-rollback` recompute one entry and keep the file's others.
The pages show these at once when pair, prompt and settings match exactly;
tests/test_precomputed.py recomputes entries and compares them.
"""
import argparse
import dataclasses
import datetime
import json
import platform
import time
from pathlib import Path

import torch

from app.figures.teaching import histogram_entries
from app.runs import precomputed
from engine.config import SpecSettings, parse_tree
from engine.models.presets import PRESETS
from engine.run import encode_prompt, load_preset
from engine.teaching.exactness import next_token_probs, predicted_first_token, run_lab
from engine.teaching.faults import Faults
from engine.teaching.power import default_samples
from engine.teaching.runs import compare_runs
from engine.teaching.stale_slots import static_run
from engine.teaching.tree_rollback import DEFAULT_TREE, compare_tree_runs

PRESET = "tiny-shakespeare"
PAIR_KEY = f"preset:{PRESET}"  # as app/runs/teaching_pair.py names it
TOP_TOKENS = 20  # app/views/exactness_lab.py's TOP_TOKENS
RULES = ["ratio", "token_match", "no_residual", "p_target_only"]


def rollback_defaults() -> dict:
    """app/views/rollback_demo.py's form defaults."""
    return SpecSettings(k=4, temperature=0.0, seed=0, max_new_tokens=40).to_dict()


def tree_rollback_defaults() -> tuple[dict, dict]:
    """The rollback page's tree section at its defaults: (settings with K = the tree's depth, the tree)."""
    spec = parse_tree(DEFAULT_TREE)
    return {**rollback_defaults(), "k": spec.max_depth}, spec.describe()


def exactness_defaults() -> dict:
    """app/views/exactness_lab.py's form defaults."""
    return SpecSettings(k=1, temperature=1.0, top_k=0, seed=0).to_dict()


def exactness_runs(p_target: torch.Tensor, p_draft: torch.Tensor) -> list[tuple[str, bool, int]]:
    """(rule, greedy draft, samples): every rule at the count the page sets for it (the fewest
    that catch it with LAB_POWER, engine/teaching/power.py), and the full 2000-sample test."""
    runs = [(r, g, default_samples(predicted_first_token(p_target, p_draft, r, g), p_target))
            for r in RULES for g in (False, True)]
    return runs + [(r, False, 2000) for r in RULES if (r, False, 2000) not in runs]


def rollback_entry(pair, ids: list[int], prompt: str, made: str) -> dict:
    settings = rollback_defaults()
    start = time.perf_counter()
    cmp = compare_runs(pair, ids, SpecSettings(**settings))
    static = static_run(pair, ids, SpecSettings(**settings))  # the page's static-cache side-by-side
    entry = {"key": precomputed.rollback_key(PAIR_KEY, prompt, settings), "made": made,
             "seconds": time.perf_counter() - start, "result": precomputed.comparison_to_dict(cmp),
             "static": dataclasses.asdict(static)}
    print(f"rollback: {entry['seconds']:.1f} s", flush=True)
    return entry


def tree_rollback_entry(pair, ids: list[int], prompt: str, made: str) -> dict:
    settings, tree = tree_rollback_defaults()
    start = time.perf_counter()
    cmp = compare_tree_runs(pair, ids, SpecSettings(**settings), parse_tree(DEFAULT_TREE))
    entry = {"key": precomputed.tree_rollback_key(PAIR_KEY, prompt, settings, tree), "made": made,
             "seconds": time.perf_counter() - start, "result": precomputed.tree_comparison_to_dict(cmp)}
    print(f"tree rollback {DEFAULT_TREE}: {entry['seconds']:.1f} s, first divergence {cmp.first_divergence}",
          flush=True)
    return entry


def exactness_entries(pair, ids: list[int], prompt: str, made: str) -> list[dict]:
    settings = exactness_defaults()
    p_target, p_draft = next_token_probs(pair, ids, SpecSettings(**settings))
    entries = []
    for rule, greedy, n in exactness_runs(p_target, p_draft):
        start = time.perf_counter()
        res = run_lab(pair, ids, SpecSettings(**settings), Faults(acceptance_rule=rule, greedy_draft=greedy), n)
        texts = {i: pair.target.tokenizer.decode([i]) for i in histogram_entries(res, TOP_TOKENS)}
        entries.append({"key": precomputed.exactness_key(PAIR_KEY, prompt, settings, rule, greedy, n, 1),
                        "made": made, "seconds": time.perf_counter() - start,
                        "result": precomputed.lab_to_dict(res, texts)})
        print(f"exactness {rule} greedy={greedy} n={n}: {entries[-1]['seconds']:.1f} s, "
              f"p={res.speculative_test.p_value:.3g}", flush=True)
    return entries


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=precomputed.RESULTS_FILE)
    p.add_argument("--threads", type=int, default=1, help="torch threads (the app's live runs use 1)")
    only = p.add_mutually_exclusive_group()
    only.add_argument("--only-rollback", action="store_true",
                      help="recompute the rollback entry only, keeping the file's other entries")
    only.add_argument("--only-tree-rollback", action="store_true",
                      help="recompute the rollback page's tree entry only, keeping the file's other entries")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_preset(PRESET)
    prompt = PRESETS[PRESET].example_prompt
    ids = encode_prompt(pair.target.tokenizer, prompt, PRESETS[PRESET].use_chat_template)
    made = (f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d}, {platform.processor() or platform.machine()}, "
            f"{args.threads} torch thread(s), shared busy CPU")
    makers = {precomputed.ROLLBACK: lambda: [rollback_entry(pair, ids, prompt, made)],
              precomputed.TREE_ROLLBACK: lambda: [tree_rollback_entry(pair, ids, prompt, made)],
              precomputed.EXACTNESS: lambda: exactness_entries(pair, ids, prompt, made)}
    kinds = ([precomputed.ROLLBACK] if args.only_rollback else [precomputed.TREE_ROLLBACK] if args.only_tree_rollback
             else list(makers))
    entries = [e for kind in kinds for e in makers[kind]()]
    if len(kinds) < len(makers):  # keep the file's entries of the kinds not recomputed
        old = json.loads(args.out.read_text(encoding="utf-8"))["entries"]
        entries += [e for e in old if json.loads(e["key"])[0] not in kinds]

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"made_by": "scripts/make_teaching_results.py", "entries": entries}) + "\n",
                        encoding="utf-8")
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
