"""Record the bundled diagnoses (assets/diagnoses/): both presets set correctly, each repeated with
another seed, and three chat runs mis-set on purpose, whose planted cause the diagnosis must rank first.

    python -m scripts.bundle_diagnoses [--only CASE] [--work FOLDER]

Each is `python -m engine diagnose` on two requests per category of the bundled prompt set, 24 new
tokens. A case keeps its findings as CASE.json and each arm's workload as CASE--ARM.zip (the app opens
their requests in the stepper). The repeats keep only their findings, in bench/results/, to check
that what a correct case finds, another seed finds too.
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

from engine.workload.folder import zip_folder

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "assets" / "diagnoses"
COMMON = ["--per-category", "2", "--max-new-tokens", "24"]
CHAT = ["--preset", "chat", "--temperature", "0.7", "--top-p", "0.9", "--k", "4"]
SHAKESPEARE = ["--preset", "tiny-shakespeare", "--temperature", "0.8", "--top-k", "20", "--k", "4"]
RANKED = "chat template,sampling filters,draft depth,drafter prompt-lookup,drafter eagle,probe"
CASES = {  # name: (arguments, planted cause or None, repeat of)
    "chat-set-correctly": (CHAT, None, None),
    "chat-set-correctly-seed-1": (CHAT + ["--seed", "1"], None, "chat-set-correctly"),
    "tiny-shakespeare-set-correctly": (SHAKESPEARE, None, None),
    "tiny-shakespeare-set-correctly-seed-1": (SHAKESPEARE + ["--seed", "1"], None, "tiny-shakespeare-set-correctly"),
    "chat-draft-without-chat-template": (CHAT + ["--draft-prompt", "raw", "--only", RANKED], "chat template", None),
    # top-k 1, as in vLLM #56724: the target keeps only its top token, the draft proposes from all of its own
    # (top-k 3 planted too little here: the chat draft puts most of its mass on its top 3 anyway)
    "chat-draft-ignores-top-k": (["--preset", "chat", "--temperature", "0.7", "--top-k", "1", "--k", "4",
                                  "--draft-filters", "temperature only", "--only", RANKED], "sampling filters", None),
    "chat-k-far-too-deep": (["--preset", "chat", "--temperature", "0.7", "--top-p", "0.9", "--k", "12",
                             "--only", RANKED], "draft depth", None),
}


def portable(found: dict) -> dict:
    """The findings with each arm's folder named by its arm alone (never this machine's paths)."""
    found["baseline"]["folder"] = "baseline"
    for f in found["findings"]:
        f["folder"] = f["arm"]
    return found


def refreshed(found: dict) -> dict:
    """The findings with each verdict written again by today's engine/diagnose/report.py from the stored
    numbers (the wording may change; the measurements do not)."""
    from engine.diagnose.experiments import Experiment
    from engine.diagnose.paired import Effect
    from engine.diagnose.report import Finding

    def effect(d: dict | None) -> Effect | None:
        return None if d is None else Effect(d["measure"], d["baseline"], d["variant"], d["difference"],
                                              None if d["interval"] is None else tuple(d["interval"]))

    for f in found["findings"]:
        x = Experiment(f["experiment"], f["kind"], f["now"], f["change"], None, f["skipped"] or "")
        f["verdict"] = Finding(x, f["folder"], effect(f["acceptance_rate"]), effect(f["tokens_per_s"]),
                               f["requests"], f["error"], effect(f.get("step_tokens_per_s"))).verdict()
    return found


def record(case: str, work: Path) -> dict:
    args, planted, repeat_of = CASES[case]
    folder = work / case
    command = [sys.executable, "-m", "engine", "diagnose", *args, *COMMON, "--out", str(folder), "--json"]
    if (folder / "baseline" / "manifest.json").is_file():
        command.append("--resume")
    print(" ".join(command), flush=True)
    found = portable(json.loads(subprocess.run(command, cwd=ROOT, check=True, capture_output=True, text=True).stdout))
    found["case"] = {"name": case, "arguments": args + COMMON, "planted": planted, "repeat_of": repeat_of}
    if repeat_of:
        (ROOT / "bench" / "results" / f"diagnose-repeat-{case}.json").write_text(json.dumps(found, indent=1))
        return found
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{case}.json").write_text(json.dumps(found, indent=1, ensure_ascii=False))
    for arm in ["baseline"] + [f["arm"] for f in found["findings"] if f["arm"] and not f["error"]]:
        (OUT / f"{case}--{arm}.zip").write_bytes(zip_folder(folder / arm))
    first = next((f for f in found["findings"] if f["kind"] == "cause"), None)
    print(f"{case}: first cause {first and first['experiment']}; planted {planted}", flush=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=sorted(CASES), action="append")
    parser.add_argument("--work", default="/tmp/speclab-diagnoses")
    parser.add_argument("--refresh-verdicts", action="store_true", help="rewrite the bundled cases' verdicts only")
    args = parser.parse_args()
    if args.refresh_verdicts:
        for path in sorted(OUT.glob("*.json")):
            path.write_text(json.dumps(refreshed(json.loads(path.read_text())), indent=1, ensure_ascii=False))
        return
    for case in args.only or CASES:
        record(case, Path(args.work))


if __name__ == "__main__":
    main()
