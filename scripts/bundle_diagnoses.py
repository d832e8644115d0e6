"""Record the diagnoses: the bundled cases (assets/diagnoses/) and the measurements behind the goals.

    python -m scripts.bundle_diagnoses [--only CASE] [--work FOLDER]

Bundled (each `python -m engine diagnose` on three requests per category of the bundled prompt set,
16 new tokens, distributions kept to their top 3): both presets set correctly, and three chat runs
mis-set on purpose, whose planted cause the diagnosis must put first. A case keeps its findings as
CASE.json and each arm's workload as CASE--ARM.zip (the app opens their requests in the stepper).

Measured only (findings in bench/results/diagnose-CASE.json, no traces): both presets set correctly
on the whole prompt set, each with another seed too, to check that what a correct case finds another
seed finds too, and how long a diagnosis of the whole set takes on this machine.
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from engine.models.machine import cpu_model
from engine.workload.folder import zip_folder

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "assets" / "diagnoses"
RESULTS = ROOT / "bench" / "results"
BUNDLED = ["--per-category", "3", "--max-new-tokens", "16", "--trace-top-k", "3"]
WHOLE_SET = ["--max-new-tokens", "16"]  # the defaults: every request of the bundled set
CHAT = ["--preset", "chat", "--temperature", "0.7", "--top-p", "0.9", "--k", "4"]
SHAKESPEARE = ["--preset", "tiny-shakespeare", "--temperature", "0.8", "--top-k", "20", "--k", "4"]
RANKED = "chat template,sampling filters,draft depth,drafter prompt-lookup,drafter eagle,probe"
CASES = {  # name: (arguments, planted cause or None, repeat of, bundled with its traces)
    # greedy: both arms then commit the target's own greedy text, so the paired difference is the draft's
    # agreement on the same path alone (sampled, the arms' texts part ways and the difference is noisier)
    "chat-draft-without-chat-template": (["--preset", "chat", "--temperature", "0", "--k", "4", "--draft-prompt", "raw",
                                          "--only", RANKED] + BUNDLED, "chat template", None, True),
    # top-k 1, as in vLLM #56724: the target keeps only its top token (so both arms commit its greedy text), the
    # draft proposes from all of its own. At temperature 1 the draft's mass on the target's token is 0.18 a
    # position against 0.29 agreement when it follows top-k (0.24 at temperature 0.7: too small a gap to show
    # on 30 requests; top-k 3 planted nothing, the chat draft puts most of its mass on its top 3 anyway)
    "chat-draft-ignores-top-k": (["--preset", "chat", "--temperature", "1.0", "--top-k", "1", "--k", "4",
                                  "--draft-filters", "temperature only", "--only", RANKED] + BUNDLED,
                                 "sampling filters", None, True),
    "chat-k-far-too-deep": (["--preset", "chat", "--temperature", "0.7", "--top-p", "0.9", "--k", "12",
                             "--only", RANKED] + BUNDLED, "draft depth", None, True),
    # an EAGLE-3 head handed the target's top state in place of its auxiliary layers (vLLM's use_aux_hidden_state
    # false); the context arm puts every draft past the head's trained length, which the report then counts
    "chat-eagle3-without-aux-states": (["--preset", "chat", "--drafter", "eagle3", "--temperature", "0", "--k", "3",
                                        "--eagle3-features", "top layer", "--only", "auxiliary states,context length"]
                                       + BUNDLED, "auxiliary states", None, True),
    "chat-set-correctly": (CHAT + BUNDLED, None, None, True),
    "tiny-shakespeare-set-correctly": (SHAKESPEARE + BUNDLED, None, None, True),
    "whole-set-tiny-shakespeare": (SHAKESPEARE + WHOLE_SET, None, None, False),
    "whole-set-tiny-shakespeare-seed-1": (SHAKESPEARE + WHOLE_SET + ["--seed", "1"], None,
                                          "whole-set-tiny-shakespeare", False),
    "whole-set-chat": (CHAT + WHOLE_SET, None, None, False),
    "whole-set-chat-seed-1": (CHAT + WHOLE_SET + ["--seed", "1"], None, "whole-set-chat", False),
}


def portable(found: dict) -> dict:
    """The findings with each arm's folder named by its arm alone (never this machine's paths)."""
    found["baseline"]["folder"] = "baseline"
    for f in found["findings"]:
        f["folder"] = f["arm"]
    return found


def refreshed(found: dict, baseline: Path) -> dict:
    """The findings with each verdict written again by today's engine/diagnose/report.py from the stored
    numbers (the wording may change; the measurements do not), and the K advisor's figures on the
    baseline's shipped traces where the file predates them (engine/diagnose/verdict.py advisor)."""
    from dataclasses import asdict

    from engine.diagnose.report import finding_of
    from engine.diagnose.verdict import advisor
    from engine.workload.folder import open_workload

    for f in found["findings"]:
        f["verdict"] = finding_of(f).verdict()
    if found.get("advisor") is None and baseline.is_file():
        advice = advisor(open_workload(baseline).runs())
        found = {"baseline": found["baseline"], "advisor": None if advice is None else asdict(advice)} | found
    return found


def first_change(found: dict) -> str | None:
    """The verdict's first change (engine/diagnose/verdict.py), read from the findings' dicts."""
    from engine.diagnose.verdict import Advice, verdict
    advice = Advice(**found["advisor"]) if found.get("advisor") else None
    faster = verdict(found["findings"], advice, found["baseline"]["requests"])
    return faster[0].name if faster else None


def record(case: str, work: Path) -> dict:
    args, planted, repeat_of, bundled = CASES[case]
    folder = work / case
    command = [sys.executable, "-m", "engine", "diagnose", *args, "--out", str(folder), "--json"]
    if (folder / "baseline" / "manifest.json").is_file():
        command.append("--resume")
    print(" ".join(command), flush=True)
    started = time.perf_counter()
    out = subprocess.run(command, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    found = portable(json.loads(out))
    found["case"] = {"name": case, "arguments": args, "planted": planted, "repeat_of": repeat_of,
                     "seconds": round(time.perf_counter() - started, 1), "cpu": cpu_model()}
    print(f"{case}: {found['case']['seconds']} s; change first: {first_change(found)}; planted {planted}", flush=True)
    if not bundled:
        (RESULTS / f"diagnose-{case}.json").write_text(json.dumps(found, indent=1, ensure_ascii=False))
        return found
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{case}.json").write_text(json.dumps(found, indent=1, ensure_ascii=False))
    for arm in ["baseline"] + [f["arm"] for f in found["findings"] if f["arm"] and not f["error"]]:
        (OUT / f"{case}--{arm}.zip").write_bytes(zip_folder(folder / arm))
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=sorted(CASES), action="append")
    parser.add_argument("--work", default="/tmp/speclab-diagnoses-2")
    parser.add_argument("--refresh-verdicts", action="store_true",
                        help="only rewrite the bundled cases' verdicts from their numbers (and add the advisor's "
                             "figures from their baseline traces)")
    args = parser.parse_args()
    if args.refresh_verdicts:
        for path in sorted(OUT.glob("*.json")):
            found = refreshed(json.loads(path.read_text()), OUT / f"{path.stem}--baseline.zip")
            path.write_text(json.dumps(found, indent=1, ensure_ascii=False))
        return
    for case in args.only or CASES:
        record(case, Path(args.work))


if __name__ == "__main__":
    main()
