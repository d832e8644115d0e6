"""Python function calls per cycle of the engine's loop, counted by cProfile: a figure that does not move with a
busy machine, unlike seconds, so two checkouts' loops compare exactly.

    python bench/loop_calls.py --out FILE.json

On tiny-shakespeare, greedy, K = 4: batched speculation and plain batched decoding (calls per forward) at
B = 1, 4 and 16 over 16 requests x 32 tokens, and the one-request chain untraced at T = 0 and 1 over
3 requests x 64 tokens. Like bench/hot_loop.py it imports
only long-standing entry points, so it runs against an older checkout put first on the import path
(`PYTHONPATH=OLD python bench/loop_calls.py ...`). Most calls are the models' forwards; what a change
to the loop adds shows as the difference per cycle.
"""
import argparse
import cProfile
import json
import pstats
from collections.abc import Callable
from pathlib import Path

import torch

from engine.batch.cycle import batched_generate

try:  # where plain batched decoding lives now; before the one loop it had a module of its own
    from engine.cycle.plain import batched_plain_generate
except ImportError:
    from engine.batch.plain import batched_plain_generate
from engine.config import SpecSettings
from engine.cycle.reference import speculative_generate
from engine.run import load_preset
from engine.workload.run import bundled_prompt_ids


def calls_and_cycles(run: Callable[[], int]) -> dict:
    """Calls made by `run` (which returns its cycle count), after one run that warms every path."""
    run()
    profile = cProfile.Profile()
    profile.enable()
    cycles = run()
    profile.disable()
    calls = pstats.Stats(profile).total_calls
    return {"calls": calls, "cycles": cycles, "calls_per_cycle": calls / cycles}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    pair = load_preset("tiny-shakespeare")
    greedy = SpecSettings(k=4, temperature=0.0, max_new_tokens=32)
    prompts = bundled_prompt_ids(pair, 16, greedy)
    found = {}
    for b in (1, 4, 16):
        def batched(b: int = b) -> int:
            chunks = [prompts[i:i + b] for i in range(0, len(prompts), b)]
            return sum(len(batched_generate(pair, rows, greedy, list(range(len(rows))))[1]) for rows in chunks)
        found[f"batch B={b}"] = calls_and_cycles(batched)

        def plain(b: int = b) -> int:  # its "cycles" are its batched forwards
            chunks = [prompts[i:i + b] for i in range(0, len(prompts), b)]
            return sum(batched_plain_generate(pair.target, rows, greedy, list(range(len(rows))), pair.eos_ids).steps
                       for rows in chunks)
        found[f"plain batch B={b}"] = calls_and_cycles(plain)
    for t in (0.0, 1.0):
        s = SpecSettings(k=4, temperature=t, max_new_tokens=64)
        found[f"chain untraced T={t:g}"] = calls_and_cycles(
            lambda s=s: sum(len(list(speculative_generate(pair, ids, s, record=False))) for ids in prompts[:3]))
    Path(args.out).write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
