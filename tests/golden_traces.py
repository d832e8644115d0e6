"""Golden traces: one small run per kind of cycle, drafter, layout and fault, with tiny random models.

A refactor of engine/ must leave every trace it writes the same, byte for byte, except its clock
readings. Each case below writes a trace (or, for the batched workload, a workload folder) with
the engine's public API and only the tiny models of tests/tiny.py and tests/eagle_tiny.py; its
normalised output (`normalise`) is stored in tests/golden/ and tests/test_golden_traces.py
compares a fresh run with it.

    python tests/golden_traces.py --write [FOLDER]     # default tests/golden/

writes every case's normalised output into FOLDER. The goldens were made from the code before the
refactor, run from its checkout, so that `engine` and `tests.tiny` are that checkout's:

    cd OLD_CHECKOUT && PYTHONPATH=OLD_CHECKOUT python NEW_CHECKOUT/tests/golden_traces.py --write DIR
"""
import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

# Run as a script, sys.path[0] is tests/ and the checkout's root is not on the path: it goes last, so that
# a PYTHONPATH naming another checkout (the one the goldens are made from) is imported first.
sys.path.append(str(Path(__file__).resolve().parent.parent))

# Each case imports the drafter, fault or workload code it runs where it runs it: while engine/ is being
# refactored a module broken midway fails the cases that use it, not the collection of every case.
import engine  # noqa: F401  (sets the offline default before transformers loads)
from engine.config import SpecSettings, parse_tree
from engine.cycle.pair import Pair
from engine.mode import RunMode
from engine.models.loading import wrap_model
from engine.run import run_to_trace
from tests.tiny import WORDS, noisy_pair, save_tiny, tiny_llama, tiny_pair, tiny_tokenizer

GOLDEN = Path(__file__).resolve().parent / "golden"
PROMPT = "the cat sat on a mat and then it"
LOOKUP_PROMPT = "the cat sat on a mat the cat sat on the"  # repeats, so the lookup matches from the first cycle
TOP_K = 4  # trace_top_k: four entries of each distribution keep the files small and still rank them

# ---------------------------------------------------------------- normalisation

TMP = "<tmp>"  # where a case's temporary folder appeared in a string
CREATED = "<created>"
MACHINE = "<machine>"
TIMESTAMP_KEYS = ("created",)  # wall-clock dates (engine/run.py make_header, engine/workload/run.py new_manifest)
# What describes the machine the run happened on, not what the engine computed: the CPU model and its
# flags and torch's thread count in a workload manifest ("machine"), a rank's host name under --tp, and
# the header's library versions (Python's patch release differs between machines; torch's build tag,
# +cpu or +cu128, with the wheel installed). Their keys stay, so a field added or dropped still shows.
MACHINE_KEYS = {"machine": ("cpu", "features", "threads"), "ranks": ("host",),
                "versions": ("python", "torch", "transformers")}


def is_timing(key: str) -> bool:
    """Every clock reading in a trace, a batch trace and a manifest ends in `_s`: *_time_s, *_times_s,
    wall_time_s, tokens_per_s, prefill_s (checked over every case's keys; no other key ends so)."""
    return key.endswith("_s")


def zeroed(value: Any) -> Any:
    """A timing's value with every number 0 (0 for an int, 0.0 for a float), its shape kept: a list of
    step times stays a list of as many zeros, a dict of times keeps its keys, a null stays null."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return 0
    if isinstance(value, float):
        return 0.0
    if isinstance(value, list):
        return [zeroed(v) for v in value]
    if isinstance(value, dict):
        return {k: zeroed(v) for k, v in value.items()}
    return value


def without_machine(key: str, value: Any) -> Any:
    """The machine-describing fields under `key` (MACHINE_KEYS) replaced by a placeholder, keys kept."""
    fields = MACHINE_KEYS[key]
    if isinstance(value, dict):
        return {k: MACHINE if k in fields else v for k, v in value.items()}
    if isinstance(value, list):
        return [without_machine(key, v) for v in value]
    return value


def normalise_value(value: Any, roots: tuple[str, ...]) -> Any:
    """One record's value made comparable between runs: see `normalise`."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if is_timing(k):
                out[k] = zeroed(v)
            elif k in TIMESTAMP_KEYS:
                out[k] = CREATED
            else:
                v = normalise_value(v, roots)
                out[k] = without_machine(k, v) if k in MACHINE_KEYS else v
        return out
    if isinstance(value, list):
        return [normalise_value(v, roots) for v in value]
    if isinstance(value, str):
        for root in roots:
            value = value.replace(root, TMP)
        return value
    return value


def normalise(text: str, roots: tuple[str, ...] = ()) -> str:
    """A trace file's text (JSON Lines, or one JSON document such as manifest.json) normalised so two
    runs of the same case give the same text: every timing (a key ending in `_s`, at any depth, see
    `is_timing`) has its numbers set to 0 with lists and dicts keeping their shape; `created` becomes
    a fixed string; the machine's CPU, flags, thread count, host names and library versions become a
    placeholder (MACHINE_KEYS); each of `roots` (the case's temporary folders) is replaced by a
    placeholder inside every string.
    Everything else is kept as it is, key order included. One record per line, written with
    json.dumps(..., ensure_ascii=False); a multi-line JSON document becomes one line."""
    try:
        records = [json.loads(text)]  # one document (manifest.json, or a trace of one line)
    except json.JSONDecodeError:
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
    return "".join(json.dumps(normalise_value(r, roots), ensure_ascii=False) + "\n" for r in records)


# ---------------------------------------------------------------- the pairs

def lookup_pair() -> Pair:
    """The tiny target with prompt lookup (n-grams 1 to 3), as tests/test_prompt_lookup.py builds it."""
    from engine.drafters.prompt_lookup import PromptLookupDrafter
    target = tiny_pair(0).target
    return Pair(target, None, set(), PromptLookupDrafter(target.full_vocab_size, 3, 1))


# The other-tokenizer draft's words: the target's strings under other ids, plus one the target lacks.
DRAFT_WORDS = ["<eos>"] + WORDS[1:][::-1] + ["bird"]


def other_tokenizer_pair(seed: int = 0, noise: float = 0.08) -> Pair:
    """A draft with its own vocabulary (DRAFT_WORDS) holding the target's weights moved to its ids, plus
    noise: it agrees with the target often, so cycles accept some re-encoded tokens and reject others."""
    from engine.drafters.other_tokenizer import OtherTokenizerDrafter
    target_model = tiny_llama(seed, 2, 32)
    draft_model = tiny_llama(seed + 3, 2, 32, vocab=len(DRAFT_WORDS))
    state = copy.deepcopy(target_model.state_dict())
    rows = torch.tensor([WORDS.index(w) if w in WORDS else 0 for w in DRAFT_WORDS])
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        state[name] = state[name][rows]
    gen = torch.Generator().manual_seed(seed + 3)
    with torch.no_grad():
        for key in state:
            state[key] = state[key] + noise * torch.randn(state[key].shape, generator=gen)
    draft_model.load_state_dict(state)
    target = wrap_model("tiny-target", target_model, tiny_tokenizer())
    draft = wrap_model("tiny-other-draft", draft_model.eval(), tiny_tokenizer(DRAFT_WORDS))
    return Pair(target, None, set(), OtherTokenizerDrafter(draft, target.tokenizer, target.full_vocab_size, 0))


def sampled(**changes: Any) -> SpecSettings:
    """The chain cases' settings: K 3, temperature 1, 14 tokens, seed 3, with `changes`."""
    return SpecSettings(**({"k": 3, "temperature": 1.0, "max_new_tokens": 14, "seed": 3, "trace_top_k": TOP_K}
                           | changes))


# A draft near the target (weight noise 0.3): cycles with none, some and all K accepted.
def chain_pair() -> Pair:
    return noisy_pair(0, noise=0.3)


# A closer draft for trees: paths of two and three nodes are accepted, so paths leave the first branch.
def tree_pair() -> Pair:
    return noisy_pair(1, noise=0.03)


# ---------------------------------------------------------------- the cases


def chain_sampled_dynamic(out: Path) -> None:
    run_to_trace(chain_pair(), PROMPT, sampled(), out, RunMode(), chat_template=False)


def chain_sampled_static(out: Path) -> None:
    run_to_trace(chain_pair(), PROMPT, sampled(cache_layout="static"), out, RunMode(), chat_template=False)


def chain_sampled_paged(out: Path) -> None:
    # Blocks of 4 slots: the 9-token prompt and 14 new tokens span several blocks, and rollbacks free some.
    run_to_trace(chain_pair(), PROMPT, sampled(cache_layout="paged", block_size=4), out, RunMode(), chat_template=False)


def chain_greedy(out: Path) -> None:
    # At T=0 the 0.3-noise draft's argmax never matches here; a closer draft gets some tokens accepted.
    run_to_trace(noisy_pair(0, noise=0.1), PROMPT, sampled(temperature=0.0, k=4), out, RunMode(), chat_template=False)


def fast_sampled(out: Path) -> None:
    run_to_trace(chain_pair(), PROMPT, sampled(), out, RunMode(fast="none"), chat_template=False)


def tree_static(out: Path) -> None:
    run_to_trace(tree_pair(), PROMPT, sampled(), out, RunMode(tree=parse_tree("static:3,2,1")), chat_template=False)


def tree_dynamic(out: Path) -> None:
    run_to_trace(tree_pair(), PROMPT, sampled(), out, RunMode(tree=parse_tree("dynamic:top_k=2,depth=3,nodes=6")),
                 chat_template=False)


def prompt_lookup(out: Path) -> None:
    run_to_trace(lookup_pair(), LOOKUP_PROMPT, sampled(seed=2), out, RunMode(), chat_template=False)


def other_tokenizer(out: Path) -> None:
    # Greedy: the other-tokenizer draft refuses sampling (its proposals have no distribution over the target's ids).
    run_to_trace(other_tokenizer_pair(), PROMPT, sampled(temperature=0.0, k=4), out, RunMode(), chat_template=False)


def eagle_chain(out: Path) -> None:
    from tests.eagle_tiny import random_eagle_pair
    # Temperature 2, as tests/eagle_tiny.py: the random head still gets none, some and all K accepted.
    run_to_trace(random_eagle_pair(0), PROMPT, sampled(temperature=2.0, seed=1), out, RunMode(), chat_template=False)


def eagle_tree(out: Path) -> None:
    from tests.eagle_tiny import random_eagle_pair
    run_to_trace(random_eagle_pair(0), PROMPT, sampled(temperature=2.0, seed=1), out,
                 RunMode(tree=parse_tree("static:2,2,1")), chat_template=False)


def fault_keep_rejected_kv(out: Path) -> None:
    from engine.teaching.faults import Faults
    run_to_trace(chain_pair(), PROMPT, sampled(), out, RunMode(faults=Faults(keep_rejected_kv=True)), chat_template=False)


def fault_tree_crop(out: Path) -> None:
    from engine.teaching.faults import TreeFaults
    run_to_trace(tree_pair(), PROMPT, sampled(), out,
                 RunMode(tree=parse_tree("static:3,2,1"), faults=TreeFaults(crop_instead_of_compact=True)),
                 chat_template=False)


# The engine's checkout: the folder `engine` was imported from, where torchrun's ranks run `-m engine`.
ROOT = Path(engine.__file__).resolve().parent.parent
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID")
TP_BOUND_S = 240  # two torch processes starting on a busy 2-core machine take 10-40 s; far past it means a hang
# Loaded from folders, the models stop at <eos> (id 0): seed 6 makes 5 cycles, with none, some and all K
# accepted, ending at an <eos>.
TP_ARGS = ["--tp", "2", "--prompt", PROMPT, "--no-chat-template", "--device", "cpu", "--k", "3", "--temperature", "1.0",
           "--max-new-tokens", "14", "--seed", "6", "--trace-top-k", str(TOP_K)]


def tp_unavailable() -> str | None:
    """Why the tensor-parallel case cannot run here, or None."""
    import torch.distributed as dist
    if not dist.is_available():
        return "this torch has no torch.distributed"
    if not dist.is_gloo_available():
        return "this torch has no gloo backend"
    return None


def tensor_parallel(out: Path) -> None:
    """`python -m engine run --tp 2` under torchrun, 2 gloo ranks on the CPU, launched as
    tests/test_tensor_parallel.py launches its ranks; the tiny models are saved to folders first, since
    every rank loads its shard of the target from disk."""
    models = out.parent / "tp-models"
    target, draft = save_tiny(tiny_pair(), models)
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    env |= {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "engine", "run", *TP_ARGS, "--target", target, "--draft", draft, "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TP_BOUND_S)
    if done.returncode != 0 or not out.is_file():
        raise RuntimeError(f"torchrun exited {done.returncode}:\n{done.stderr[-4000:]}")


# Five requests through two rows: rows take new requests as theirs finish, and at the end one row is idle.
REQUESTS = [{"id": "r1", "category": "pets", "prompt": "the cat sat on a mat"},
            {"id": "r2", "category": "pets", "prompt": "a dog ran"},
            {"id": "r3", "category": "logs", "messages": [{"role": "user", "content": "the log and then"}]},
            {"id": "r4", "category": "logs", "prompt": "it slept far away"},
            {"id": "r5", "category": "logs", "prompt": "the dog sat on a log and then it ran far away and"}]


def batched_workload(out: Path) -> None:
    from engine.workload.batched import run_batched_workload
    from engine.workload.prompts import parse_prompts
    requests = parse_prompts("\n".join(json.dumps(r) for r in REQUESTS).encode(), "prompts.jsonl")
    s = SpecSettings(k=3, temperature=0.9, top_k=8, max_new_tokens=10, seed=3, trace_top_k=TOP_K)
    run_batched_workload(noisy_pair(5, noise=0.05), requests, s, out, 2, prompts_name="prompts.jsonl",
                         chat_template=False)


@dataclass(frozen=True)
class Case:
    run: Callable[[Path], None]  # writes the trace file, or the workload folder, at the path it is given
    folder: bool = False  # a workload: a folder of files instead of one trace


CASES: dict[str, Case] = {
    "chain_sampled_dynamic": Case(chain_sampled_dynamic),
    "chain_sampled_static": Case(chain_sampled_static),
    "chain_sampled_paged": Case(chain_sampled_paged),
    "chain_greedy": Case(chain_greedy),
    "fast_sampled": Case(fast_sampled),
    "tree_static": Case(tree_static),
    "tree_dynamic": Case(tree_dynamic),
    "prompt_lookup": Case(prompt_lookup),
    "other_tokenizer": Case(other_tokenizer),
    "eagle_chain": Case(eagle_chain),
    "eagle_tree": Case(eagle_tree),
    "fault_keep_rejected_kv": Case(fault_keep_rejected_kv),
    "fault_tree_crop": Case(fault_tree_crop),
    "tensor_parallel": Case(tensor_parallel),
    "batched_workload": Case(batched_workload, folder=True),
}
TP_CASE = "tensor_parallel"


def generate(name: str, work: Path) -> dict[str, str]:
    """Run case `name` in the folder `work` (made if missing, and empty): {golden file name: its
    normalised text}. A trace is `<name>.jsonl`; a workload's files are `<name>/<file>`, every file
    the folder holds."""
    case = CASES[name]
    work.mkdir(parents=True, exist_ok=True)
    out = work / (name if case.folder else f"{name}.jsonl")
    case.run(out)
    roots = tuple(dict.fromkeys([str(work.resolve()), str(work)]))  # the longer, resolved form first
    files = sorted(p for p in out.rglob("*") if p.is_file()) if case.folder else [out]
    return {p.relative_to(work).as_posix(): normalise(p.read_text(encoding="utf-8"), roots) for p in files}


def read_golden(name: str, golden: Path = GOLDEN) -> dict[str, str]:
    """The stored files of case `name`, keyed as `generate` keys them."""
    if CASES[name].folder:
        files = sorted(p for p in (golden / name).rglob("*") if p.is_file())
    else:
        files = [p for p in [golden / f"{name}.jsonl"] if p.is_file()]
    return {p.relative_to(golden).as_posix(): p.read_text(encoding="utf-8") for p in files}


def write_golden(golden: Path, names: list[str]) -> None:
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"golden-{name}-") as work:
            for rel, text in generate(name, Path(work)).items():
                path = golden / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
                print(f"{path}: {len(text.encode()):,} bytes")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", nargs="?", const=str(GOLDEN), default=None, metavar="FOLDER",
                        help="write every case's normalised output into FOLDER (default tests/golden/)")
    parser.add_argument("--case", action="append", choices=list(CASES), help="only these cases (repeatable)")
    args = parser.parse_args(argv)
    if args.write is None:
        parser.error("nothing to do: pass --write [FOLDER]")
    # As the test session runs (tests/conftest.py): one torch thread, and no per-machine measurement file read.
    torch.set_num_threads(1)
    os.environ.setdefault("SPECLAB_LINEAR_PATHS", str(Path(tempfile.mkdtemp(prefix="golden-")) / "linear-paths.json"))
    write_golden(Path(args.write), args.case or list(CASES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
