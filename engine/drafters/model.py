"""The classic drafter: a small model sharing the target's tokenizer, K autoregressive steps.

It can also run deliberately mis-set, the two ways real deployments get a draft model wrong
(`python -m engine diagnose` plants them and measures what they cost); both stay exact, because
p_draft is always the distribution the draft really sampled from:
- `draft_prompt="raw"`: the draft reads its own rendering of the prompt (without the chat
  template, a mistake EAGLE's users have reported) while the target reads the templated one. After the prompt both
  see the same committed tokens, so the draft's cache is offset from the target's by the
  difference in prompt lengths; everything here runs in the draft's own coordinates.
- `draft_filters="temperature only"`: the draft samples after the request's temperature but
  ignores its top-k/top-p (as a serving engine's draft can, when only the temperature reaches it), proposing
  tokens the target's filters reject.
"""
from dataclasses import dataclass, replace
from functools import partial

import torch
from transformers import DynamicCache

from engine.config import SettingsError, SpecSettings
from engine.drafters.base import CatchUp, Proposal
from engine.kv.layouts import CacheLayout, new_cache
from engine.kv.ops import cache_len, crop, prefill
from engine.kv.rows import RowsKVCache, forward_rows, new_rows_cache, prefill_row, prefill_rows, roll_back_row
from engine.models.device import timed
from engine.models.loading import LoadedModel
from engine.models.sampling import draw, warp_probs
from engine.trace.schema import (
    DRAFT_FILTERS_REQUEST,
    DRAFT_FILTERS_TEMPERATURE,
    DRAFT_MODEL,
    DRAFT_PROMPT_AS_TARGET,
    DRAFT_PROMPT_RAW,
)


@dataclass(frozen=True)
class DraftPrompt:
    """One run's prompt as the draft reads it (draft_prompt "raw"), tied to the target's rendering of it."""

    target_ids: tuple[int, ...]  # the target's prompt ids this rendering belongs to
    ids: tuple[int, ...]  # the draft's own prompt ids


@dataclass
class ModelDraftState:
    cache: DynamicCache  # its own prompt + the committed tokens after the prompt - 1 positions between cycles
    own_prompt: list[int] | None = None  # the draft's prompt when it is not the target's (draft_prompt "raw")
    target_prompt_len: int = 0  # where the committed tokens after the target's prompt start

    def own_sequence(self, committed: list[int]) -> list[int]:
        """The sequence in the draft's own coordinates: its prompt, then what was committed after the target's."""
        if self.own_prompt is None:
            return committed
        return self.own_prompt + committed[self.target_prompt_len:]


@dataclass
class RowsProposal:
    """K proposals for each of B rows (a batch's drafting), from one batched forward per step."""

    token_ids: list[list[int]]  # (B, K); an idle row's are fillers, never tested
    p_draft: torch.Tensor  # (B, K, V) warped, on the CPU
    step_times_s: list[float]  # (K,) each batched draft step, its draws included
    feed_s: float  # the d_K forward (a single run's catch-up after a full accept)


@dataclass(frozen=True)
class ModelDrafter:
    """K draft steps, each drawn from the draft's warped distribution (same warping as the target).

    The three switches after `model` exist only so the teaching code can break the drafter on
    purpose (engine/teaching/faults.py); normal runs leave them at their defaults. `draft_prompt`
    and `draft_filters` plant the mis-settings of the module docstring; `prompt` is this run's
    rendering for draft_prompt "raw", bound by engine/run.py (`reading`).
    """

    model: LoadedModel
    greedy_proposals: bool = False  # propose the argmax but report the sampling distribution (wrong)
    crop_rejected: bool = True  # roll the draft cache back after a rejection
    catch_up: bool = True  # after a full accept, feed d_K, which the draft never ran on
    kind: str = DRAFT_MODEL
    draft_prompt: str = DRAFT_PROMPT_AS_TARGET  # engine.trace.schema.DRAFT_PROMPTS
    draft_filters: str = DRAFT_FILTERS_REQUEST  # engine.trace.schema.DRAFT_FILTERS
    prompt: DraftPrompt | None = None

    @property
    def mis_set(self) -> bool:
        return (self.draft_prompt, self.draft_filters) != (DRAFT_PROMPT_AS_TARGET, DRAFT_FILTERS_REQUEST)

    def reading(self, target_ids: list[int], own_ids: list[int]) -> "ModelDrafter":
        """This drafter for one run whose prompt the draft reads as `own_ids` (the target's: `target_ids`)."""
        return replace(self, prompt=DraftPrompt(tuple(target_ids), tuple(own_ids)))

    def describe(self) -> dict:
        m = self.model
        return {"name": m.name, "architecture": type(m.model).__name__,
                "parameters": sum(p.numel() for p in m.model.parameters()),
                "vocab_size": m.full_vocab_size,
                "kept_vocab": None if m.kept_token_ids is None else int(m.kept_token_ids.numel())}

    def settings(self) -> dict:
        """{"kind": "model"}, plus what is mis-set when something is (so correct runs' headers stay as they were)."""
        out: dict = {"kind": self.kind}
        if self.draft_prompt != DRAFT_PROMPT_AS_TARGET:
            out["draft_prompt"] = self.draft_prompt
            if self.prompt is not None:  # a run's header; a workload's manifest describes the drafter unbound
                out["draft_prompt_token_ids"] = list(self.prompt.ids)
        if self.draft_filters != DRAFT_FILTERS_REQUEST:
            out["draft_filters"] = self.draft_filters
        return out

    def check_settings(self, s: SpecSettings) -> None:
        pass

    def own_prompt_ids(self, prompt_ids: list[int]) -> list[int]:
        """The prompt as the draft reads it; a raw reading must have been bound for this very prompt."""
        if self.draft_prompt == DRAFT_PROMPT_AS_TARGET:
            return prompt_ids
        if self.prompt is None or list(self.prompt.target_ids) != list(prompt_ids):
            raise SettingsError("the draft reads its own rendering of the prompt (draft_prompt 'raw'), which a run "
                                "binds to its prompt (engine.run.run_to_trace); none is bound for this prompt")
        return list(self.prompt.ids)

    def start(self, prompt_ids: list[int], layout: CacheLayout | None = None) -> ModelDraftState:
        own = self.own_prompt_ids(prompt_ids)
        if layout is not None and layout.name != "dynamic" and len(own) > len(prompt_ids):
            # The layout (and the header's cache_layout) is sized for the target's prompt.
            raise SettingsError(f"the draft's own prompt ({len(own)} tokens) is longer than the target's "
                                f"({len(prompt_ids)}): its {layout.name} cache is sized for the target's; use --cache dynamic")
        cache = None if layout is None else new_cache(layout, self.model.model.config)  # the target's layout
        state = ModelDraftState(prefill(self.model, own, cache))
        if self.draft_prompt == DRAFT_PROMPT_RAW:
            state.own_prompt, state.target_prompt_len = own, len(prompt_ids)
        return state

    def draft_settings(self, s: SpecSettings) -> SpecSettings:
        """The warping the draft samples after: the request's, or its temperature alone."""
        if self.draft_filters == DRAFT_FILTERS_TEMPERATURE:
            return replace(s, top_k=0, top_p=1.0)
        return s

    def propose(self, state: ModelDraftState, committed: list[int], k: int, s: SpecSettings,
                gen: torch.Generator) -> Proposal:
        tokens: list[int] = []
        dists, step_times = [], []
        feed = state.own_sequence(committed)[-1]  # the draft's own last token (its prompt's, in a first cycle)
        warp = self.draft_settings(s)
        for _ in range(k):
            (feed, probs), elapsed = timed(partial(self.step, state, feed, warp, gen), self.model.device)
            step_times.append(elapsed)
            tokens.append(feed)
            dists.append(probs)
        return Proposal(tokens, torch.stack(dists).cpu(), step_times)

    def step(self, state: ModelDraftState, feed: int, s: SpecSettings, gen: torch.Generator) -> tuple[int, torch.Tensor]:
        """One draft step: the next token and the (V,) distribution it was drawn from (warped by `s`)."""
        logits = self.model.forward([feed], state.cache)  # (1, V)
        probs = warp_probs(logits[-1], s)  # (V,)
        return (int(probs.argmax()) if self.greedy_proposals else draw(probs, s, gen)), probs

    def cache_len(self, state: ModelDraftState) -> int:
        return cache_len(state.cache)

    def roll_back(self, state: ModelDraftState, committed: list[int]) -> CatchUp:
        own = state.own_sequence(committed)  # the draft's coordinates: its cache indexes its own sequence
        keep = len(own) - 1
        if self.crop_rejected:
            crop(state.cache, keep)
        missing = own[cache_len(state.cache):keep]
        if not missing or not self.catch_up:
            return CatchUp()
        _, elapsed = timed(lambda: self.model.forward(missing, state.cache), self.model.device)  # after a full accept: only d_K
        return CatchUp(True, elapsed)

    # ------------------------------------------------------------ drafting for B rows at once (a batch)
    # One batched forward of one token per row and step over a ragged rows cache (engine/kv/rows.py), each
    # active row drawing with its own generator in the order a single run draws. After the K steps one more
    # forward feeds d_K (gpt-fast's "fill last token into draft model"; a single run feeds it only after a
    # full accept, but here the rows share the forward and some row may need it): every row's cache then holds
    # the positions up to d_K, so a row that accepts all K needs no catch-up and a row that rejects earlier
    # rolls back further. An idle row stays in every forward, fed its last token, appending
    # nothing. Every forward has the same shape.

    def start_rows(self, prompts_ids: list[list[int]], capacity: int) -> RowsKVCache:
        """The draft's rows cache, every row's prompt read alone."""
        cache = new_rows_cache(self.model.model.config, len(prompts_ids), capacity)
        prefill_rows(self.model, cache, prompts_ids)
        return cache

    def admit_row(self, cache: RowsKVCache, row: int, prompt_ids: list[int]) -> None:
        prefill_row(self.model, cache, row, prompt_ids)

    def propose_rows(self, cache: RowsKVCache, last_tokens: list[int], active: list[bool], k: int,
                     s: SpecSettings, gens: list[torch.Generator | None]) -> RowsProposal:
        """K batched draft steps, then the d_K step; a row of the cache advances only while the row is active."""
        appends = [int(a) for a in active]
        feed, tokens, dists, times = list(last_tokens), [], [], []
        for _ in range(k):
            (probs, feed), seconds = timed(partial(self.step_rows, cache, feed, appends, s, gens, last_tokens),
                                           self.model.device)
            tokens.append(feed)
            dists.append(probs)
            times.append(seconds)
        _, feed_s = timed(lambda: forward_rows(self.model, cache, [[t] for t in feed], appends, logits=False),
                          self.model.device)  # d_K, rolled back unless all pass
        return RowsProposal([list(row) for row in zip(*tokens)], torch.stack(dists, dim=1), times, feed_s)

    def step_rows(self, cache: RowsKVCache, fed: list[int], appends: list[int], s: SpecSettings,
                  gens: list[torch.Generator | None], fillers: list[int]) -> tuple[torch.Tensor, list[int]]:
        """One batched draft forward of one token per row: the warped (B, V) distributions on the CPU and each
        active row's draw (an idle row keeps its filler)."""
        logits = forward_rows(self.model, cache, [[t] for t in fed], appends)  # (B, 1, V)
        probs = warp_probs(logits[:, -1], s).cpu()
        return probs, [draw(probs[r], s, gens[r]) if a else fillers[r] for r, a in enumerate(appends)]

    def roll_back_row(self, cache: RowsKVCache, row: int, committed: list[int]) -> None:
        """Row `row` back to its committed length - 1 (the d_K step made a catch-up unnecessary)."""
        roll_back_row(cache, row, len(committed) - 1)
