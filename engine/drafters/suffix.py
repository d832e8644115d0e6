"""Suffix decoding as a drafter: propose what followed the current suffix in earlier text, by frequency.

SuffixDecoding (Oliaro et al., arXiv 2411.04975; vLLM's `suffix` method, through Arctic Inference)
runs no model. It keeps two suffix trees (engine/drafters/suffix_tree.py): one over this request's
prompt and output so far, and one over request outputs, kept across the requests of one loaded
drafter (a workload, the app's live runs), the oldest finished one evicted first. Each cycle both
trees propose their best draft for the committed sequence; the higher score wins, this request's
tree on a tie. Where an agent sends many requests of one shape (tool calls, SQL, JSON), the global
tree already holds the answer's structure before the request repeats any of it itself.

The proposal is deterministic, so p_draft is one-hot and the ratio test stays exact, as for prompt
lookup. The order follows vLLM's proposer, so the two draft the same tokens: before each draft the
request's new output tokens join both trees (its prompt only its own), and a finished output stays
in the global tree. A request counts as finished when the next one starts on this drafter (the
engine's runs have no end-of-request call).
"""
from dataclasses import dataclass, field

import torch

from engine.config import SpecSettings
from engine.drafters.base import CatchUp, Proposal, one_hot_rows
from engine.drafters.suffix_tree import Draft, GlobalCache, Node, SuffixTrie, check_options, speculate
from engine.models.device import timed
from engine.trace.schema import SUFFIX, SUFFIX_GLOBAL, SUFFIX_REQUEST


@dataclass
class SuffixState:
    """One request's tree: over its prompt and every token committed so far."""

    prompt_len: int
    trie: SuffixTrie
    tokens: list[int] = field(default_factory=list)  # the committed sequence as far as the trie holds it
    open_nodes: list[Node] = field(default_factory=list)  # the suffixes still shorter than the trie's depth
    finished: bool = False  # its output is in the global tree as a finished one

    def catch_up(self, committed: list[int]) -> None:
        """Add the committed tokens the trie has not seen (the committed sequence only grows)."""
        if committed[:len(self.tokens)] != self.tokens:
            raise ValueError("the committed sequence no longer starts with what the suffix tree holds")
        for token in committed[len(self.tokens):]:
            self.open_nodes = self.trie.grow(self.open_nodes, token)
            self.tokens.append(token)

    @property
    def output(self) -> list[int]:
        return self.tokens[self.prompt_len:]


def latest_occurrence(sequence: list[int], pattern: list[int]) -> int | None:
    """Where `pattern` last starts in `sequence`, or None."""
    for start in range(len(sequence) - len(pattern), -1, -1):
        if sequence[start:start + len(pattern)] == pattern:
            return start
    return None


def tree_entry(draft: Draft) -> dict:
    """One tree's best draft as the trace records it."""
    return {"match_len": draft.match_len, "score": draft.score, "proposed": len(draft.tokens)}


@dataclass(eq=False)
class SuffixDrafter:
    vocab_size: int  # the target's full vocabulary: one-hot rows over it
    depth: int = 24  # longest substring a tree keeps; a match is at most depth - 1 tokens (vLLM's default)
    factor: float = 1.0  # draft tokens per matched token, at most (vLLM's default)
    min_prob: float = 0.1  # a token whose frequency probability falls below this is pruned (vLLM's default)
    cached_requests: int = 10_000  # earlier requests' outputs the global tree keeps (vLLM's default)
    kind: str = SUFFIX
    cache: GlobalCache = field(init=False, repr=False)  # mutable: it outlives each request
    active: SuffixState | None = field(default=None, init=False, repr=False)  # the request last started

    def __post_init__(self) -> None:
        check_options(self.depth, self.factor, self.min_prob, self.cached_requests)
        self.cache = GlobalCache(self.depth, self.cached_requests)

    def describe(self) -> dict:
        return {"name": "suffix decoding", "architecture": "none (suffix trees over this request and earlier outputs)",
                "parameters": 0, "vocab_size": self.vocab_size, "kept_vocab": None}

    def settings(self) -> dict:
        return {"kind": self.kind, "suffix_depth": self.depth, "suffix_factor": float(self.factor),
                "suffix_min_prob": float(self.min_prob), "suffix_cached_requests": self.cached_requests}

    def check_settings(self, s: SpecSettings) -> None:
        pass  # one-hot proposals are exact at any temperature and filter

    def remember(self, output: list[int]) -> None:
        """Put a finished request's output into the global tree (evicting the oldest beyond the limit)."""
        self.cache.add_request(output)

    def finish_active(self) -> None:
        """The request last started is over: all of its output is in the global tree, as a finished one."""
        if self.active is not None and not self.active.finished:
            self.cache.extend_active(self.active.output)  # the last cycle's tokens came after its last draft
            self.cache.end_active()
            self.active.finished = True

    def start(self, prompt_ids: list[int], layout=None) -> SuffixState:
        self.finish_active()  # a new request on this drafter: the one before it has ended
        state = SuffixState(len(prompt_ids), SuffixTrie(self.depth))
        state.catch_up(list(prompt_ids))
        self.active = state
        return state

    def propose(self, state: SuffixState, committed: list[int], k: int, s: SpecSettings,
                gen: torch.Generator) -> Proposal:
        state.catch_up(committed)
        self.cache.extend_active(state.output)
        (own, earlier), elapsed = timed(lambda: (speculate(state.trie, committed, k, self.factor, self.min_prob),
                                                 speculate(self.cache.trie, committed, k, self.factor, self.min_prob)))
        source = SUFFIX_REQUEST if own.score >= earlier.score else SUFFIX_GLOBAL  # the request's tree wins a tie
        won = own if source == SUFFIX_REQUEST else earlier
        tokens = list(won.tokens)
        record = {"kind": self.kind, "source": source if tokens else None, "match_len": won.match_len,
                  "proposed": len(tokens), "token_probs": list(won.probs), "match_start": None,
                  "request": tree_entry(own), "global": tree_entry(earlier), "cached_requests": len(self.cache)}
        if tokens and source == SUFFIX_REQUEST:  # an earlier place the matched suffix and the proposal stand together
            record["match_start"] = latest_occurrence(committed, committed[len(committed) - won.match_len:] + tokens)
        if not tokens:
            record["note"] = "neither tree has a continuation of the last tokens: nothing proposed, a plain target step"
        return Proposal(tokens, one_hot_rows(tokens, self.vocab_size), [elapsed], record)

    def cache_len(self, state: SuffixState) -> None:
        return None

    def roll_back(self, state: SuffixState, committed: list[int]) -> CatchUp:
        state.catch_up(committed)  # the committed tokens join this request's tree; nothing to undo
        return CatchUp()
