"""The records a server's metrics become, and the checks every reader applies to untrusted input.

ServerMetrics holds one server's counts over a stretch of time; ServerRequest one request's, as
the per-request outputs give them (engine/servers/per_request.py reads those).

Every count a reader takes passes `count`, every rate `fraction`: a metrics file pasted into
the app is untrusted, so a negative counter, a NaN, 1e400 or a count beyond what a float holds
exactly stops the reader with one clear line instead of a silly number further on.
"""
import math
from dataclasses import dataclass, field
from enum import StrEnum

MAX_INPUT_BYTES = 4 * 2**20  # a /metrics scrape is tens of kB; a long log excerpt a few MB
MAX_COUNT = 2**53  # beyond this a float (Prometheus' number type) no longer holds every integer
MAX_POSITIONS = 64  # draft positions per cycle a reader accepts; servers use K of at most ~16
MAX_RECORDS = 100_000  # iteration stats, requests or log lines in one input

# How servers name their drafters, in the project's words (design.md: drafters).
METHODS = {
    "draft_model": "draft model", "standalone": "draft model", "draft_tokens_external": "draft model",
    "eagle": "EAGLE", "eagle3": "EAGLE", "eagle-3": "EAGLE",
    "ngram": "n-gram", "prompt_lookup": "n-gram", "lookahead": "n-gram",
    "mtp": "MTP", "nextn": "MTP", "deepseek_mtp": "MTP",
    "medusa": "Medusa",
}


class ServerMetricsError(ValueError):
    """An input that is not a server's speculative-decoding metrics, said in one line."""


class NothingDrafted(StrEnum):
    """A rate over zero drafts (0/0): not a number, and never shown as 0 or as a missing value.

    A fresh server, a window without traffic, speculation off or one scrape given twice all
    leave zero drafts; every view writes this state in these same words.
    """

    NOTHING_DRAFTED = "nothing drafted"


NOTHING_DRAFTED = NothingDrafted.NOTHING_DRAFTED


@dataclass(frozen=True)
class ServerMetrics:
    """One server's speculative-decoding metrics over one stretch of time, in our names.

    drafts is the number of cycles (one per request per verify step); accepted_tokens never
    counts the resampled or bonus token. Any field a source does not give is None.
    """

    source: str  # which server and which of its outputs, e.g. "vLLM /metrics (Prometheus text)"
    method: str | None = None  # METHODS' words, where the input says it
    k: int | None = None  # draft tokens per cycle (SGLang: draft steps, the depth of its tree)
    drafts: int | None = None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    per_position: list[float] | None = None  # cycles that accepted draft position i / cycles
    acceptance_length: float | None = None  # as the server reports it, bonus token included
    acceptance_rate: float | None = None  # as the server reports it
    window_s: float | None = None  # the time the counts cover, where the input says it
    tokens_per_s: float | None = None  # generated (or, for a vLLM log, accepted) tokens per second
    draft_overhead: float | None = None  # TensorRT-LLM: the share of iteration time spent drafting
    notes: list[str] = field(default_factory=list)  # how a number was obtained, where it is not read directly


@dataclass(frozen=True)
class ServerRequest:
    """One request's speculative-decoding counts as its server reported them; None where it gave none.

    steps are verify steps (cycles); drafted and accepted count draft tokens, never the bonus one;
    acceptance_rate and mean_acceptance_length are the server's own figures (SGLang's length is
    completion tokens / verify passes). accepted_histogram[j] = steps that accepted exactly j.
    """

    id: str
    category: str | None
    steps: int | None
    drafted: int | None
    accepted: int | None
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    accepted_histogram: list[int] | None
    accepted_per_step: list[int] | None
    source: str  # "vLLM" or "SGLang"
    drafted_per_step: list[int] | None = None  # vLLM detailed: each step's proposed length
    histogram_by_draft_length: dict[int, list[int]] | None = None  # vLLM: proposed length -> histogram
    k: int | None = None  # the most draft tokens a step may propose


@dataclass(frozen=True)
class ServerRequests:
    requests: list[ServerRequest]
    source: str  # which server and which of its outputs, in words
    k: int | None = None  # when every request has the same K
    notes: list[str] = field(default_factory=list)


def method_name(raw) -> str | None:
    """A server's drafter name in METHODS' words; an unknown name is kept, shortened."""
    if not isinstance(raw, str) or not raw.strip():
        return None
    key = raw.strip().lower().replace(" ", "_")
    return METHODS.get(key, raw.strip()[:40])


def number(value, what: str) -> float:
    """A finite real number (JSON's true/false are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ServerMetricsError(f"{what} is {short(value)}, not a number")
    if isinstance(value, int) and abs(value) > MAX_COUNT:
        raise ServerMetricsError(f"{what} is {short(value)}, beyond the {MAX_COUNT:.3g} a counter can hold exactly")
    if not math.isfinite(value):
        raise ServerMetricsError(f"{what} is {value}, not a finite number")
    return float(value)


def count(value, what: str) -> int:
    """A counter's value: a whole number from 0 to MAX_COUNT (Prometheus writes 12 as 12.0)."""
    x = number(value, what)
    if x < 0:
        raise ServerMetricsError(f"{what} is {short(value)}: a count cannot be negative")
    if x > MAX_COUNT:
        raise ServerMetricsError(f"{what} is {x:.3g}, beyond the {MAX_COUNT:.3g} a counter can hold exactly")
    if x != int(x):
        raise ServerMetricsError(f"{what} is {x}, not a whole number")
    return int(x)


def fraction(value, what: str, high: float = 1.0) -> float:
    """A rate from 0 to `high`."""
    x = number(value, what)
    if not 0 <= x <= high:
        raise ServerMetricsError(f"{what} is {x:g}; it must lie between 0 and {high:g}")
    return x


def short(value) -> str:
    """An untrusted value for an error message: one line, at most 40 characters."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 40 else text[:37] + "..."


def check_counts(drafts: int, draft_tokens: int | None, accepted: int | None) -> None:
    """What any server's counts must satisfy between themselves."""
    if accepted is not None and draft_tokens is not None and accepted > draft_tokens:
        raise ServerMetricsError(f"{accepted} accepted tokens but only {draft_tokens} drafted: "
                                 "a server cannot accept more draft tokens than it drafted")
    if draft_tokens is not None and drafts > draft_tokens:
        raise ServerMetricsError(f"{drafts} drafts but only {draft_tokens} draft tokens: every draft proposes at least one")


def per_position_rates(counts: list[int], drafts: int) -> list[float] | None:
    """vLLM's per-position counts (cycles that accepted position i) as rates; they never rise with i.
    None over zero drafts: those rates are 0/0 (NothingDrafted), not zeros."""
    if len(counts) > MAX_POSITIONS:
        raise ServerMetricsError(f"{len(counts)} draft positions; at most {MAX_POSITIONS} are read")
    for i, n in enumerate(counts):
        if n > drafts:
            raise ServerMetricsError(f"position {i} was accepted {n} times in only {drafts} drafts")
        if i and n > counts[i - 1]:
            raise ServerMetricsError(f"accepted at position {i} ({n}) exceeds position {i - 1} ({counts[i - 1]}): "
                                     "a position is accepted only when every one before it was")
    return [n / drafts for n in counts] if drafts else None


def drafted_nothing(m: ServerMetrics) -> bool:
    """Whether the record covers no draft at all, so that every rate of it is 0/0."""
    return m.drafts == 0 or (m.drafts is None and m.draft_tokens == 0)


def shown(x: float | NothingDrafted | None, spec: str = ".3f", missing: str = "n/a") -> str:
    """A number as every view writes it: `missing` where the input gives none, NothingDrafted in its words."""
    if x is None:
        return missing
    if isinstance(x, NothingDrafted):
        return x.value
    return format(x, spec)


def check_text_size(data: bytes | str, what: str = "the input") -> None:
    size = len(data.encode("utf-8", "replace") if isinstance(data, str) else data)
    if size > MAX_INPUT_BYTES:
        raise ServerMetricsError(f"{what} has {size / 2**20:.1f} MiB; metrics of at most "
                                 f"{MAX_INPUT_BYTES // 2**20} MiB are read (a /metrics scrape is tens of kB)")
