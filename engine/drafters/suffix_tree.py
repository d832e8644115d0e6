"""Depth-limited suffix tries and the speculation that walks them (suffix decoding's data structure).

SuffixDecoding (Oliaro et al., arXiv 2411.04975) keeps every substring of up to `depth` tokens of
some token sequences in a tree, each node counting how often its substring occurs. To draft, it
finds the current context's last m tokens in the tree, then follows the most frequent child again
and again; a token's probability is the product of count(child) / count(parent) along the way,
and the walk stops below a minimum probability. Every match length m is tried; the draft with the
highest score (the sum of its probabilities) wins, a longer match winning a tie.

This is a plain trie (one node per token, no path compression): simple to read and check, and
small enough at the lab's lengths. Its semantics follow the Arctic Inference implementation vLLM runs
(`arctic-inference`, SuffixTree::speculate): the same counts, probabilities (in float32), limits,
pruning and choice of match length. Ties between equally frequent children go to the one that
reached its count first, as that implementation's sibling list orders them; where its path
compression reorders siblings, a tie can go the other way (a draft of the same probabilities).
No torch: the registry checks the options here before any model loads.
"""
import math
import struct
from collections import deque
from dataclasses import dataclass, field
from itertools import count as counter

from engine.config import SettingsError
from engine.trace.schema import MAX_CACHED_REQUESTS, MAX_SUFFIX_DEPTH, MAX_SUFFIX_FACTOR


def f32(x: float) -> float:
    """`x` rounded to float32, the precision Arctic Inference computes probabilities and scores in:
    two drafts whose scores tie in exact arithmetic can differ in float32, and the reference picks by it."""
    return struct.unpack("f", struct.pack("f", x))[0]


@dataclass(eq=False)
class Node:
    count: int = 0  # occurrences of the substring from the root to here
    # Orders children of equal count as Arctic Inference's sibling list does: the one that rose to
    # its count first goes first (stamp: when, positive), and one that fell to it, when an evicted
    # request is taken out, goes ahead of those, the latest fall first (stamp: minus when).
    stamp: int = 0
    children: dict[int, "Node"] = field(default_factory=dict)


@dataclass(frozen=True)
class Draft:
    """What one tree proposes for one context."""

    tokens: tuple[int, ...] = ()
    probs: tuple[float, ...] = ()  # each token's frequency probability, non-increasing
    match_len: int = 0  # context tokens matched (0 when the tree proposes nothing)

    @property
    def score(self) -> float:
        """Expected accepted tokens if the probabilities were right: the paper's ranking of drafts."""
        return score_of(self.probs)


def score_of(probs: tuple[float, ...] | list[float]) -> float:
    """The sum of the probabilities, added up in float32 in order (as the reference does)."""
    total = 0.0
    for p in probs:
        total = f32(total + p)
    return total


class SuffixTrie:
    """Every substring of at most `depth` tokens of the sequences added, with its number of occurrences."""

    def __init__(self, depth: int) -> None:
        if depth < 1:
            raise ValueError(f"a suffix trie needs depth >= 1, got {depth}")
        self.depth = depth
        self.root = Node()
        self._clock = counter(1)

    def grow(self, open_nodes: list["Node"], token: int) -> list["Node"]:
        """Append `token` to a sequence being added: every suffix still shorter than `depth` (the
        open nodes, oldest first) and a new one-token suffix each gain one occurrence. Returns the
        new open nodes; a suffix that reached `depth` is closed."""
        grown = []
        for node in [*open_nodes, self.root]:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = Node()
            child.count += 1
            child.stamp = next(self._clock)
            grown.append(child)
        self.root.count += 1
        return grown[max(0, len(grown) - (self.depth - 1)):]

    def add(self, tokens: list[int]) -> None:
        """Add a whole sequence."""
        open_nodes: list[Node] = []
        for token in tokens:
            open_nodes = self.grow(open_nodes, token)

    def remove(self, tokens: list[int]) -> None:
        """Take out a sequence added before: each of its suffixes loses one occurrence per node, and a
        node left with none goes (with everything under it: their counts are no larger)."""
        for start in range(len(tokens)):
            node = self.root
            node.count -= 1
            for token in tokens[start:start + self.depth]:
                child = node.children[token]
                child.count -= 1
                child.stamp = -next(self._clock)
                if child.count == 0:
                    del node.children[token]
                    break
                node = child

    def find(self, pattern: list[int]) -> Node | None:
        """The node of `pattern`, or None if it never occurred."""
        node = self.root
        for token in pattern:
            node = node.children.get(token)
            if node is None:
                return None
        return node


def walk(node: Node, limit: int, min_prob: float) -> tuple[list[int], list[float]]:
    """Follow the most frequent child from `node` for at most `limit` tokens, while the cumulative
    probability (count of the child over count of the matched node) stays at least `min_prob`."""
    tokens: list[int] = []
    probs: list[float] = []
    prob, floor = 1.0, f32(min_prob)
    while len(tokens) < limit and node.children:
        token, child = max(node.children.items(), key=lambda item: (item[1].count, -item[1].stamp))
        prob = f32(prob * f32(child.count / node.count))
        if prob < floor:
            break  # pruned: too rare a continuation to be worth a verify position
        tokens.append(token)
        probs.append(prob)
        node = child
    return tokens, probs


def draft_limit(match_len: int, factor: float, k: int) -> int:
    """How many tokens a match of `match_len` may propose: factor x match length, at most k (a short
    match is weak evidence, so it drafts little). The 1e-6 keeps 0.5 x 4 from rounding down to 1."""
    return max(0, min(k, int(match_len * factor + 1e-6)))


def speculate(trie: SuffixTrie, context: list[int], k: int, factor: float, min_prob: float) -> Draft:
    """The best draft `trie` offers for what follows `context`: every match length from 1 up to
    the trie's depth - 1 is tried, and the highest score wins (a longer match on a tie)."""
    context = context[-trie.depth:]
    best = Draft()
    for m in range(1, len(context)):
        node = trie.find(context[-m:])
        if node is None:
            break  # a longer suffix cannot occur when this one does not
        tokens, probs = walk(node, draft_limit(m, factor, k), min_prob)
        if tokens and score_of(probs) >= best.score:
            best = Draft(tuple(tokens), tuple(probs), m)
    return best


class GlobalCache:
    """One trie over request outputs: the request in flight, token by token, and at most `max_requests`
    finished ones, the oldest taken out first (FIFO) when another one ends. `max_requests` 0 keeps none,
    the one in flight included.

    The request in flight is in it as vLLM's suffix proposer has it (Arctic Inference's
    `add_active_response` runs before every draft): a request drafts from its own output through this
    trie too, where its tokens add to the counts of earlier outputs that share them."""

    def __init__(self, depth: int, max_requests: int) -> None:
        self.trie = SuffixTrie(depth)
        self.max_requests = max_requests
        self.outputs: deque[list[int]] = deque()  # finished outputs, oldest first
        self.active: list[int] = []  # the output in flight, as far as the trie holds it
        self.active_open: list[Node] = []  # its suffixes still shorter than the trie's depth

    def extend_active(self, output: list[int]) -> None:
        """Grow the trie by the output in flight's tokens it has not seen. An output that no longer starts
        with what the trie holds is a run restarted from a copy of an earlier state (the exactness lab
        reruns one prefill many times): it replaces the one held, so no branch counts twice."""
        if self.max_requests <= 0:
            return
        if output[:len(self.active)] != self.active:
            self.trie.remove(self.active)
            self.active, self.active_open = [], []
        for token in output[len(self.active):]:
            self.active_open = self.trie.grow(self.active_open, token)
            self.active.append(token)

    def end_active(self) -> None:
        """The request in flight is over: its output is the newest finished one."""
        if self.active:
            self.outputs.append(self.active)
        self.active, self.active_open = [], []
        while len(self.outputs) > self.max_requests:
            self.trie.remove(self.outputs.popleft())

    def add_request(self, output: list[int]) -> None:
        """A whole finished output at once."""
        self.extend_active(list(output))
        self.end_active()

    def __len__(self) -> int:
        return len(self.outputs)


def is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_options(depth: int, factor: float, min_prob: float, cached_requests: int) -> None:
    """Refuse options out of range, naming the flag (the registry's DrafterOptions calls it too)."""
    if not (is_number(depth) and isinstance(depth, int) and 2 <= depth <= MAX_SUFFIX_DEPTH):
        raise SettingsError(f"--suffix-depth must be an integer in 2..{MAX_SUFFIX_DEPTH}, got {depth!r}")
    if not (is_number(factor) and 0 < factor <= MAX_SUFFIX_FACTOR):
        raise SettingsError(f"--suffix-factor must be a number in (0, {MAX_SUFFIX_FACTOR:g}], got {factor!r}")
    if not (is_number(min_prob) and 0 <= min_prob <= 1):
        raise SettingsError(f"--suffix-min-prob must be a probability in [0, 1], got {min_prob!r}")
    if not (is_number(cached_requests) and isinstance(cached_requests, int) and 0 <= cached_requests <= MAX_CACHED_REQUESTS):
        raise SettingsError(f"--suffix-cached-requests must be an integer in 0..{MAX_CACHED_REQUESTS}, "
                            f"got {cached_requests!r}")
