"""Prompt lookup (n-gram) drafting: copy what followed the last n tokens at an earlier occurrence.

As Hugging Face `generate(prompt_lookup_num_tokens=...)` and vLLM's `ngram` method do:
take the last n tokens of prompt + output (n from max_ngram down to min_ngram), find
an earlier occurrence, and propose the up to K tokens that followed it. Which occurrence
is an option (engine/trace/schema.py NGRAM_MATCHES): the most recent one by default, as
this lab always drafted; the earliest one, as vLLM V1 and Hugging Face do.
No model runs, so drafting costs almost nothing (c close to 0); it pays off when the
output repeats the input (rewriting, summarising, editing code). With no match the
cycle proposes nothing and is a plain target step.
"""
from dataclasses import dataclass

import torch

from engine.config import SettingsError, SpecSettings
from engine.drafters.base import CatchUp, Proposal, one_hot_rows
from engine.models.device import timed
from engine.trace.schema import MAX_NGRAM, NGRAM_EARLIEST, NGRAM_LATEST, NGRAM_MATCHES, PROMPT_LOOKUP


@dataclass
class Match:
    ngram_size: int  # n: how many trailing tokens matched
    match_start: int  # position of the earlier occurrence of those n tokens
    continuation_start: int  # match_start + n: where the proposed tokens were copied from


def find_match(committed: list[int], max_ngram: int, min_ngram: int, earliest: bool = False) -> Match | None:
    """The longest n (max_ngram..min_ngram) whose last-n tokens occurred before with a follower;
    among its occurrences the most recent one, or with `earliest` the first one."""
    length = len(committed)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        tail = committed[length - n:]
        starts = range(length - n) if earliest else range(length - n - 1, -1, -1)  # each leaves a follower
        for start in starts:
            if committed[start:start + n] == tail:
                return Match(n, start, start + n)
    return None


@dataclass(frozen=True)
class PromptLookupDrafter:
    vocab_size: int  # the target's full vocabulary: one-hot rows over it
    max_ngram: int = 3
    min_ngram: int = 1
    ngram_match: str = NGRAM_LATEST  # which earlier occurrence it copies from (NGRAM_MATCHES)
    # vLLM samples a request's first token in the prefill, before its proposer runs; the lab's first cycle
    # looks up in the prompt alone. Set, the first cycle proposes nothing, as vLLM's first step.
    after_first_token: bool = False
    kind: str = PROMPT_LOOKUP

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram <= MAX_NGRAM:
            raise SettingsError(f"n-gram sizes need 1 <= min ({self.min_ngram}) <= max ({self.max_ngram}) <= {MAX_NGRAM}")
        if self.ngram_match not in NGRAM_MATCHES:
            raise SettingsError(f"ngram_match must be one of {', '.join(NGRAM_MATCHES)}, got {self.ngram_match!r}")

    def describe(self) -> dict:
        return {"name": "prompt lookup (n-gram)", "architecture": "none (copies earlier tokens)",
                "parameters": 0, "vocab_size": self.vocab_size, "kept_vocab": None}

    def settings(self) -> dict:
        # "latest" is left out: a header without the field drafted that way, as every trace before the option
        chosen = {} if self.ngram_match == NGRAM_LATEST else {"ngram_match": self.ngram_match}
        chosen |= {"after_first_token": True} if self.after_first_token else {}
        return {"kind": self.kind, "max_ngram": self.max_ngram, "min_ngram": self.min_ngram} | chosen

    def check_settings(self, s: SpecSettings) -> None:
        pass

    def start(self, prompt_ids: list[int], layout=None) -> int:
        return len(prompt_ids)  # the prompt's length; everything else it needs is the committed sequence itself

    def propose(self, state: int, committed: list[int], k: int, s: SpecSettings,
                gen: torch.Generator) -> Proposal:
        if self.after_first_token and len(committed) <= state:
            record = {"kind": self.kind, "matched": False, "proposed": 0, "ngram_size": None, "match_start": None,
                      "continuation_start": None, "note": "no lookup before the first output token (vLLM's order)"}
            return Proposal([], one_hot_rows([], self.vocab_size), [0.0], record)
        match, elapsed = timed(lambda: find_match(committed, self.max_ngram, self.min_ngram,
                                                  self.ngram_match == NGRAM_EARLIEST))
        tokens = [] if match is None else committed[match.continuation_start:match.continuation_start + k]
        rows = one_hot_rows(tokens, self.vocab_size)  # (n, V)
        record = {"kind": self.kind, "matched": match is not None, "proposed": len(tokens),
                  "ngram_size": match and match.ngram_size, "match_start": match and match.match_start,
                  "continuation_start": match and match.continuation_start}
        if match is None:
            record["note"] = "no earlier occurrence of the last tokens: nothing proposed, a plain target step"
        return Proposal(tokens, rows, [elapsed], record)

    def cache_len(self, state: int) -> None:
        return None

    def roll_back(self, state: int, committed: list[int]) -> CatchUp:
        return CatchUp()  # nothing to roll back: the next lookup reads the committed sequence
