"""Prometheus scrapes, alone and in pairs: vLLM's two scrapes and SGLang's gauges from tests/server_samples/,
changed, read by `python -m engine metrics SCRAPE [SCRAPE]` (the parser, the difference of two
scrapes, the explanation).

A pair must be two scrapes of one run of one server, the earlier first. Pairs that are not (another
model's label, a counter's _created moved by a restart, one engine's counter falling while the sum
grows, vLLM then SGLang, an empty second scrape, the order reversed) must be refused.
"""
import random
import re
from functools import lru_cache
from pathlib import Path

from bench.fuzz import mutate
from bench.fuzz.cases import ACCEPT, EITHER, REFUSE, Case
from bench.fuzz.metrics_cli import explain_files
from bench.fuzz.sandbox import Places

KIND = "scrapes"
ROOT = Path(__file__).resolve().parents[2]
SAMPLE = re.compile(r"^(?P<name>[^{\s#]+)(?P<labels>\{[^}]*\})?\s+(?P<value>\S+)(?:\s+(?P<ts>\S+))?\s*$")
MENTIONS = ("scrape", "Prometheus", "metrics", "vllm:", "sglang:", "counter", "input", "position", "sample", "SGLang",
            "vLLM", "accepted", "draft")
DRAFTS = "vllm:spec_decode_num_drafts_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
FIRST, SECOND, GAUGES = "scrape-1.prom", "scrape-2.prom", "gauges.prom"


@lru_cache(maxsize=1)
def samples() -> dict[str, str]:
    folder = ROOT / "tests" / "server_samples"
    return {FIRST: (folder / "vllm_scrape_1.prom").read_text(), SECOND: (folder / "vllm_scrape_2.prom").read_text(),
            GAUGES: (folder / "sglang_gauges.prom").read_text()}


def edit_samples(text: str, edit) -> str:
    """Each sample line through `edit(match) -> line`; comments and blank lines as they are."""
    out = []
    for line in text.split("\n"):
        m = SAMPLE.match(line)
        out.append(edit(m) if m else line)
    return "\n".join(out)


def line_of(m, value: str | None = None, ts: str | None | bool = True, labels: str | None = None) -> str:
    ts = m["ts"] if ts is True else ts
    return f"{m['name']}{labels if labels is not None else m['labels'] or ''} {value if value is not None else m['value']}" + \
        (f" {ts}" if ts else "")


def set_value(text: str, name: str, engine: str, new) -> str:
    def edit(m):
        hit = m["name"] == name and f'engine="{engine}"' in (m["labels"] or "")
        return line_of(m, value=new(float(m["value"])) if hit else None)
    return edit_samples(text, edit)


def without_timestamps(text: str) -> str:
    return edit_samples(text, lambda m: line_of(m, ts=None))


def with_created(text: str, created: float) -> str:
    """A _created sample after each counter's samples, as prometheus_client writes them."""
    out = []
    for line in text.rstrip("\n").split("\n"):
        out.append(line)
        m = SAMPLE.match(line)
        if m and m["name"].endswith("_total"):
            out.append(f"{m['name'][:-len('_total')]}_created{m['labels'] or ''} {created:.1f}")
    return "\n".join(out) + "\n"


def reordered_labels(text: str, rng: random.Random) -> str:
    def edit(m):
        if not m["labels"]:
            return line_of(m)
        parts = m["labels"][1:-1].split(",")
        rng.shuffle(parts)
        return line_of(m, labels="{" + ",".join(parts) + "}")
    return edit_samples(text, edit)


def families_reordered(text: str, rng: random.Random) -> str:
    blocks, current = [], []
    for line in text.rstrip("\n").split("\n"):
        if line.startswith("# HELP") or (line.startswith("# TYPE") and not (current and current[-1].startswith("# HELP"))):
            if current:
                blocks.append(current)
            current = []
        current.append(line)
    blocks.append(current)
    rng.shuffle(blocks)
    return "\n".join(line for b in blocks for line in b) + "\n"


def valid_text(text: str, rng: random.Random) -> tuple[str, str]:
    style = rng.choice(["as-is", "labels-reordered", "families-reordered", "no-help", "extra-metric", "no-final-newline"])
    if style == "labels-reordered":
        text = reordered_labels(text, rng)
    elif style == "families-reordered":
        text = families_reordered(text, rng)
    elif style == "no-help":
        text = "\n".join(line for line in text.split("\n") if not line.startswith("# HELP"))
    elif style == "extra-metric":
        text += "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.5\n"
    elif style == "no-final-newline":
        text = text.rstrip("\n")
    return text, style


def broken_one(text: str, rng: random.Random) -> tuple[str, str]:
    """One scrape that no server writes: refused alone or in a pair."""
    how = rng.choice(["negative", "NaN", "+Inf", "1e300", "position x", "position 99", "accepted > drafted",
                      "position 0 missing", "not Prometheus"])
    if how in ("negative", "NaN", "+Inf", "1e300"):
        value = {"negative": "-5.0", "NaN": "NaN", "+Inf": "+Inf", "1e300": "1e300"}[how]
        return set_value(text, rng.choice([DRAFTS, ACCEPTED, DRAFT_TOKENS]), "0", lambda v: value), f"a counter {how}"
    if how.startswith("position") and how != "position 0 missing":
        return text.replace('position="1"', f'position="{how.split()[1]}"'), how
    if how == "accepted > drafted":
        return set_value(text, ACCEPTED, "0", lambda v: f"{v + 10_000:.1f}"), how
    if how == "position 0 missing":
        return "\n".join(x for x in text.split("\n") if 'position="0"' not in x), how
    return "{" + text[: len(text) // 2], how


def other_run(first: str, second: str, rng: random.Random) -> tuple[str, str, str]:
    """Two scrapes that are not of one run of one server: the second scrape rewritten."""
    how = rng.choice(["other model", "created moved", "one engine falls", "order reversed"])
    if how == "other model":
        return first, second.replace(MODEL, "Qwen/Qwen3-8B"), how
    if how == "created moved":
        return with_created(first, 1749990000.0), with_created(second, 1750000030.0), how
    if how == "one engine falls":  # engine 0 restarted: its counters fell; engine 1's grew more, so each sum grows
        name = rng.choice([DRAFTS, ACCEPTED, DRAFT_TOKENS])
        second = set_value(second, name, "0", lambda v: "1.0")
        return first, set_value(second, name, "1", lambda v: f"{v + 1000:.1f}"), f"{how} ({name})"
    return second, first, how


def pair_case(rng: random.Random) -> tuple[dict[str, str], str, str, str | None]:
    s = samples()
    first, second = s[FIRST], s[SECOND]
    family = rng.choices(["valid", "broken", "other-run", "odd-pair", "same", "damage"], weights=[3, 2, 3, 2, 1, 2])[0]
    if family == "valid":
        style = rng.choice(["as-is", "no-timestamps", "created-same", "text"])
        if style == "no-timestamps":
            first, second = without_timestamps(first), without_timestamps(second)
        elif style == "created-same":
            first, second = with_created(first, 1749990000.0), with_created(second, 1749990000.0)
        elif style == "text":
            (first, w1), (second, w2) = valid_text(first, rng), valid_text(second, rng)
            style = f"{w1} and {w2}"
        return {FIRST: first, SECOND: second}, ACCEPT, f"pair, valid: {style}", None
    if family == "broken":
        second, words = broken_one(second, rng)
        return {FIRST: first, SECOND: second}, REFUSE, f"pair, second scrape: {words}", None
    if family == "other-run":
        first, second, words = other_run(first, second, rng)
        tag = None if words == "order reversed" else "scrape-other-run"
        return {FIRST: first, SECOND: second}, REFUSE, f"pair of different runs: {words}", tag
    if family == "odd-pair":
        how = rng.choice(["vLLM then SGLang", "empty second", "comments-only second"])
        second = {"vLLM then SGLang": s[GAUGES], "empty second": "", "comments-only second": "# nothing here\n"}[how]
        return {FIRST: first, SECOND: second}, REFUSE, f"pair: {how}", None
    if family == "same":
        text = rng.choice([first, without_timestamps(first)])
        timed = text == first  # with timestamps, not later: refused; without, no drafts between them
        words = "the same scrape twice" + ("" if timed else ", no timestamps: no draft between them")
        return {FIRST: text, SECOND: text}, REFUSE if timed else EITHER, words, None if timed else "zero-rate"
    data, words = mutate.flip_bytes(second.encode(), rng)
    return {FIRST: first, SECOND: data.decode("utf-8", "replace")}, EITHER, f"pair, second scrape: {words}", None


def single_case(rng: random.Random) -> tuple[dict[str, str], str, str, str | None]:
    name = rng.choice([FIRST, SECOND, GAUGES])
    text = samples()[name]
    family = rng.choices(["valid", "broken", "damage"], weights=[3, 3, 2])[0]
    if family == "valid":
        text, words = valid_text(text, rng)
        return {name: text}, ACCEPT, f"{name} alone, valid: {words}", None
    if family == "broken" and name != GAUGES:
        text, words = broken_one(text, rng)
        return {name: text}, REFUSE, f"{name} alone: {words}", None
    if rng.random() < 0.6:
        data, words = mutate.flip_bytes(text.encode(), rng)
    else:
        data, line = mutate.duplicate_line(text.encode(), rng)
        words = f"line {line + 1} duplicated"
    return {name: data.decode("utf-8", "replace")}, EITHER, f"{name} alone: {words}", None


def make(rng: random.Random, index: int, places: Places) -> Case:
    texts, expect, words, tag = pair_case(rng) if rng.random() < 0.6 else single_case(rng)
    files = {name: text.encode() for name, text in texts.items()}
    return Case(KIND, index, words, expect, "", "metrics", files=files, tag=tag, mentions=(*files, *MENTIONS),
                options={"order": list(texts)})


def attempt(case: Case, work: Path) -> str:
    return explain_files(case.options["order"], no_drafts=case.tag == "zero-rate")
