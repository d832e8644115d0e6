"""Results of the slow teaching runs, computed ahead of time for the bundled model pairs.

The rollback demo (three traced runs, and the tree runs of its last section) and the
exactness lab (hundreds of full cycles)
take tens of seconds on a small CPU. `scripts/make_teaching_results.py` runs them with
the real engine at each page's default settings and writes assets/teaching/results.json;
the pages show a stored result at once when the pair, prompt and settings match
exactly, and run anything else live behind a button. tests/test_precomputed.py
recomputes stored entries with the engine and compares.

Each entry also records how long it took, so a page can estimate a live run's time.
"""
import json
import statistics
from dataclasses import asdict
from pathlib import Path

import streamlit as st

from app.ui.state import CACHE_TTL_S, ROOT
from engine.teaching.exactness import ChiSquare, LabResult
from engine.teaching.runs import CacheView, Comparison, CycleProbe, RunLog
from engine.teaching.stale_slots import StaticCycle, StaticRun
from engine.teaching.tree_rollback import CacheCheck, TreeComparison, TreeCycleCheck, TreeRunLog

RESULTS_FILE = ROOT / "assets" / "teaching" / "results.json"
ROLLBACK, EXACTNESS, TREE_ROLLBACK = "rollback", "exactness", "tree-rollback"


def rollback_key(pair_key: str, prompt: str, settings: dict) -> str:
    return json.dumps([ROLLBACK, pair_key, prompt, settings], sort_keys=True)


def tree_rollback_key(pair_key: str, prompt: str, settings: dict, tree: dict) -> str:
    """The rollback page's tree section: `settings` with K = the tree's depth, `tree` = TreeSpec.describe()."""
    return json.dumps([TREE_ROLLBACK, pair_key, prompt, settings, tree], sort_keys=True)


def exactness_key(pair_key: str, prompt: str, settings: dict, rule: str, greedy: bool, n: int,
                  position: int) -> str:
    return json.dumps([EXACTNESS, pair_key, prompt, settings, rule, greedy, n, position], sort_keys=True)


# ---------------------------------------------------------------- to and from plain data

def comparison_to_dict(cmp: Comparison) -> dict:
    data = asdict(cmp)
    data["texts"] = {str(i): t for i, t in cmp.texts.items()}  # JSON keys are strings
    return data


def comparison_from_dict(data: dict) -> Comparison:
    def probe(p: dict) -> CycleProbe:
        return CycleProbe(**{**p, "target_cache": CacheView(**p["target_cache"]),
                             "draft_cache": CacheView(**p["draft_cache"])})

    runs = {mode: RunLog(**{**run, "cycles": [probe(p) for p in run["cycles"]]}) for mode, run in data["runs"].items()}
    return Comparison(data["prompt_ids"], data["settings"], data["reference"], runs,
                      {int(i): t for i, t in data["texts"].items()})


def tree_comparison_to_dict(cmp: TreeComparison) -> dict:
    data = asdict(cmp)
    data["texts"] = {str(i): t for i, t in cmp.texts.items()}
    return data


def tree_comparison_from_dict(data: dict) -> TreeComparison:
    def cycle(c: dict) -> TreeCycleCheck:
        return TreeCycleCheck(**{**c, "target": CacheCheck(**c["target"]), "draft": CacheCheck(**c["draft"])})

    runs = {mode: TreeRunLog(**{**run, "cycles": [cycle(c) for c in run["cycles"]]}) for mode, run in data["runs"].items()}
    return TreeComparison(data["prompt_ids"], data["settings"], data["tree"], data["reference"], runs,
                          {int(i): t for i, t in data["texts"].items()})


def static_from_dict(data: dict) -> StaticRun:
    return StaticRun(data["generated"], [StaticCycle(**c) for c in data["cycles"]])


def lab_to_dict(res: LabResult, texts: dict[int, str]) -> dict:
    """The result, plus the decoded text of the ids its histogram shows (no tokenizer needed to draw it)."""
    return {**asdict(res), "texts": {str(i): t for i, t in texts.items()}}


def lab_from_dict(data: dict) -> tuple[LabResult, dict[int, str]]:
    fields = {k: v for k, v in data.items() if k != "texts"}
    res = LabResult(**{**fields, "speculative_test": ChiSquare(**data["speculative_test"]),
                       "plain_test": ChiSquare(**data["plain_test"])})
    return res, {int(i): t for i, t in data["texts"].items()}


# ---------------------------------------------------------------- the stored file

@st.cache_data(max_entries=2, ttl=CACHE_TTL_S, show_spinner=False)  # one file, reread when it changes
def _entries(path: str, mtime_ns: int) -> dict[str, dict]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return {entry["key"]: entry for entry in data["entries"]}


def entries(path: Path | None = None) -> dict[str, dict]:
    """Stored entries by key; empty when the file is absent or unreadable (pages then run live)."""
    path = path or RESULTS_FILE
    try:
        return _entries(str(path), path.stat().st_mtime_ns)
    except (OSError, ValueError, KeyError):
        return {}


def find(key: str) -> dict | None:
    """A stored entry: {"key", "seconds", "made", "result"}, or None."""
    return entries().get(key)


def seconds_per_unit(kind: str, pair_key: str, units_of) -> float | None:
    """Recorded seconds per unit of work (a generated token, a sample) for this page and pair,
    the median over the stored entries; None if none was stored for it."""
    rates = []
    for entry in entries().values():
        kind_, pair = json.loads(entry["key"])[:2]
        if kind_ == kind and pair == pair_key and entry["seconds"] > 0:
            rates.append(entry["seconds"] / max(units_of(json.loads(entry["key"])), 1))
    return statistics.median(rates) if rates else None
