"""The classic drafter: a small model sharing the target's tokenizer, K autoregressive steps."""
from dataclasses import dataclass
from functools import partial

import torch
from transformers import DynamicCache

from engine.config import SpecSettings
from engine.drafters.base import CatchUp, Proposal
from engine.kv.layouts import CacheLayout, new_cache
from engine.kv.ops import cache_len, crop, prefill
from engine.models.device import timed
from engine.models.loading import LoadedModel
from engine.models.sampling import draw, warp_probs
from engine.trace.schema import DRAFT_MODEL


@dataclass
class ModelDraftState:
    cache: DynamicCache  # committed length - 1 positions between cycles


@dataclass(frozen=True)
class ModelDrafter:
    """K draft steps, each drawn from the draft's warped distribution (same warping as the target).

    The three switches below exist only so the teaching code can break the drafter on
    purpose (engine/teaching/faults.py); normal runs leave them at their defaults.
    """

    model: LoadedModel
    greedy_proposals: bool = False  # propose the argmax but report the sampling distribution (wrong)
    crop_rejected: bool = True  # roll the draft cache back after a rejection
    catch_up: bool = True  # after a full accept, feed d_K, which the draft never ran on
    kind: str = DRAFT_MODEL

    def describe(self) -> dict:
        m = self.model
        return {"name": m.name, "architecture": type(m.model).__name__,
                "parameters": sum(p.numel() for p in m.model.parameters()),
                "vocab_size": m.full_vocab_size,
                "kept_vocab": None if m.kept_token_ids is None else int(m.kept_token_ids.numel())}

    def settings(self) -> dict:
        return {"kind": self.kind}

    def check_settings(self, s: SpecSettings) -> None:
        pass

    def start(self, prompt_ids: list[int], layout: CacheLayout | None = None) -> ModelDraftState:
        cache = None if layout is None else new_cache(layout, self.model.model.config)  # the target's layout
        return ModelDraftState(prefill(self.model, prompt_ids, cache))

    def propose(self, state: ModelDraftState, committed: list[int], k: int, s: SpecSettings,
                gen: torch.Generator) -> Proposal:
        tokens: list[int] = []
        dists, step_times = [], []
        feed = committed[-1]
        for _ in range(k):
            (feed, probs), elapsed = timed(partial(self.step, state, feed, s, gen), self.model.device)
            step_times.append(elapsed)
            tokens.append(feed)
            dists.append(probs)
        return Proposal(tokens, torch.stack(dists).cpu(), step_times)

    def step(self, state: ModelDraftState, feed: int, s: SpecSettings, gen: torch.Generator) -> tuple[int, torch.Tensor]:
        """One draft step: the next token and the (V,) distribution it was drawn from."""
        logits = self.model.forward([feed], state.cache)  # (1, V)
        probs = warp_probs(logits[-1], s)  # (V,)
        return (int(probs.argmax()) if self.greedy_proposals else draw(probs, s, gen)), probs

    def cache_len(self, state: ModelDraftState) -> int:
        return cache_len(state.cache)

    def roll_back(self, state: ModelDraftState, committed: list[int]) -> CatchUp:
        keep = len(committed) - 1
        if self.crop_rejected:
            crop(state.cache, keep)
        missing = committed[cache_len(state.cache):keep]
        if not missing or not self.catch_up:
            return CatchUp()
        _, elapsed = timed(lambda: self.model.forward(missing, state.cache), self.model.device)  # after a full accept: only d_K
        return CatchUp(True, elapsed)
