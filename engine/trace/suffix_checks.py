"""What a suffix-decoding trace must mean: its header's options and each cycle's drafter state.

The request's own tree is over the prompt and output, which the trace holds, so a proposal from it
is checked against the text itself: the matched suffix occurs earlier followed by the proposed
tokens, each token's probability is the share of the matched suffix's occurrences that go on that
way (count of the longer substring over count of the matched one, the current occurrence counted),
and each is a most frequent continuation. The global tree is over request outputs, which the trace
does not hold (earlier outputs, and this request's output as vLLM's proposer adds it): its draft is
checked for consistency only (probabilities in (0, 1], never rising,
none below the minimum, the length within factor x match length and K, the score their sum).
Which tree won follows from the two scores. Arctic Inference and engine/drafters/suffix_tree.py
compute in float32; the checks allow for that.
"""
import math

from engine.trace.check_basics import RunFacts, fail, is_int, is_num
from engine.trace.schema import (
    MAX_CACHED_REQUESTS,
    MAX_SUFFIX_DEPTH,
    MAX_SUFFIX_FACTOR,
    SUFFIX_GLOBAL,
    SUFFIX_REQUEST,
    SUFFIX_SOURCES,
)

F32_TOL = 1e-6  # float32 rounding of a probability or a score of at most 64 of them

OPTIONS = ("suffix_depth", "suffix_factor", "suffix_min_prob", "suffix_cached_requests")


def check_suffix_header(d: dict, where: str) -> None:
    """The header's drafter entry: every option present and in range."""
    depth, factor, min_prob, cached = (d.get(name) for name in OPTIONS)
    if not (is_int(depth) and 2 <= depth <= MAX_SUFFIX_DEPTH):
        fail(where, "drafter.suffix_depth", f"must be an integer in 2..{MAX_SUFFIX_DEPTH}")
    if not (is_num(factor) and 0 < factor <= MAX_SUFFIX_FACTOR):
        fail(where, "drafter.suffix_factor", f"must be a number in (0, {MAX_SUFFIX_FACTOR:g}]")
    if not (is_num(min_prob) and 0 <= min_prob <= 1):
        fail(where, "drafter.suffix_min_prob", "must be a probability in [0, 1]")
    if not (is_int(cached) and 0 <= cached <= MAX_CACHED_REQUESTS):
        fail(where, "drafter.suffix_cached_requests", f"must be an integer in 0..{MAX_CACHED_REQUESTS}")


def draft_limit(match_len: int, factor: float, k: int) -> int:
    """As the drafter computes it (engine/drafters/suffix_tree.py draft_limit)."""
    return max(0, min(k, int(match_len * factor + 1e-6)))


def check_tree_entry(entry, name: str, facts: RunFacts, where: str) -> dict:
    """One tree's best draft: {match_len, score, proposed}, nothing proposed exactly when nothing matched."""
    field = f"drafter_state.{name}"
    if not isinstance(entry, dict) or set(entry) != {"match_len", "score", "proposed"}:
        fail(where, field, "must be {match_len, score, proposed}: that tree's best draft")
    m, score, n = entry["match_len"], entry["score"], entry["proposed"]
    depth, factor = facts.drafter["suffix_depth"], facts.drafter["suffix_factor"]
    if not (is_int(m) and 0 <= m < depth and is_int(n) and is_num(score)):
        fail(where, field, f"match_len an integer in 0..{depth - 1}, proposed an integer, score a number")
    if n > draft_limit(m, factor, facts.k) or m + n > depth:
        fail(where, f"{field}.proposed", f"at most min(K, factor x match_len) = {draft_limit(m, factor, facts.k)} "
                                         f"tokens, and match_len + proposed at most the depth {depth}")
    if (m == 0) != (n == 0) or not (n * facts.drafter["suffix_min_prob"] - F32_TOL <= score <= n + F32_TOL) \
            or (n == 0) != (score == 0):
        fail(where, f"{field}.score", "a draft of n tokens scores the sum of their probabilities (each at least the "
                                      "minimum, at most 1); a tree that matched nothing proposes nothing and scores 0")
    return entry


def check_probs(probs, drafts: list[int], won: dict, facts: RunFacts, where: str) -> None:
    """The winner's token probabilities: one per draft token, in (0, 1], never rising, none below the minimum."""
    floor = facts.drafter["suffix_min_prob"]
    if not (isinstance(probs, list) and len(probs) == len(drafts) and all(is_num(p) and 0 < p <= 1 for p in probs)):
        fail(where, "drafter_state.token_probs", "one probability in (0, 1] per proposed token")
    if any(b > a + F32_TOL for a, b in zip(probs, probs[1:])) or any(p < floor - F32_TOL for p in probs):
        fail(where, "drafter_state.token_probs", f"a walk down a suffix tree multiplies probabilities: they never rise, "
                                                 f"and a token below the minimum {floor:g} is pruned")
    if not math.isclose(math.fsum(probs), won["score"], rel_tol=0, abs_tol=F32_TOL * (1 + len(probs))):
        fail(where, "drafter_state.token_probs", "the winning tree's score is the sum of its token probabilities")


def occurrences(sequence: list[int], pattern: list[int]) -> list[int]:
    """Every start of `pattern` in `sequence` (overlapping ones too)."""
    n = len(pattern)
    return [p for p in range(len(sequence) - n + 1) if sequence[p:p + n] == pattern]


def check_against_text(state: dict, drafts: list[int], probs: list[float], sequence: list[int], where: str) -> None:
    """A draft from the request's own tree, against the prompt and output: the matched suffix with the proposal
    after it occurs at match_start; each probability is the share of the suffix's occurrences continued that
    way, and each token a most frequent continuation."""
    m, start, length = state["match_len"], state.get("match_start"), len(sequence)
    tail = sequence[length - m:]
    if not (is_int(start) and 0 <= start and start + m + len(drafts) <= length
            and sequence[start:start + m + len(drafts)] == tail + drafts):
        fail(where, "drafter_state.match_start", f"the sequence's last {m} tokens followed by the proposal occur "
                                                 "there, earlier in the prompt and output")
    starts = occurrences(sequence, tail)  # the current occurrence, at the end, counts too
    total = len(starts)
    for i, token in enumerate(drafts):
        followers = [sequence[p + m + i] for p in starts if p + m + i < length]
        if followers.count(token) < max(followers.count(t) for t in set(followers)):
            fail(where, f"draft_token_ids[{i}]", "the request's tree proposes a most frequent continuation")
        starts = [p for p in starts if p + m + i < length and sequence[p + m + i] == token]
        if not math.isclose(probs[i], len(starts) / total, rel_tol=0, abs_tol=F32_TOL):
            fail(where, f"drafter_state.token_probs[{i}]", f"must be {len(starts)}/{total}: the share of the last "
                                                           f"{m} tokens' occurrences that go on with the proposal")


def check_suffix_state(state: dict, drafts: list[int], sequence: list[int], facts: RunFacts, where: str) -> None:
    """A suffix-decoding cycle's drafter state (engine/drafters/suffix.py records it)."""
    own = check_tree_entry(state.get("request"), SUFFIX_REQUEST, facts, where)
    earlier = check_tree_entry(state.get("global"), SUFFIX_GLOBAL, facts, where)
    source = state.get("source")
    if source is not None and source not in SUFFIX_SOURCES:
        fail(where, "drafter_state.source", f"must be one of {', '.join(map(repr, SUFFIX_SOURCES))} or null")
    winner = SUFFIX_REQUEST if own["score"] >= earlier["score"] else SUFFIX_GLOBAL  # the request's tree wins a tie
    won = own if winner == SUFFIX_REQUEST else earlier
    want = winner if won["proposed"] else None
    if source != want:
        fail(where, "drafter_state.source", f"must be {want!r}: the higher score wins, the request's tree on a tie, "
                                            "null when neither proposes anything")
    proposed, match_len = state.get("proposed"), state.get("match_len")
    if not (is_int(proposed) and is_int(match_len) and proposed == won["proposed"] == len(drafts)
            and match_len == won["match_len"]):
        fail(where, "drafter_state.proposed", f"the winning tree's draft is the cycle's proposal: {len(drafts)} "
                                              f"token(s) after a match of {won['match_len']}")
    probs = state.get("token_probs")
    check_probs(probs, drafts, won, facts, where)
    cached = state.get("cached_requests")
    if not (is_int(cached) and 0 <= cached <= facts.drafter["suffix_cached_requests"]):
        fail(where, "drafter_state.cached_requests", "how many earlier requests the global tree held: at most the limit")
    if facts.drafter["suffix_cached_requests"] == 0 and earlier["proposed"]:
        fail(where, "drafter_state.global", "with suffix_cached_requests 0 the global tree is empty and proposes nothing")
    if source == SUFFIX_REQUEST:
        check_against_text(state, drafts, probs, sequence, where)
    elif state.get("match_start") is not None:
        fail(where, "drafter_state.match_start", "only a draft from the request's own tree has a place in the text")
