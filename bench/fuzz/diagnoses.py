"""Diagnosis files: the bundled diagnoses, changed, read by the app's reader (app/ui/diagnoses.py `load`,
what the Diagnose page calls; the engine writes them and never reads one back), from a diagnoses
folder that is the case's working folder.
"""
import json
import os
import random
from functools import lru_cache
from pathlib import Path

from app.ui import diagnoses
from bench.fuzz import mutate
from bench.fuzz.cases import ACCEPT, EITHER, REFUSE, Case, Refused
from bench.fuzz.sandbox import Places

KIND = "diagnoses"
ROOT = Path(__file__).resolve().parents[2]
NAME = "fuzz-diagnosis"
EFFECTS = ("acceptance_rate", "tokens_per_s", "step_tokens_per_s")
DEEP = "@deep@"  # replaced in the text by lists nested 100,000 deep (json.dumps cannot write them)


@lru_cache(maxsize=1)
def samples() -> tuple[tuple[str, str], ...]:
    """(name, text) of each bundled diagnosis."""
    return tuple((p.name, p.read_text()) for p in sorted((ROOT / "assets" / "diagnoses").glob("*.json")))


def effects(d: dict) -> list[dict]:
    return [f[e] for f in d["findings"] for e in EFFECTS if isinstance(f.get(e), dict)]


def breaks(d: dict, rng: random.Random, places: Places) -> str:
    """Break one rule the page relies on, in place; the words say which."""
    i = rng.randrange(len(d["findings"]))
    f = d["findings"][i]
    e = rng.choice(effects(d))
    edits = [
        ("an arm that is a path", lambda: f.update(arm=rng.choice(["../../canary/keep-me", f"{places.canary}/x", "a/b",
                                                                    "C:\\x", "a--b", ".hidden"]))),
        ("an arm named baseline", lambda: f.update(arm="baseline")),
        ("an unknown kind", lambda: f.update(kind="other")),
        ("requests negative", lambda: f.update(requests=-1)),
        ("requests as text", lambda: f.update(requests="30")),
        ("an interval of one end", lambda: e.update(interval=[0.1])),
        ("an interval upside down", lambda: e.update(interval=[1.0, -1.0])),
        ("found as text", lambda: e.update(found="yes")),
        ("found without an interval", lambda: e.update(found=True, interval=None)),
        ("an effect's baseline NaN", lambda: e.update(baseline=float("nan"))),
        ("an effect's variant infinite", lambda: e.update(variant=float("inf"))),
        ("an effect's difference as text", lambda: e.update(difference="0.1")),
        ("a verdict too long", lambda: f.update(verdict="x" * (diagnoses.MAX_TEXT + 1))),
        ("a verdict a number", lambda: f.update(verdict=5)),
        ("an experiment twice", lambda: d["findings"].append(dict(f, arm=None))),
        ("an arm twice", lambda: d["findings"].append(dict(f, experiment=f["experiment"] + " again"))
         if f.get("arm") else f.update(kind="other")),
        ("the baseline's arm other", lambda: d["baseline"].update(arm="other")),
        ("the baseline's requests negative", lambda: d["baseline"].update(requests=-3)),
        ("findings an object", lambda: d.update(findings={"0": f})),
        ("a probe group's requests negative", lambda: d["probe"]["overall"].update(requests=-1)
         if isinstance(d.get("probe"), dict) else d.update(probe=[])),
        ("nested 100000 deep", lambda: d.update(case=DEEP)),
    ]
    words, edit = rng.choice(edits)
    edit()
    return f"findings[{i}]: {words}"


def out_of_range(d: dict, rng: random.Random) -> str:
    """A rate outside 0..1 or a negative speed: the types are right, the meaning is not."""
    what = rng.choice(["baseline acceptance_rate 1.5", "baseline tokens_per_s -8", "probe agreement 1.7"])
    if what.startswith("baseline acceptance"):
        d["baseline"]["acceptance_rate"] = 1.5
    elif what.startswith("baseline tokens"):
        d["baseline"]["tokens_per_s"] = -8.0
    elif isinstance(d.get("probe"), dict):
        d["probe"]["overall"]["top1_agreement"] = 1.7
    else:
        d["baseline"]["acceptance_rate"] = -0.5
    return what


def valid(d: dict, rng: random.Random) -> tuple[str, str]:
    style = rng.choice(["reordered", "compact", "ascii", "crlf", "no-probe", "extra-key", "odd-text", "old-form"])
    if style == "reordered":
        d = mutate.reordered(d, rng)
    elif style == "no-probe":
        d.pop("probe", None)
    elif style == "extra-key":
        d["written_by"] = {"a": [1, 2, {"b": None}]}
    elif style == "odd-text":
        f = rng.choice(d["findings"])
        f["verdict"] = rng.choice(mutate.ODD_TEXT) + f["verdict"] + "<script>alert(1)</script>"
    elif style == "old-form":  # the first form of a finding: cause true or false instead of a kind
        for f in d["findings"]:
            if f["kind"] in ("cause", "property"):
                f["cause"] = f.pop("kind") == "cause"
    text = json.dumps(d, indent=None if style == "compact" else 1, ensure_ascii=style == "ascii")
    return (text.replace("\n", "\r\n") if style == "crlf" else text), style


def make(rng: random.Random, index: int, places: Places) -> Case:
    name, text = rng.choice(samples())
    d = json.loads(text)
    family = rng.choices(["valid", "break", "range", "damage"], weights=[3, 5, 1, 2])[0]
    if family == "valid":
        text, words = valid(d, rng)
        expect = ACCEPT
    elif family == "break":
        words = breaks(d, rng, places)
        text, expect = json.dumps(d).replace(f'"{DEEP}"', "[" * 100_000 + "]" * 100_000), REFUSE
    elif family == "range":
        words = out_of_range(d, rng)
        text, expect = json.dumps(d), REFUSE
    else:
        data, words = mutate.flip_bytes(text.encode(), rng) if rng.random() < 0.5 else (None, "")
        if data is None:
            words = mutate.swap_random_leaf(d, rng)
            data = json.dumps(d).encode("utf-8", "surrogatepass")
        return Case(KIND, index, f"{name}: {words}", EITHER, NAME, "load", files={f"{NAME}.json": data})
    return Case(KIND, index, f"{name}: {words}", expect, NAME, "load", files={f"{NAME}.json": text.encode()})


def attempt(case: Case, work: Path) -> str:
    os.environ["SPECLAB_DIAGNOSES_DIR"] = str(work)
    try:
        d = diagnoses.load(("bundled", NAME))
    except diagnoses.DiagnosisError as err:
        raise Refused(str(err)) from None
    return f"{len(d['findings'])} findings"
