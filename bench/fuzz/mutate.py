"""Changes every kind makes to its samples: bytes, lines, JSON values and text.

Byte-level damage (flips, cuts) has no oracle of its own: the kind decides what it means. JSON
edits work on parsed values and are written back with `dumps`, whose spacing and key order can be
varied without changing the meaning (valid variants).
"""
import json
import random

# Values a field can be swapped to: another type, a non-finite number, a huge or negative count.
ODD_VALUES = [None, "text", "", [], {}, True, False, -1, 0, 2.5, 10**30, 10**400, -10**30, float("nan"),
              float("inf"), float("-inf"), "\ud800", [1, 2, 3], {"a": 1}]
# Text a token, a prompt or a name may carry: RTL marks, joiners, line and paragraph separators, NUL.
ODD_TEXT = ["\u202e", "\u200f", "\u2028", "\u2029", "\x85", "\u200d", "\ufeff", "\u0000", "<b>x</b>", "😀", "\\n"]
LONE_SURROGATES = ["\ud800", "\udfff", "\udc80x", "a\ud83d"]


def flip_bytes(data: bytes, rng: random.Random, count: int | None = None) -> tuple[bytes, str]:
    out = bytearray(data)
    count = count or rng.choice([1, 1, 2, 4, 16])
    for _ in range(count):
        i = rng.randrange(len(out))
        out[i] ^= 1 << rng.randrange(8) if rng.random() < 0.7 else rng.randrange(1, 256)
    return bytes(out), f"{count} byte(s) flipped"


def cut(data: bytes, rng: random.Random) -> tuple[bytes, int]:
    """The data cut at a random place (never whole); the place is returned so the kind can judge."""
    at = rng.randrange(len(data))
    return data[:at], at


def lines_of(data: bytes) -> list[bytes]:
    return data.split(b"\n")


def duplicate_line(data: bytes, rng: random.Random) -> tuple[bytes, int]:
    lines = lines_of(data)
    filled = [i for i, line in enumerate(lines) if line.strip()]
    i = rng.choice(filled)
    return b"\n".join(lines[:i + 1] + [lines[i]] + lines[i + 1:]), i


def drop_line(data: bytes, rng: random.Random) -> tuple[bytes, int]:
    lines = lines_of(data)
    filled = [i for i, line in enumerate(lines) if line.strip()]
    i = rng.choice(filled)
    return b"\n".join(lines[:i] + lines[i + 1:]), i


def insert_bytes(data: bytes, rng: random.Random, what: bytes) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + what + data[at:]


# ---------------------------------------------------------------- JSON

def reordered(value, rng: random.Random):
    """The same JSON value with every object's keys in a shuffled order."""
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {k: reordered(value[k], rng) for k in keys}
    if isinstance(value, list):
        return [reordered(v, rng) for v in value]
    return value


def dumps(value, style: str = "plain") -> str:
    """One JSON text: "plain" as json.dumps writes it, "spaced" with extra spaces, "ascii" escaped."""
    if style == "spaced":
        return json.dumps(value, ensure_ascii=False, separators=(" ,  ", " :\t"))
    return json.dumps(value, ensure_ascii=style == "ascii")


def json_lines(records: list, newline: str = "\n", style: str = "plain") -> bytes:
    return "".join(dumps(r, style) + newline for r in records).encode("utf-8", "surrogatepass")


def leaves(value, path: tuple = ()) -> list[tuple]:
    """The path of every scalar in a JSON value (dict keys and list indexes)."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in leaves(v, (*path, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in leaves(v, (*path, i))]
    return [path]


def get_path(value, path: tuple):
    for step in path:
        value = value[step]
    return value


def set_path(value, path: tuple, new) -> None:
    get_path(value, path[:-1])[path[-1]] = new


def path_words(path: tuple) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".") or "(top)"


def swap_random_leaf(value, rng: random.Random) -> str:
    """Set one scalar anywhere to an odd value; the words say which (the oracle is the kind's: EITHER)."""
    path = rng.choice(leaves(value))
    new = rng.choice(ODD_VALUES)
    set_path(value, path, new)
    return f"{path_words(path)} = {short(new)}"


def short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."

