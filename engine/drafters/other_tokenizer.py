"""A draft model with its own tokenizer (Hugging Face "universal assisted generation").

Each cycle the draft continues the committed text in its own tokens; that text is
re-encoded with the target's tokenizer, and the target verifies those tokens. The draft
never gives a distribution over the target's tokens, so the proposal is deterministic
(one-hot rows), which keeps greedy decoding exact: accept while the token is the
target's argmax, and the output equals the target's own greedy output.

Sampling is refused: the ratio test needs the draft's probability of each *target*
token, which exists only for strings both vocabularies share (Timor et al., ICML 2025,
"Lossless speculative decoding algorithms for heterogeneous vocabularies"). With a
deterministic proposal at T > 0, p_draft would be one-hot on a greedy draft token whose
real sampling law is unknown, and the output would not follow the target.

The draft keeps its own KV cache over its own tokens of the committed text, so its
length is not the target's cache length; it is recorded under "drafter_state".

Token healing: the byte-level target often stops mid-word, so the committed text's last
draft token is usually a fragment the draft rarely saw at the end of a text (" C" where
training had " CAPULET"). The draft therefore re-predicts that last token, restricted to
tokens whose text starts with it, and continues from there; its cache holds the committed
text's draft tokens except the last two. The proposal is the text after the fragment.
"""
from dataclasses import dataclass, field
from functools import partial

import torch
from transformers import DynamicCache

from engine.config import SettingsError, SpecSettings
from engine.drafters.base import CatchUp, Proposal, one_hot_rows
from engine.drafters.refusals import OTHER_TOKENIZER_GREEDY_ONLY
from engine.kv.ops import cache_len, crop
from engine.kv.prefix import shared_start
from engine.models.device import timed
from engine.models.loading import LoadedModel
from engine.trace.schema import OTHER_TOKENIZER


@dataclass
class OtherTokenizerState:
    cache: DynamicCache  # K/V of `cached` (draft token ids)
    cached: list[int] = field(default_factory=list)  # draft ids whose K/V the cache holds, in order
    committed_draft_ids: list[int] = field(default_factory=list)  # the committed text in draft tokens
    last_record: dict | None = None  # this cycle's drafter_state, completed by roll_back
    token_texts: list[str] = field(default_factory=list)  # decoded text of every draft token id


@dataclass(frozen=True)
class OtherTokenizerDrafter:
    model: LoadedModel  # the draft, with its own tokenizer
    target_tokenizer: object
    vocab_size: int  # the target's full vocabulary
    max_draft_steps: int = 0  # draft tokens per cycle at most; 0 means K
    kind: str = OTHER_TOKENIZER

    def describe(self) -> dict:
        m = self.model
        return {"name": m.name, "architecture": type(m.model).__name__,
                "parameters": sum(p.numel() for p in m.model.parameters()),
                "vocab_size": m.full_vocab_size, "kept_vocab": None,
                "tokenizer": type(m.tokenizer).__name__}

    def settings(self) -> dict:
        return {"kind": self.kind, "max_draft_steps": self.max_draft_steps,
                "draft_tokenizer": type(self.model.tokenizer).__name__,
                "draft_vocab_size": self.model.full_vocab_size}

    def check_settings(self, s: SpecSettings) -> None:
        if s.temperature != 0:
            raise SettingsError(OTHER_TOKENIZER_GREEDY_ONLY)

    # ------------------------------------------------------------ text in both token spaces

    def text_of(self, target_ids: list[int]) -> str:
        return self.target_tokenizer.decode(target_ids)

    def draft_ids_of(self, text: str) -> list[int]:
        return list(self.model.tokenizer(text, add_special_tokens=False)["input_ids"])

    def target_ids_of(self, text: str) -> list[int]:
        return list(self.target_tokenizer(text, add_special_tokens=False)["input_ids"])

    # ------------------------------------------------------------ the drafter interface

    def start(self, prompt_ids: list[int], layout=None) -> OtherTokenizerState:
        """Its cache is always dynamic: it counts the draft's own tokens, not the target's positions."""
        tok = self.model.tokenizer
        state = OtherTokenizerState(self.model.new_cache(), token_texts=[tok.decode([i]) for i in range(len(tok))])
        self.roll_back(state, prompt_ids)
        return state

    def healing_mask(self, state: OtherTokenizerState, fragment: str) -> torch.Tensor:
        """(V_draft,) True for the draft tokens whose text starts with `fragment`."""
        allowed = [text.startswith(fragment) for text in state.token_texts]
        allowed += [False] * (self.model.full_vocab_size - len(allowed))
        return torch.tensor(allowed, device=self.model.device)

    def next_draft_token(self, state: OtherTokenizerState, feed: list[int], mask: torch.Tensor | None) -> int:
        logits = self.model.forward(feed, state.cache)[-1]  # (V_draft,)
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
        return int(logits.argmax())

    def propose(self, state: OtherTokenizerState, committed: list[int], k: int, s: SpecSettings,
                gen: torch.Generator) -> Proposal:
        self.check_settings(s)
        cache_before = cache_len(state.cache)
        own: list[int] = []  # draft tokens proposed this cycle
        target_ids: list[int] = []
        step_times: list[float] = []
        ids = state.committed_draft_ids
        healing = len(ids) >= 2  # re-predict the last draft token (see the module docstring)
        fragment = state.token_texts[ids[-1]] if healing else ""
        feed = ids[-2:-1] if healing else ids[-1:]
        mask = self.healing_mask(state, fragment) if healing else None
        eos = self.model.tokenizer.eos_token_id
        steps = (self.max_draft_steps or k) + healing
        for _ in range(steps):
            if not feed:
                break
            token, elapsed = timed(partial(self.next_draft_token, state, feed, mask), self.model.device)
            state.cached += feed
            step_times.append(elapsed)
            mask = None
            if token == eos:
                break
            own.append(token)
            target_ids = self.target_ids_of(self.new_text(own, fragment))
            if len(target_ids) >= k:
                break
            feed = [token]
        proposal = target_ids[:k]
        # Where each draft token's text ends, counted in target tokens: the boundaries the app draws.
        # A boundary lines up when re-encoding the text up to that draft token gives a prefix of the
        # whole re-encoding; a target token that merges across it makes it not line up.
        whole = self.target_ids_of(self.new_text(own, fragment))
        prefixes = [self.target_ids_of(self.new_text(own[:i + 1], fragment)) for i in range(len(own))]
        ends = [len(p) for p in prefixes]
        aligned = [p == whole[:len(p)] for p in prefixes]
        record = {"kind": self.kind, "draft_token_ids": own, "healed_fragment": fragment,
                  "draft_token_texts": [self.model.tokenizer.decode([t]) for t in own],
                  "draft_token_target_ends": ends, "draft_token_boundary_aligned": aligned,
                  "target_token_ids": proposal,
                  "target_token_texts": [self.target_tokenizer.decode([t]) for t in proposal],
                  "draft_cache_len": {"before": cache_before, "after_append": cache_len(state.cache)}}
        state.last_record = record
        return Proposal(proposal, one_hot_rows(proposal, self.vocab_size), step_times or [0.0], record)

    def new_text(self, own: list[int], fragment: str) -> str:
        """Text the draft tokens add after the committed text (the healed fragment removed)."""
        text = self.model.tokenizer.decode(own)
        return text[len(fragment):] if text.startswith(fragment) else ""  # "" proposes nothing

    def cache_len(self, state: OtherTokenizerState) -> None:
        return None  # its cache counts draft tokens, not target positions: see drafter_state

    def roll_back(self, state: OtherTokenizerState, committed: list[int]) -> CatchUp:
        """Re-encode the committed text in draft tokens; keep the cache over the common prefix,
        up to all draft tokens but the last two (the last is re-predicted: token healing)."""
        ids = self.draft_ids_of(self.text_of(committed))
        cached_len = max(len(ids) - 2, 0) if len(ids) >= 2 else 0
        keep = min(shared_start(state.cached, ids), cached_len)
        crop(state.cache, keep)
        state.cached = state.cached[:keep]
        missing = ids[keep:cached_len]
        elapsed = 0.0
        if missing:
            _, elapsed = timed(lambda: self.model.forward(missing, state.cache), self.model.device)
            state.cached += missing
        state.committed_draft_ids = ids
        if state.last_record is not None:
            state.last_record["draft_cache_len"]["after_rollback"] = cache_len(state.cache)
            state.last_record["draft_committed_len"] = len(ids)
        return CatchUp(bool(missing), elapsed)
