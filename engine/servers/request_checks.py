"""The checks a per-request record passes: counts, rates and lists from untrusted input.

Every message names the request (its place in the input) and the server's own field, so a
hostile or broken file is refused in one line that says where to look. A server computes its
rates from its counts, so a rate that disagrees with them is refused too, as is a histogram
whose length is not K + 1 or whose sum is not the request's steps.
"""
from engine.servers.server_metrics import (
    MAX_POSITIONS,
    ServerMetricsError,
    ServerRequest,
    count,
    fraction,
    short,
)

MAX_NAME = 80  # characters of an id or a category kept
TOLERANCE = 1e-6  # how far a server's rate may lie from its own counts (it computes one from the other)


def name_of(value, what: str) -> str | None:
    """An id or a category: a short string (a number is written as one), or None when absent."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ServerMetricsError(f"{what} is {short(value)}, not a string")
    text = " ".join(str(value).split())
    return text[:MAX_NAME] or None


def optional(block: dict, key: str, what: str, read=count):
    return None if block.get(key) is None else read(block[key], f"{what} {key}")


def length_of(block: dict, key: str, what: str) -> float | None:
    """A mean acceptance length: 1 to K + 1 tokens per step (0 where the request had no step)."""
    x = optional(block, key, what, lambda v, w: fraction(v, w, MAX_POSITIONS + 1))
    if x is not None and x < 1:
        if x == 0:
            return None  # what a server writes for a request that never verified
        raise ServerMetricsError(f"{what} {key} is {x:g}: a step commits at least one token")
    return x


def count_list(value, what: str, longest: int) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise ServerMetricsError(f"{what} is {short(value)}, not a list of counts")
    if len(value) > longest:
        raise ServerMetricsError(f"{what} has {len(value):,} entries; at most {longest:,} are read")
    return [count(v, f"{what}[{i}]") for i, v in enumerate(value)]


def histogram_of(value, what: str, k: int | None) -> list[int] | None:
    counts = count_list(value, what, MAX_POSITIONS + 1)
    if counts is None:
        return None
    if len(counts) < 2:
        raise ServerMetricsError(f"{what} is {short(value)}: it needs K + 1 entries (0 to K accepted), K at least 1")
    if k is not None and len(counts) != k + 1:
        raise ServerMetricsError(f"{what} has {len(counts)} entries but K is {k}: it must have K + 1 = {k + 1}")
    return counts


def k_of(value, what: str) -> int | None:
    if value is None:
        return None
    k = count(value, what)
    if not 1 <= k <= MAX_POSITIONS:
        raise ServerMetricsError(f"{what} is {k}; K must be 1 to {MAX_POSITIONS}")
    return k


def agree(reported: float | None, part: int | None, whole: int | None, what: str, formula: str,
          offset: float = 0.0) -> None:
    """A server's rate must be what its own counts give (it computes one from the other)."""
    if reported is None or part is None or not whole:
        return
    own = offset + part / whole
    if abs(reported - own) > TOLERANCE * max(1.0, own):
        raise ServerMetricsError(f"{what} is {reported:g} but {formula} = {own:g}: the counts and the rate disagree")


def check_request(r: ServerRequest, w: str, names: dict[str, str]) -> None:
    """What any request's counts must satisfy between themselves; messages name the server's fields."""
    acc, drafted, steps, hist = names["accepted"], names["drafted"], names["steps"], names["histogram"]
    if r.accepted is not None and r.drafted is not None and r.accepted > r.drafted:
        raise ServerMetricsError(f"{w} {acc} is {r.accepted} but {drafted} is {r.drafted}: "
                                 "a server cannot accept more draft tokens than it drafted")
    if r.k is not None and r.steps is not None and r.accepted is not None and r.accepted > r.steps * r.k:
        raise ServerMetricsError(f"{w} {acc} is {r.accepted} in {r.steps} steps of K={r.k}: more than K per step")
    if r.accepted_histogram is not None:
        h = r.accepted_histogram
        if r.steps is not None and sum(h) != r.steps:
            raise ServerMetricsError(f"{w} {hist} sums to {sum(h)} steps but {steps} is {r.steps}")
        if r.accepted is not None and sum(j * n for j, n in enumerate(h)) != r.accepted:
            raise ServerMetricsError(f"{w} {hist} gives {sum(j * n for j, n in enumerate(h))} accepted tokens "
                                     f"but {acc} is {r.accepted}")
    if r.accepted_per_step is not None or r.drafted_per_step is not None:
        check_steps(r, w, names)


def check_steps(r: ServerRequest, w: str, names: dict[str, str]) -> None:
    """vLLM's detailed arrays: one entry per step, adding up to the request's counts, none beyond K
    (a drafted length beyond it would also make every per-position loop run that far)."""
    a, d, most = r.accepted_per_step, r.drafted_per_step, MAX_POSITIONS if r.k is None else r.k
    if a is None:
        raise ServerMetricsError(f"{w} has per_step_drafted without per_step_accepted: vLLM writes both")
    if any(x > most for x in [*a, *(d or [])]):
        raise ServerMetricsError(f"{w} per_step_accepted or per_step_drafted has a step beyond K={most}")
    if r.steps is not None and len(a) != r.steps:
        raise ServerMetricsError(f"{w} per_step_accepted has {len(a)} entries but {names['steps']} is {r.steps}")
    if r.accepted is not None and sum(a) != r.accepted:
        raise ServerMetricsError(f"{w} per_step_accepted sums to {sum(a)} but {names['accepted']} is {r.accepted}")
    if r.accepted_histogram is not None and [a.count(j) for j in range(len(r.accepted_histogram))] != r.accepted_histogram:
        raise ServerMetricsError(f"{w} per_step_accepted does not match {names['histogram']}")
    if d is None:
        return
    if len(d) != len(a) or any(x > y for x, y in zip(a, d)):
        raise ServerMetricsError(f"{w} per_step_drafted must have one entry per step, each at least per_step_accepted's")
    if r.drafted is not None and sum(d) != r.drafted:
        raise ServerMetricsError(f"{w} per_step_drafted sums to {sum(d)} but {names['drafted']} is {r.drafted}")
