"""One rank of tests/test_tensor_parallel.py, started by torchrun: every case on one process group.

Rank 0 writes a trace per case into --out; every rank (rank 0 too) logs its target cache after
each rollback: its length, the token ids it holds K/V for, its layout state, its K/V heads, and
whether the layout's invariants (engine/kv/layouts.py `check_invariants`) hold. The test compares
all of it with a single-process run of the same settings.

Then rank 0 refuses an empty prompt while rank 1 waits (rank 1 must stop, told by rank 0), and
rank 1 alone is given a target folder it cannot load; rank 0 writes the error it reports.
Last, both ranks run the real command line (`python -m engine run --tp 2`, KILLED_RUN) on the
same group, and rank 1 kills itself with SIGKILL after the rollback of cycle 2 (tests/tp_fault.py).
Rank 0 writes what the command line printed on stderr and its exit code into --out. One launch
for all of it: each launch starts two processes that import torch, the slow part of this test.

torchrun starts it as a module from the repository root (`-m tests.tp_worker`), so the root is on
sys.path and `engine` and `tests` import as they are; importing engine sets the offline default.
"""
import argparse
import contextlib
import io
import json
import sys
from pathlib import Path
from typing import NamedTuple

import torch

from engine.config import SpecSettings
from engine.drafters.registry import DrafterOptions
from engine.kv.layouts import attended_kv, check_invariants, layout_state
from engine.kv.ops import cache_len
from engine.mode import RunMode
from engine.parallel.failure import GroupError
from engine.parallel.mirror import MirroredCache
from engine.parallel.rank import lead_pair, load_ranks, run_follower, run_lead
from engine.parallel.world import join_world
from engine.trace.schema import DRAFT_MODEL, PROMPT_LOOKUP
from tests.tp_fault import fail_after

PROMPT = "the cat sat on the mat and the dog"


class Case(NamedTuple):
    settings: SpecSettings
    calibrate: bool = False  # its timing caches are announced, filled and cropped like the run's own
    drafter: str = DRAFT_MODEL


# Greedy on every layout, one sampled run, and prompt lookup (a drafter without a model or a cache).
CASES = {
    "greedy-dynamic": Case(SpecSettings(k=3, temperature=0.0, max_new_tokens=16, seed=0)),
    "greedy-static": Case(SpecSettings(k=3, temperature=0.0, max_new_tokens=16, seed=0, cache_layout="static")),
    "greedy-paged": Case(SpecSettings(k=3, temperature=0.0, max_new_tokens=16, seed=0, cache_layout="paged",
                                      block_size=4)),
    "sampled": Case(SpecSettings(k=4, temperature=1.0, max_new_tokens=20, seed=5), calibrate=True),
    "prompt-lookup": Case(SpecSettings(k=3, temperature=1.0, max_new_tokens=16, seed=2), drafter=PROMPT_LOOKUP),
}


def drafter_options(case: Case, draft: str) -> DrafterOptions:
    return DrafterOptions(draft_model=draft) if case.drafter == DRAFT_MODEL else DrafterOptions(kind=case.drafter)


# The command line's arguments after `run` (then --target, --draft and --out); rank 1 dies after 3 rollbacks.
KILLED_RUN = ["--tp", "2", "--prompt", "the cat sat", "--no-chat-template", "--temperature", "0", "--k", "2",
              "--max-new-tokens", "30"]
KILLED_AFTER = 3


def cache_logger(path: Path):
    """An observer writing one JSON line per rollback of this rank's target cache."""
    log = path.open("w")

    def observe(rank: int, mirror: MirroredCache) -> None:
        try:
            check_invariants(mirror.cache)
            broken = None
        except AssertionError as err:
            broken = str(err) or "invariant broken"
        heads = attended_kv(mirror.cache)[0][0].shape[1]  # (1, H, T, D): the K/V heads this rank holds
        state = layout_state(mirror.cache)
        state.pop("events", None)  # a paged cache's event count is not part of the trace's state
        log.write(json.dumps({"rank": rank, "cache_id": mirror.cache_id, "length": cache_len(mirror.cache),
                              "tokens": mirror.tokens, "layout": state, "kv_heads": heads,
                              "broken": broken}) + "\n")
        log.flush()
    return observe


def shard_facts(target) -> dict:
    """What this rank's target holds: DTensor shards, and which module the engine's forwards run."""
    q_proj = target.model.model.layers[0].self_attn.q_proj.weight
    return {"weight_type": type(q_proj).__name__, "local_shape": list(q_proj.to_local().shape),
            "global_shape": list(q_proj.shape), "fast_linear": target.fast_linear,
            "runs_the_model_itself": target.runner is target.model}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--broken", required=True, help="a target folder whose weights cannot be read")
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    world = join_world(timeout_s=120)
    models = load_ranks(world, args.target, DrafterOptions(draft_model=args.draft))
    (out / f"shard.rank{world.rank}.json").write_text(json.dumps(shard_facts(models.target)))
    draft_model_pair = models.pair
    for name, case in CASES.items():
        observe = cache_logger(out / f"{name}.rank{world.rank}.jsonl")
        if world.is_lead:  # another drafter for the same shard: only rank 0 holds drafters
            models.pair = draft_model_pair if case.drafter == DRAFT_MODEL else lead_pair(
                models.target, models.lead, drafter_options(case, args.draft), False, None)
            run_lead(models, PROMPT, case.settings, out / f"{name}.jsonl", RunMode(calibrate=case.calibrate),
                     chat_template=False, observe=observe)
        elif run_follower(models, observe) != 0:
            return 2
    rank_0_refuses_the_prompt(world, models, out)
    one_rank_cannot_load(world, args, out)
    return killed_rank_run(world.rank, args, out)


def rank_0_refuses_the_prompt(world, models, out: Path) -> None:
    """Rank 0 fails on its own (an empty prompt) while the others wait for its first operation."""
    if world.is_lead:
        try:
            run_lead(models, "   ", CASES["greedy-dynamic"].settings, out / "refused.jsonl")
        except ValueError as err:
            (out / "refused.rank0.txt").write_text(str(err))
    else:
        (out / "refused.rank1.txt").write_text(f"follower exit code {run_follower(models)}")


def one_rank_cannot_load(world, args, out: Path) -> None:
    """Rank 1 is given a folder whose weights are broken (a node missing the files): every rank must
    stop at the same point, and rank 0 must name rank 1 and its reason."""
    folder = args.broken if world.rank == 1 else args.target
    try:
        load_ranks(world, folder, DrafterOptions(draft_model=args.draft))
    except GroupError as err:
        (out / f"broken-load.rank{world.rank}.txt").write_text(str(err))


def killed_rank_run(rank: int, args, out: Path) -> int:
    """The command line with rank 1 killed mid-run; rank 0 keeps its stderr and exit code for the test."""
    from engine.cli import main as cli_main
    argv = ["run", *KILLED_RUN, "--target", args.target, "--draft", args.draft, "--out", str(out / "killed.jsonl")]
    if rank == 1:
        fail_after(KILLED_AFTER, "kill")
        return cli_main(argv)
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = cli_main(argv)
    (out / "killed.result.json").write_text(json.dumps({"exit_code": code, "stderr": stderr.getvalue()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
