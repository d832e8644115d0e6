"""Record the bundled workloads (assets/workloads/*.zip): the whole prompt set on each shipped pair.

    python -m scripts.bundle_workloads [--only NAME] [--work FOLDER]

Each is an ordinary `python -m engine run --prompts ...` (greedy, calibrated once, small top-k lists
so the zips stay small), zipped with engine/workload/folder.py zip_folder. Run it on a quiet
machine: the traces keep their timings. Requests too long for a pair are skipped and listed.
The batched ones (--batch 4, docs/batching.md) run the same requests four at a time, with continuous
batching; greedy, so each request commits what its unbatched run commits. A batch runs in one go:
no calibration, no --resume.
"""
import argparse
import subprocess
import sys
from pathlib import Path

from engine.workload.folder import zip_folder

ROOT = Path(__file__).resolve().parents[1]
PROMPT_FILES = ("assets/prompts/categories.jsonl", "assets/prompts/long-context.jsonl")
COMMON = ["--temperature", "0", "--k", "4", "--max-new-tokens", "48", "--trace-top-k", "3", "--calibrate",
          "--skip-too-long"]
WORKLOADS = {
    "chat-draft-model-greedy-k4": ["--preset", "chat", "--drafter", "model"],
    "chat-prompt-lookup-greedy-k4": ["--preset", "chat", "--drafter", "prompt-lookup"],
    "tiny-shakespeare-greedy-k4": ["--preset", "tiny-shakespeare"],
    # named to sort after the unbatched ones: the Workload page opens the first bundled workload
    "chat-draft-model-k4-batch-4-greedy": ["--preset", "chat", "--drafter", "model", "--batch", "4"],
    "tiny-shakespeare-k4-batch-4-greedy": ["--preset", "tiny-shakespeare", "--batch", "4"],
}


def prompt_set(work: Path) -> Path:
    """The categories and the long-context requests as one file."""
    path = work / "prompt-set.jsonl"
    path.write_text("".join((ROOT / f).read_text() for f in PROMPT_FILES), encoding="utf-8")
    return path


def record(name: str, work: Path, prompts: Path) -> Path:
    folder = work / name
    batched = "--batch" in WORKLOADS[name]
    resume = ["--resume"] if (folder / "manifest.json").is_file() and not batched else []
    common = [a for a in COMMON if a != "--calibrate"] if batched else COMMON
    command = [sys.executable, "-m", "engine", "run", "--prompts", str(prompts), "--out", str(folder),
               *WORKLOADS[name], *common, *resume]
    print(" ".join(command), flush=True)
    subprocess.run(command, cwd=ROOT, check=True)
    out = ROOT / "assets" / "workloads" / f"{name}.zip"
    out.write_bytes(zip_folder(folder))
    print(f"{out.relative_to(ROOT)}: {out.stat().st_size / 2**20:.2f} MiB", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=sorted(WORKLOADS), action="append")
    parser.add_argument("--work", default="/tmp/speclab-workloads")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    prompts = prompt_set(work)
    for name in args.only or WORKLOADS:
        record(name, work, prompts)


if __name__ == "__main__":
    main()
