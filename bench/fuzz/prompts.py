"""Prompt files: the bundled prompt sets (and one as plain text), changed, read by `read_prompts`
as `run --prompts FILE` reads them, then fingerprinted as a workload run does.
"""
import json
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from bench.fuzz import mutate
from bench.fuzz.cases import ACCEPT, EITHER, REFUSE, Case, Refused
from bench.fuzz.sandbox import Places
from engine.config import SettingsError
from engine.workload.prompts import MAX_MESSAGES, MAX_NAME_CHARS, MAX_REQUESTS, read_prompts

KIND = "prompts"
ROOT = Path(__file__).resolve().parents[2]
JSONL, TEXT = "prompts.jsonl", "prompts.txt"


@dataclass(frozen=True)
class Sample:
    name: str
    entries: tuple  # the requests as parsed JSON objects

    def lines(self) -> list[dict]:
        return json.loads(json.dumps(list(self.entries)))  # a deep copy to edit


@lru_cache(maxsize=1)
def samples() -> tuple[Sample, ...]:
    found = []
    for path in sorted((ROOT / "assets" / "prompts").glob("*.jsonl")):
        entries = [json.loads(line) for line in path.read_text().split("\n") if line.strip()]
        found.append(Sample(path.name, tuple(entries)))
    return tuple(found)


def text_file(entries: list[dict]) -> bytes:
    """Plain text, one prompt a line (the prompts' own line breaks become spaces)."""
    return "".join(" ".join(e["prompt"].split()) + "\n" for e in entries if "prompt" in e).encode()


# ---------------------------------------------------------------- changes that keep the file valid

def valid_variant(rng: random.Random, lines: list[dict]) -> tuple[bytes, str, str]:
    style = rng.choice(["crlf", "reordered", "spaced", "ascii", "blank-lines", "int-ids", "no-ids", "as-messages",
                        "odd-text", "text-file", "text-file-crlf", "subset"])
    name = JSONL
    if style == "reordered":
        lines = [mutate.reordered(e, rng) for e in lines]
    elif style == "int-ids":
        lines = [e | {"id": i} for i, e in enumerate(lines)]
    elif style == "no-ids":
        lines = [{k: v for k, v in e.items() if k != "id"} for e in lines]
    elif style == "as-messages":
        lines = [{k: v for k, v in e.items() if k != "prompt"} | {"messages": [{"role": "user", "content": e["prompt"]}]}
                 if "prompt" in e else e for e in lines]
    elif style == "odd-text":
        for e in lines:
            if "prompt" in e:
                e["prompt"] = rng.choice(["\u202e", "\u200d", "\u2028", "😀", "<b>", "\\n"]) + e["prompt"]
    elif style == "subset":
        lines = rng.sample(lines, rng.randint(1, len(lines)))
    if style.startswith("text-file"):
        data, name = text_file(lines), TEXT
        return (data.replace(b"\n", b"\r\n") if style.endswith("crlf") else data), name, style
    newline = "\r\n" if style == "crlf" else "\n"
    data = mutate.json_lines(lines, newline=newline, style=style if style in ("spaced", "ascii") else "plain")
    if style == "blank-lines":
        data = data.replace(b"\n", b"\n \n")
    return data, name, style


# ---------------------------------------------------------------- changes that break one rule

def one_line_broken(rng: random.Random, lines: list[dict]) -> tuple[list[dict], str, str | None]:
    """An edit of one request that read_prompts must refuse; the words, and the known defect it hits."""
    i = rng.randrange(len(lines))
    e = lines[i]

    def turns(messages: list) -> None:
        e.pop("prompt", None)
        e["messages"] = messages

    user = {"role": "user", "content": "x"}
    edits = [
        ("unknown key", lambda: e.update(extra=1), None),
        ("prompt and messages", lambda: e.update(prompt="x", messages=[{"role": "user", "content": "x"}]), None),
        ("neither prompt nor messages", lambda: [e.pop(k, None) for k in ("prompt", "messages")], None),
        ("prompt a number", lambda: e.update(prompt=rng.choice([1, 2.5, None, [], {}, True])), None),
        ("prompt blank", lambda: e.update(prompt=rng.choice(["", "   ", "\n\t"])), None),
        ("id not printable", lambda: e.update(id=rng.choice(["a\nb", "\u202ex", "tab\there", "\x00"])), None),
        ("id too long", lambda: e.update(id="x" * (MAX_NAME_CHARS + 1)), None),
        ("id of a wrong type", lambda: e.update(id=rng.choice([True, 2.5, [1], {"a": 1}, ""])), None),
        ("category empty", lambda: e.update(category=" "), None),
        ("no turns", lambda: turns([]), None),
        ("too many turns", lambda: turns([user] * (MAX_MESSAGES + 1)), None),
        ("last turn not the user's", lambda: turns([user, {"role": "assistant", "content": "y"}]), None),
        ("unknown role", lambda: turns([{"role": "robot", "content": "x"}]), None),
        ("turn with an extra key", lambda: turns([user | {"name": "n"}]), None),
        ("turn content blank", lambda: turns([{"role": "user", "content": " "}]), None),
        ("lone surrogate in the prompt", lambda: e.update(prompt=rng.choice(mutate.LONE_SURROGATES) + "tell me"),
         "lone-surrogate"),
        ("lone surrogate in a turn", lambda: turns([{"role": "user", "content": "hi " + rng.choice(mutate.LONE_SURROGATES)}]),
         "lone-surrogate"),
    ]
    words, edit, tag = rng.choice(edits)
    edit()
    return lines, f"line {i + 1}: {words}", tag


def broken_file(rng: random.Random, sample: Sample) -> tuple[bytes, str, str | None]:
    lines = sample.lines()
    what = rng.choice(["edit"] * 8 + ["duplicate-id", "nan", "not-utf8", "array", "cut-line", "too-many", "blank"])
    if what == "edit":
        edited, words, tag = one_line_broken(rng, lines)
        # A lone surrogate reaches the reader as an escape (as bytes it is not UTF-8, refused on its own).
        style = "ascii" if tag == "lone-surrogate" else rng.choice(["plain", "ascii"])
        return mutate.json_lines(edited, style=style), words, tag
    if what == "duplicate-id":
        i = rng.randrange(len(lines))
        lines.insert(rng.randrange(len(lines) + 1), dict(lines[i], id=lines[i].get("id", f"line-{i + 1}")))
        return mutate.json_lines(lines), "an id given twice", None
    data = mutate.json_lines(lines)
    rows = data.split(b"\n")
    i = rng.randrange(len(rows) - 1)
    if what == "nan":
        rows[i] = rows[i][:-1] + b', "category": NaN}'
    elif what == "not-utf8":
        rows[i] = rows[i][:10] + rng.choice([b"\xff", b"\xed\xa0\x80", b"\xc3"]) + rows[i][10:]
    elif what == "array":
        rows[i] = b"[" + rows[i] + b"]"
    elif what == "cut-line":
        rows[i] = rows[i][: rng.randrange(1, len(rows[i]) - 1)]
    elif what == "too-many":
        rows = [json.dumps({"prompt": f"p{n}"}).encode() for n in range(MAX_REQUESTS + 1)]
    else:
        rows = [b"", b"  ", b"\t"]
    return b"\n".join(rows), f"{what} at line {i + 1}", None


def damaged(rng: random.Random, sample: Sample) -> tuple[bytes, str]:
    data = mutate.json_lines(sample.lines())
    how = rng.choice(["flip", "cut", "duplicate", "swap", "nul"])
    if how == "flip":
        return mutate.flip_bytes(data, rng)
    if how == "cut":
        data, at = mutate.cut(data, rng)
        return data, f"cut at byte {at}"
    if how == "duplicate":
        data, i = mutate.duplicate_line(data, rng)
        return data, f"line {i + 1} duplicated (an id twice, if it has one)"
    if how == "nul":
        lines = sample.lines()
        e = rng.choice([x for x in lines if "prompt" in x] or lines)
        e["prompt"] = "a\u0000b"
        return mutate.json_lines(lines), "a NUL inside a prompt"
    lines = sample.lines()
    i = rng.randrange(len(lines))
    return mutate.json_lines(lines), f"line {i + 1} {mutate.swap_random_leaf(lines[i], rng)}"


def make(rng: random.Random, index: int, places: Places) -> Case:
    sample = rng.choice(samples())
    family = rng.choices(["valid", "broken", "damaged"], weights=[3, 4, 3])[0]
    tag = None
    if family == "valid":
        data, name, words = valid_variant(rng, sample.lines())
        expect = ACCEPT
    elif family == "broken":
        data, words, tag = broken_file(rng, sample)
        name, expect = JSONL, REFUSE
    else:
        data, words = damaged(rng, sample)
        name, expect = JSONL, EITHER
    return Case(KIND, index, f"{sample.name}: {words}", expect, name, "read_prompts", files={name: data}, tag=tag)


def attempt(case: Case, work: Path) -> str:
    try:
        requests = read_prompts(case.source)
    except SettingsError as err:
        raise Refused(str(err)) from None
    fingerprints = {r.fingerprint() for r in requests}  # what `run --prompts` does next, to resume later
    return f"{len(requests)} requests, {len(fingerprints)} fingerprints, {sum(len(r.text) for r in requests)} characters"
