"""Diagnoses the app can show: the bundled cases and this server's live ones.

A diagnosis is `engine diagnose`'s dict (engine/diagnose/diagnosis.py `Diagnosis.as_dict()`) beside
one workload per arm, so every figure comes with the traces behind it:

- bundled: SPECLAB_DIAGNOSES_DIR (default assets/diagnoses/) holds <case>.json and, per arm,
  <case>--<arm>.zip, opened as workloads of kind "diagnosis" (app/ui/state.py; the Workload page
  does not list them);
- live: <live runs>/diagnoses/<name>.json, its arms ordinary live workloads <name>-<arm>.

Named by (kind, name) as workloads are: ("bundled", case) or ("run", name). A diagnosis file is
untrusted: its size is checked before it is read, then every field the page draws (`check`); an
arm's name must be a plain name, never a path. Every text from it reaches the page through md()
or esc(). What the page says of a finding is worded again from its checked numbers by the engine
(engine/diagnose/report.py), never read from the file's own words; what to change first is ranked
at read time (engine/diagnose/verdict.py), from the file's advisor figures or, in a file written
before it held them, from the baseline arm's traces.
"""
import json
import math
import re
from pathlib import Path

import streamlit as st

from app.ui import state, workloads
from engine.diagnose import verdict as ranking
from engine.diagnose.experiments import ALTERNATIVE, CAUSE, JUDGED_BY, PROPERTY, TUNING
from engine.diagnose.report import finding_of
from engine.diagnose.trained_length import MAX_TRAINED_POSITIONS
from engine.diagnose.vocab import MOST_MISSED
from engine.trace import TraceError
from engine.trace.json_lines import finite
from engine.trace.metrics import drafted

OPEN = "diagnose_open"  # session_state: the (kind, name) the Diagnose page shows
KIND_WORDS = {"bundled": "example", "run": "live run"}
KINDS = (CAUSE, TUNING, ALTERNATIVE, PROPERTY)
BASELINE = "baseline"
SEP = "--"  # a bundled arm's zip: <case>--<arm>.zip
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,119}")  # a case's, a live diagnosis's or an arm's name
MAX_BYTES = 4 * 2**20  # a diagnosis of the whole prompt set is a few kB; its probe a few more
MAX_TEXT = 2000  # characters of one text field (a verdict, an error)


class DiagnosisError(ValueError):
    """A diagnosis file the page will not draw, in one line."""


def is_name(name: object) -> bool:
    return isinstance(name, str) and NAME.fullmatch(name) is not None and SEP not in name


def live_dir() -> Path:
    return state.runs_dir() / "diagnoses"


def folder(kind: str) -> Path:
    return state.diagnoses_dir() if kind == "bundled" else live_dir()


def path(choice: tuple[str, str]) -> Path:
    kind, name = choice
    if kind not in KIND_WORDS or not is_name(name):
        raise DiagnosisError(f"no such diagnosis: {name!r}")
    return folder(kind) / f"{name}.json"


def listed() -> list[tuple[str, str]]:
    """The bundled cases by name, then this server's live diagnoses, newest first."""
    found = []
    for kind in KIND_WORDS:
        where = folder(kind)
        if not where.is_dir():
            continue
        files = [p for p in where.glob("*.json") if is_name(p.stem) and p.is_file() and not p.is_symlink()]
        files.sort(key=(lambda p: p.name) if kind == "bundled" else (lambda p: -p.stat().st_mtime_ns))
        found += [(kind, p.stem) for p in files]
    return found


def words(choice: tuple[str, str]) -> str:
    return f"{choice[1]} ({KIND_WORDS[choice[0]]})"


def arm_workload(choice: tuple[str, str], arm: str) -> tuple[str, str]:
    """The workload (kind, name) that holds an arm's traces."""
    kind, name = choice
    if not is_name(arm):
        raise DiagnosisError(f"{arm!r} is not an arm's name")
    return ("diagnosis", f"{name}{SEP}{arm}.zip") if kind == "bundled" else ("run", f"{name}-{arm}")


def has_arm(choice: tuple[str, str], arm: str | None) -> bool:
    """Whether the arm's traces are here (a skipped experiment has none; a case may ship without some)."""
    if arm is None:
        return False
    where = state.workload_path(*arm_workload(choice, arm))
    return (where / "manifest.json").is_file() if choice[0] == "run" else where.is_file()


def case_of(workload: tuple[str, str]) -> tuple[str, str] | None:
    """The bundled diagnosis an arm's workload belongs to (the stepper's way back), or None."""
    kind, name = workload
    case = name.removesuffix(".zip").split(SEP)[0]
    return ("bundled", case) if kind == "diagnosis" and is_name(case) else None


# ---------------------------------------------------------------- reading and checking

def load(choice: tuple[str, str]) -> dict:
    """The checked diagnosis; DiagnosisError (one line) if it cannot be drawn."""
    where = path(choice)
    if not where.is_file() or where.is_symlink():
        raise DiagnosisError(f"diagnosis not found: {choice[1]}")
    stat = where.stat()
    if stat.st_size > MAX_BYTES:
        raise DiagnosisError(f"{choice[1]}: {stat.st_size:,} bytes is more than a diagnosis has "
                             f"({MAX_BYTES // 2**20} MiB at most)")
    return _load(str(where), stat.st_mtime_ns, choice[1])


@st.cache_data(max_entries=16, ttl=state.CACHE_TTL_S, show_spinner=False)
def _load(where: str, mtime_ns: int, name: str) -> dict:
    try:
        data = json.loads(Path(where).read_bytes()[:MAX_BYTES + 1].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DiagnosisError(f"{name}: not a diagnosis (not JSON: {err})") from None
    except RecursionError:
        raise DiagnosisError(f"{name}: not a diagnosis (nested too deep)") from None
    return check(data, name)


def _fail(where: str, what: str) -> None:
    raise DiagnosisError(f"{where}: {what}")


def _text(value, where: str, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        _fail(where, f"expected text, got {type(value).__name__}")
    if len(value) > MAX_TEXT:
        _fail(where, f"{len(value):,} characters is too long")
    return value


def _number(value, where: str, optional: bool = True, low: float = -math.inf, high: float = math.inf) -> float | None:
    """A finite number from `low` to `high` (a rate from 0 to 1, a speed from 0): the meaning, not only the type."""
    if value is None and optional:
        return None
    if not finite(value):
        _fail(where, f"expected a finite number, got {value!r:.40}")
    if not low <= value <= high:
        _fail(where, f"{value:.6g} is outside {low:g} to {high:g}")
    return float(value)


def _count(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        _fail(where, f"expected a count, got {value!r:.40}")
    return value


def _dict(value, where: str) -> dict:
    if not isinstance(value, dict):
        _fail(where, f"expected an object, got {type(value).__name__}")
    return value


def check_effect(value, where: str) -> dict | None:
    if value is None:
        return None
    e = _dict(value, where)
    interval = e.get("interval")
    if interval is not None:
        if not isinstance(interval, list) or len(interval) != 2:
            _fail(f"{where}.interval", "expected [low, high]")
        interval = tuple(_number(v, f"{where}.interval", optional=False) for v in interval)
        if interval[0] > interval[1]:
            _fail(f"{where}.interval", "its low end is above its high end")
    found = e.get("found")
    if not isinstance(found, bool):
        _fail(f"{where}.found", "expected true or false")
    out = {"measure": _text(e.get("measure"), f"{where}.measure"),
           **{k: _number(e.get(k), f"{where}.{k}", low=0.0, high=1.0 if e.get("measure") == "acceptance_rate" else math.inf)
              for k in ("baseline", "variant")},
           "difference": _number(e.get("difference"), f"{where}.difference"),
           "interval": interval, "found": found, "joint": max(1, _count(e.get("joint", 1), f"{where}.joint"))}
    if found != (interval is not None and (interval[0] > 0 or interval[1] < 0)):
        _fail(f"{where}.found", "an effect is found exactly when its interval excludes 0")
    if out["difference"] is not None:
        if out["baseline"] is None or out["variant"] is None or interval is None:
            _fail(f"{where}.difference", "a difference needs both arms' values and its interval")
        if not math.isclose(out["difference"], out["variant"] - out["baseline"], rel_tol=1e-9, abs_tol=1e-9):
            _fail(f"{where}.difference", "is not the variant minus the baseline")
    return out


def check_finding(value, where: str) -> dict:
    f = _dict(value, where)
    kind = f.get("kind")
    if kind is None and isinstance(f.get("cause"), bool):  # the first form of the dict: cause or not
        kind = CAUSE if f["cause"] else PROPERTY
    if kind not in KINDS:
        _fail(f"{where}.kind", f"expected one of {', '.join(KINDS)}")
    arm = f.get("arm")
    if arm is not None and not is_name(arm):
        _fail(f"{where}.arm", f"{str(arm)[:40]!r} is not an arm's name (letters, digits, '.', '_', '-')")
    if arm == BASELINE:
        _fail(f"{where}.arm", "an experiment's arm cannot be the baseline")
    out = {"experiment": _text(f.get("experiment"), f"{where}.experiment"), "arm": arm, "kind": kind,
           "now": _text(f.get("now"), f"{where}.now"), "change": _text(f.get("change"), f"{where}.change"),
           "skipped": _text(f.get("skipped"), f"{where}.skipped", optional=True),
           "error": _text(f.get("error"), f"{where}.error", optional=True),
           "requests": _count(f.get("requests", 0), f"{where}.requests"),
           "acceptance_rate": check_effect(f.get("acceptance_rate"), f"{where}.acceptance_rate"),
           "tokens_per_s": check_effect(f.get("tokens_per_s"), f"{where}.tokens_per_s"),
           "step_tokens_per_s": check_effect(f.get("step_tokens_per_s"), f"{where}.step_tokens_per_s")}
    _text(f.get("verdict"), f"{where}.verdict")  # present, but worded again from the numbers
    return out | {"verdict": finding_of(out).verdict()}


def check_advisor(value, where: str = "advisor") -> dict | None:
    """The K advisor's figures on the baseline (engine/diagnose/verdict.py Advice); None in older files."""
    if value is None:
        return None
    a = _dict(value, where)
    best = a.get("best_k")
    if isinstance(best, bool) or not isinstance(best, int) or best < 1:
        _fail(f"{where}.best_k", f"expected a K of 1 or more, got {best!r:.40}")
    if not isinstance(a.get("plain_better"), bool):
        _fail(f"{where}.plain_better", "expected true or false")
    speeds = {k: _number(a.get(k), f"{where}.{k}", optional=k != "plain_tokens_per_s")
              for k in ("plain_tokens_per_s", "baseline_step_tokens_per_s")}
    for k, v in speeds.items():
        if v is not None and v <= 0:
            _fail(f"{where}.{k}", "a speed must be above 0")
    return {"best_k": best, "plain_better": a["plain_better"], **speeds}


GROUP_FIELDS = ("top1_agreement", "mean_overlap", "predicted_greedy_acceptance_rate")


def check_group(value, where: str) -> dict:
    g = _dict(value, where)
    return {"requests": _count(g.get("requests"), f"{where}.requests"),
            **{k: _number(g.get(k), f"{where}.{k}", low=0.0, high=1.0) for k in GROUP_FIELDS}}


def check_probe(value, where: str = "probe") -> dict | None:
    if value is None:
        return None
    p = _dict(value, where)
    categories = _dict(p.get("categories"), f"{where}.categories")
    for name in categories:
        _text(name, f"{where}.categories")
    return {"overall": check_group(p.get("overall"), f"{where}.overall"),
            "categories": {name: check_group(g, f"{where}.categories.{name[:40]}") for name, g in categories.items()},
            "seconds": _number(p.get("seconds"), f"{where}.seconds", low=0.0)}


def check_draft_vocab(value, where: str = "draft_vocab") -> dict | None:
    """An EAGLE head's vocabulary against the baseline's output (engine/diagnose/vocab.py `coverage`): the counts
    must add up (outside at most the tokens, its share their ratio, the most missed within it), not only parse."""
    if value is None:
        return None
    v = _dict(value, where)
    size, tokens, outside = (_count(v.get(k), f"{where}.{k}") for k in ("draft_vocab_size", "tokens", "outside"))
    if size < 1:
        _fail(f"{where}.draft_vocab_size", "a draft vocabulary holds at least one token")
    if outside > tokens:
        _fail(f"{where}.outside", f"{outside} tokens outside is more than the {tokens} generated")
    share = _number(v.get("outside_share"), f"{where}.outside_share", low=0.0, high=1.0)
    if (share is None) != (tokens == 0) or (share is not None and not math.isclose(share, outside / tokens,
                                                                                   rel_tol=1e-9, abs_tol=1e-12)):
        _fail(f"{where}.outside_share", "is not the tokens outside over the tokens generated")
    missed = v.get("most_missed")
    if not isinstance(missed, list) or len(missed) > MOST_MISSED:
        _fail(f"{where}.most_missed", f"expected a list of at most {MOST_MISSED} tokens")
    rows = [{"token_id": _count(_dict(m, f"{where}.most_missed").get("token_id"), f"{where}.most_missed.token_id"),
             "text": _text(m.get("text"), f"{where}.most_missed.text"),
             "count": _count(m.get("count"), f"{where}.most_missed.count")} for m in missed]
    counts = [r["count"] for r in rows]
    if 0 in counts or sum(counts) > outside or counts != sorted(counts, reverse=True) \
            or len({r["token_id"] for r in rows}) != len(rows) or (outside > 0) != bool(rows):
        _fail(f"{where}.most_missed", "its counts do not add up to the tokens outside, most frequent first")
    return {"draft_vocab_size": size, "tokens": tokens, "outside": outside, "outside_share": share, "most_missed": rows}


TRAINED_ARMS = ("baseline", "context length")  # the arms a trained-length check counts (engine diagnosis.py)


def check_trained_length(value, where: str = "trained_length") -> dict | None:
    """An EAGLE head's drafts against the length it was trained on (engine/diagnose/trained_length.py): per arm,
    accepted at most drafted on each side, and requests that went past at most the requests, not only parse."""
    if value is None:
        return None
    v = _dict(value, where)
    trained = _count(v.get("trained_positions"), f"{where}.trained_positions")
    if not 2 <= trained <= MAX_TRAINED_POSITIONS:
        _fail(f"{where}.trained_positions", f"must be 2 to {MAX_TRAINED_POSITIONS:,} tokens")
    arms = _dict(v.get("arms"), f"{where}.arms")
    if "baseline" not in arms or not set(arms) <= set(TRAINED_ARMS):
        _fail(f"{where}.arms", f"expected the baseline, and at most {', '.join(TRAINED_ARMS[1:])} besides")
    checked = {}
    for name in TRAINED_ARMS:
        if name not in arms:
            continue
        a = _dict(arms[name], f"{where}.arms.{name}")
        c = {k: _count(a.get(k), f"{where}.arms.{name}.{k}") for k in
             ("drafted_within", "accepted_within", "drafted_past", "accepted_past", "requests", "requests_past")}
        if c["accepted_within"] > c["drafted_within"] or c["accepted_past"] > c["drafted_past"]:
            _fail(f"{where}.arms.{name}", "accepts more draft tokens than it drafted")
        if c["requests_past"] > c["requests"] or (c["drafted_past"] > 0) != (c["requests_past"] > 0):
            _fail(f"{where}.arms.{name}.requests_past", "does not match the requests and the drafts past the length")
        checked[name] = c
    return {"trained_positions": trained, "arms": checked}


def check(data, name: str) -> dict:
    """The fields the page draws, each of the type it must have; anything else is refused in one line."""
    try:
        d = _dict(data, "the file")
        b = _dict(d.get("baseline"), "baseline")
        if b.get("arm", BASELINE) != BASELINE:
            _fail("baseline.arm", "expected \"baseline\"")
        findings = d.get("findings")
        if not isinstance(findings, list):
            _fail("findings", "expected a list")
        checked = [check_finding(f, f"findings[{i}]") for i, f in enumerate(findings)]
        names = [f["experiment"] for f in checked]
        if len(set(names)) != len(names):
            _fail("findings", "two findings have the same experiment")
        arms = [f["arm"] for f in checked if f["arm"] is not None]
        if len(set(arms)) != len(arms):
            _fail("findings", "two findings name the same arm")
        return {"baseline": {"requests": _count(b.get("requests"), "baseline.requests"),
                             "acceptance_rate": _number(b.get("acceptance_rate"), "baseline.acceptance_rate", low=0.0, high=1.0),
                             "tokens_per_s": _number(b.get("tokens_per_s"), "baseline.tokens_per_s", low=0.0)},
                "advisor": check_advisor(d.get("advisor")), "findings": checked, "probe": check_probe(d.get("probe")),
                "draft_vocab": check_draft_vocab(d.get("draft_vocab")),
                "trained_length": check_trained_length(d.get("trained_length"))}
    except DiagnosisError as err:
        raise DiagnosisError(f"{name}: {' '.join(str(err).split())}") from None


# ---------------------------------------------------------------- what the page reads of it

def ran(finding: dict) -> bool:
    return not finding["skipped"] and not finding["error"]


def measured(finding: dict) -> bool:
    e = finding["acceptance_rate"]
    return ran(finding) and e is not None and e["difference"] is not None


def judged(finding: dict) -> dict | None:
    """The effect a finding of its kind is ranked and worded by."""
    return finding[JUDGED_BY[finding["kind"]]]


def helps(finding: dict) -> bool:
    e = judged(finding)
    return ran(finding) and e is not None and e["found"] and e["difference"] is not None and e["difference"] > 0


def cause_found(d: dict) -> dict | None:
    """Why acceptance is low, where a cause was found: the cause whose change raised acceptance the most."""
    causes = [f for f in d["findings"] if f["kind"] == CAUSE and helps(f)]
    return max(causes, key=lambda f: f["acceptance_rate"]["difference"], default=None)


def advice(choice: tuple[str, str], d: dict) -> ranking.Advice | None:
    """The K advisor's figures: the file's, or, in a file written before it held them, the baseline arm's
    traces read by the engine (engine/diagnose/verdict.py advisor); None without either."""
    if d["advisor"] is not None:
        return ranking.Advice(**d["advisor"])
    if not has_arm(choice, BASELINE):
        return None
    workload = arm_workload(choice, BASELINE)
    try:
        return _advice(workloads.content_key(workload), workloads.load(workload))
    except (TraceError, OSError, ValueError):
        return None


@st.cache_data(max_entries=16, ttl=state.CACHE_TTL_S, show_spinner="Reading the baseline's calibration…")
def _advice(key: str, _workload) -> ranking.Advice | None:
    return ranking.advisor(_workload.runs())


def verdict(choice: tuple[str, str], d: dict) -> list[ranking.Option]:
    """What to change, the fastest first (engine/diagnose/verdict.py); empty if nothing tried is faster."""
    return ranking.verdict(d["findings"], advice(choice, d), d["baseline"]["requests"])


def options(choice: tuple[str, str], d: dict) -> list[ranking.Option]:
    """Every change measured: the verdict's, ranked, then the others, the fastest first."""
    faster = verdict(choice, d)
    rest = [o for o in ranking.options(d["findings"], advice(choice, d), d["baseline"]["requests"]) if o not in faster]
    return faster + sorted(rest, key=lambda o: -o.speedup)


def arms(choice: tuple[str, str], d: dict) -> list[str]:
    """The arms whose traces are here: the baseline, then each finding's, in the report's order."""
    return [a for a in [BASELINE, *(f["arm"] for f in d["findings"])] if has_arm(choice, a)]


def request_rows(workload: tuple[str, str]) -> list[dict]:
    """Per finished request of an arm: its id, category, file, drafted and accepted tokens, cycles, and
    the first cycle that rejected a draft token (None if none did). Computed once per workload content."""
    return _request_rows(workloads.content_key(workload), workloads.load(workload))


@st.cache_data(max_entries=32, ttl=state.CACHE_TTL_S, show_spinner="Reading the arm's traces…")
def _request_rows(key: str, _workload) -> list[dict]:
    rows = []
    for run in _workload.runs():
        cycles = run.trace.cycles
        first = next((i for i, c in enumerate(cycles) if c["num_accepted"] < drafted(c)), None)
        n_drafted = sum(drafted(c) for c in cycles)
        accepted = sum(c["num_accepted"] for c in cycles)
        rows.append({"id": run.id, "category": run.category, "file": run.file, "drafted": n_drafted,
                     "accepted": accepted, "cycles": len(cycles), "first_rejection": first,
                     "acceptance_rate": accepted / n_drafted if n_drafted else None})
    return rows


def paired_rows(baseline: list[dict], arm: list[dict]) -> list[dict]:
    """The requests both arms finished, in the baseline's order: (baseline row, arm row) as one dict."""
    by_id = {r["id"]: r for r in arm}
    return [{"base": r, "arm": by_id[r["id"]]} for r in baseline if r["id"] in by_id]


def manifest_of(workload: tuple[str, str]) -> dict | None:
    try:
        return workloads.load(workload).manifest
    except (TraceError, OSError):
        return None


def interval_name(e: dict) -> str:
    """engine/diagnose/paired.py Effect.interval_words's name for it."""
    return "95% joint interval" if e.get("joint", 1) > 1 else "95% interval"
