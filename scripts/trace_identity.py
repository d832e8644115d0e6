"""Do two checkouts write the same traces? A refactor's check that behaviour is unchanged.

`write FOLDER` runs a fixed set of runs (chain and tree, every drafter, every cache layout,
--fast on the CPU, teaching faults, --tp 2 under gloo) from the checkout it is run in and writes
each trace to FOLDER with what legitimately differs between two runs taken out: the header's
`created` time and every timing (keys ending in `_s`, the summary's tokens/s). Run it in two
checkouts, then `compare A B`: it prints, per trace, whether the normalised lines are equal byte
for byte (or, failing that, as parsed JSON: the same keys and values in another order), and the
number of cycle records compared.

    python -m scripts.trace_identity write /tmp/before      # in the old checkout
    python -m scripts.trace_identity write /tmp/after       # in the new one
    python -m scripts.trace_identity compare /tmp/before /tmp/after
"""
import json
import subprocess
import sys
from pathlib import Path

SHAKESPEARE = ["--preset", "tiny-shakespeare", "--prompt", "ROMEO:\n", "--max-new-tokens", "64"]
CHAT = ["--preset", "chat", "--prompt", "Name three colours of the rainbow.", "--max-new-tokens", "40"]

# name -> the arguments of `python -m engine run` after the preset's
CLI_RUNS = {
    "sh-greedy-k4": [*SHAKESPEARE, "--k", "4", "--temperature", "0"],
    "sh-sampled-k4": [*SHAKESPEARE, "--k", "4", "--temperature", "1", "--seed", "1"],
    "sh-static-k3": [*SHAKESPEARE, "--k", "3", "--temperature", "0.8", "--cache", "static"],
    "sh-paged-k5": [*SHAKESPEARE, "--k", "5", "--temperature", "1", "--cache", "paged", "--block-size", "4"],
    "sh-topk-topp": [*SHAKESPEARE, "--k", "3", "--temperature", "0.9", "--top-k", "20", "--top-p", "0.9"],
    "sh-prompt-lookup": [*SHAKESPEARE, "--drafter", "prompt-lookup", "--k", "4", "--temperature", "0"],
    "sh-other-tokenizer": [*SHAKESPEARE, "--drafter", "other-tokenizer", "--k", "6", "--temperature", "0"],
    "sh-fast-greedy": [*SHAKESPEARE, "--fast", "--k", "4", "--temperature", "0"],
    "sh-fast-sampled": [*SHAKESPEARE, "--fast", "--k", "3", "--temperature", "1", "--seed", "3"],
    "sh-tree-static": [*SHAKESPEARE, "--tree", "static:2,2,1", "--temperature", "0"],
    "sh-tree-dynamic-paged": [*SHAKESPEARE, "--tree", "dynamic:top_k=3,depth=4,nodes=8", "--temperature", "1",
                              "--cache", "paged", "--block-size", "4"],
    "sh-tree-static-static": [*SHAKESPEARE, "--tree", "static:3,1", "--temperature", "1", "--cache", "static"],
    "chat-sampled-k4": [*CHAT, "--k", "4", "--temperature", "0.7"],
    "chat-eagle-greedy": [*CHAT, "--drafter", "eagle", "--k", "4", "--temperature", "0"],
    "chat-eagle-tree": [*CHAT, "--drafter", "eagle", "--tree", "dynamic:top_k=3,depth=4,nodes=10", "--temperature", "1"],
    "chat-prompt-lookup-static": [*CHAT, "--drafter", "prompt-lookup", "--k", "4", "--temperature", "0",
                                  "--cache", "static"],
}
TP_RUN = ("sh-tp2", [*SHAKESPEARE, "--k", "4", "--temperature", "1", "--seed", "2", "--tp", "2"])


def normalise(value):
    """The value without timings and creation time (keys ending in _s, tokens_per_s, created)."""
    if isinstance(value, dict):
        return {k: normalise(v) for k, v in value.items()
                if not (k.endswith("_s") or k in ("created", "calibration", "linear_paths"))}
    if isinstance(value, list):
        return [normalise(v) for v in value]
    return value


def write_normalised(trace: Path, out: Path) -> None:
    lines = [json.dumps(normalise(json.loads(line))) for line in trace.read_text().splitlines() if line.strip()]
    out.write_text("\n".join(lines) + "\n")


def run_cli(name: str, args: list[str], folder: Path, launcher: list[str]) -> None:
    raw = folder / "raw" / f"{name}.jsonl"
    done = subprocess.run([*launcher, "-m", "engine", "run", *args, "--out", str(raw)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    write_normalised(raw, folder / f"{name}.jsonl")
    print(f"{name}: done", flush=True)


def fault_runs(folder: Path) -> None:
    """Teaching faults reach no CLI flag: run them through the API, old or new."""
    from engine.config import SpecSettings, TreeSpec
    from engine.run import load_preset, run_to_trace
    from engine.teaching.faults import Faults, TreeFaults

    pair = load_preset("tiny-shakespeare")
    runs = {
        "sh-fault-keep-kv": (Faults(keep_rejected_kv=True), None),
        "sh-fault-no-catch-up": (Faults(skip_draft_catch_up=True), None),
        "sh-fault-p-target-only": (Faults(acceptance_rule="p_target_only"), None),
        "sh-fault-greedy-draft": (Faults(greedy_draft=True, acceptance_rule="no_residual"), None),
        "sh-fault-tree-crop": (TreeFaults(crop_instead_of_compact=True), TreeSpec("static", (2, 2))),
    }
    for name, (faults, tree) in runs.items():
        s = SpecSettings(k=4 if tree is None else 2, temperature=0.0 if tree else 1.0, max_new_tokens=64, seed=5)
        raw = folder / "raw" / f"{name}.jsonl"
        try:  # the one run mode of the refactored engine
            from engine.mode import RunMode
            run_to_trace(pair, "ROMEO:\n", s, raw, RunMode(tree=tree, faults=faults), preset="tiny-shakespeare")
        except ImportError:
            extra = {"tree": tree, "tree_faults": faults} if tree else {"rule": faults}
            run_to_trace(pair, "ROMEO:\n", s, raw, "tiny-shakespeare", **extra)
        write_normalised(raw, folder / f"{name}.jsonl")
        print(f"{name}: done", flush=True)


def write(folder: Path) -> None:
    (folder / "raw").mkdir(parents=True, exist_ok=True)
    for name, args in CLI_RUNS.items():
        run_cli(name, args, folder, [sys.executable])
    fault_runs(folder)
    run_cli(*TP_RUN, folder, [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"])


def compare(a: Path, b: Path) -> int:
    names = sorted(p.name for p in a.glob("*.jsonl"))
    total, different = 0, []
    for name in names:
        left, right = (a / name).read_text(), (b / name).read_text() if (b / name).exists() else ""
        records = sum(1 for line in left.splitlines() if '"type": "cycle"' in line)
        total += records
        if left == right:
            verdict = "identical"
        elif [json.loads(x) for x in left.splitlines()] == [json.loads(x) for x in right.splitlines()]:
            verdict = "same values, keys in another order"
        else:
            verdict = "DIFFERENT"
            different.append(name)
        print(f"{name:34s} {records:4d} cycle records  {verdict}")
    print(f"{len(names)} traces, {total} cycle records; {len(different)} different")
    return 1 if different else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        write(Path(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        raise SystemExit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        raise SystemExit(__doc__)
