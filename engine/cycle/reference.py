"""The chain's cycle on the reference path, one cycle at a time, as the design notes lay it out
(`ChainCycle`, a cycle kind of engine/cycle/driver.py); it decides by engine/cycle/ratio_test.py.

Cache convention (stated in every trace): after each cycle, the target's and the
draft's caches hold K/V for every committed token except the last one. The last
committed token is the first input of the next cycle, for both models.
"""
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from transformers import DynamicCache

from engine.config import SpecSettings
from engine.cycle import driver
from engine.cycle.pair import Pair, TokenTexts
from engine.cycle.ratio_test import RATIO_TEST, CycleRule, Decision
from engine.cycle.step import CycleStep, Settled
from engine.cycle.trace_record import describe_cycle, shown_tensors
from engine.drafters.base import Drafter, Proposal
from engine.kv.layouts import cycle_layout_fields, layout_for_run, layout_states, new_cache
from engine.kv.ops import cache_len, prefill
from engine.models.device import timed
from engine.models.loading import LoadedModel
from engine.models.sampling import warp_probs
from engine.trace.format import CacheLengths


@dataclass
class RunState:
    """What persists between cycles: the committed ids, the target cache, the drafter's state."""

    committed: list[int]
    target_cache: DynamicCache
    draft_state: Any  # whatever the pair's drafter keeps (a draft cache for the model drafter)
    generated: list[int] = field(default_factory=list)
    finished: bool = False
    verify_features: torch.Tensor | None = None  # (n+1, H) the last verify's top features, for an EAGLE head

    @property
    def draft_cache(self) -> DynamicCache:
        """The draft model's cache, for drafters that keep one."""
        return self.draft_state.cache


def verify(target: LoadedModel, state: RunState, draft_tokens: list[int],
           s: SpecSettings, keep_features: bool = False, feature_layers: tuple[int, ...] | None = None) -> torch.Tensor:
    """One target pass over [last committed, d1..dn]: n+1 distributions (n+1, V).

    With keep_features, the same pass also leaves the target's top features at those n+1
    positions in state.verify_features (a drafter that reads them needs no second pass); with
    `feature_layers` (an EAGLE-3 head's), the hidden states after those layers instead of the top ones.
    """
    ids = [state.committed[-1], *draft_tokens]
    if keep_features:
        logits, state.verify_features = target.forward_with_features(ids, state.target_cache, feature_layers)
    else:
        logits = target.forward(ids, state.target_cache)
    return warp_probs(logits, s).cpu()


def reads_target_features(drafter: Drafter) -> bool:
    """True for a drafter (the EAGLE head) that drafts from the target's features."""
    return getattr(drafter, "reads_target_features", False)


def feature_layers(drafter: Drafter) -> tuple[int, ...] | None:
    """The target layers whose hidden states the drafter reads (an EAGLE-3 head's aux layers); None: the top one."""
    return getattr(drafter, "feature_layers", None)


@dataclass
class ChainDetail:
    """What a chain cycle's settle and describe need of its step."""

    drafter: Drafter  # the pair's drafter as the rule hands it (a teaching fault may alter it)
    proposal: Proposal
    p_target: torch.Tensor  # (n+1, V) warped, on the CPU
    decision: Decision
    target_before: int
    draft_before: int | None
    target_appended: int
    draft_appended: int | None
    draft_cache: Any  # the draft model's cache, when the drafter keeps one over the target's positions
    layout_before: tuple
    layout_appended: tuple


@dataclass
class ChainCycle:
    """The chain's cycle on the reference path: draft up to K, verify once, the rule decides, roll back.
    `rule` is the ratio test; only the teaching code passes a broken one (engine/teaching/faults.py)."""

    pair: Pair
    settings: SpecSettings
    rule: CycleRule = RATIO_TEST

    def check(self) -> None:
        self.pair.drafter.check_settings(self.settings)

    def start(self, prompt_ids: list[int]) -> RunState:
        """Prefill the target's cache and start the drafter, in the layout `settings.cache_layout`;
        a rule that never rolls back needs room for every cycle."""
        pair = self.pair
        layout = layout_for_run(self.settings, len(prompt_ids), getattr(self.rule, "keep_rejected_kv", False))
        target_cache = new_cache(layout, pair.target.model.config)
        if reads_target_features(pair.drafter):  # the prefill's features fill the head: no second pass
            features = pair.target.fill_with_features(prompt_ids[:-1], target_cache, feature_layers(pair.drafter)) \
                if len(prompt_ids) > 1 else None
            return RunState(list(prompt_ids), target_cache, pair.drafter.start(prompt_ids, layout, features))
        target_cache = prefill(pair.target, prompt_ids, target_cache)
        return RunState(list(prompt_ids), target_cache, pair.drafter.start(prompt_ids, layout))

    def step(self, state: RunState, gen: torch.Generator, record: bool) -> CycleStep:
        s, drafter = self.settings, self.rule.drafter(self.pair.drafter)
        target_before, draft_before = cache_len(state.target_cache), drafter.cache_len(state.draft_state)
        draft_cache = state.draft_cache if draft_before is not None else None  # one over the target's positions
        layout_before = layout_states(state.target_cache, draft_cache)
        proposal = drafter.propose(state.draft_state, state.committed, s.k, s, gen)
        draft_tokens = proposal.token_ids
        draft_appended, draft_layout_appended = drafter.cache_len(state.draft_state), layout_states(None, draft_cache)[1]
        reads = reads_target_features(drafter)
        layers = feature_layers(drafter)
        p_target, verify_s = timed(lambda: verify(self.pair.target, state, draft_tokens, s, reads, layers),
                                   self.pair.target.device)
        target_appended = cache_len(state.target_cache)
        target_layout_appended = layout_states(state.target_cache, None)[0]
        decision = self.rule.decide(draft_tokens, proposal.p_draft, p_target, gen)
        detail = ChainDetail(drafter, proposal, p_target, decision, target_before, draft_before, target_appended,
                             draft_appended, draft_cache, layout_before, (target_layout_appended, draft_layout_appended))
        return CycleStep(draft_tokens[: decision.num_accepted], decision.next_token_id, draft_tokens,
                         len(draft_tokens) + 1, proposal.step_times_s, verify_s, proposal.state, detail)

    def settle(self, state: RunState, step: CycleStep) -> Settled:
        d: ChainDetail = step.detail
        self.rule.roll_back(state.target_cache, len(state.committed) - 1)
        if reads_target_features(d.drafter):
            d.drafter.take_target_features(state.draft_state, state.verify_features)
        catch_up = d.drafter.roll_back(state.draft_state, state.committed)
        draft_after = d.drafter.cache_len(state.draft_state)
        return Settled(
            CacheLengths(before=d.target_before, after_append=d.target_appended,
                         after_rollback=cache_len(state.target_cache)),
            None if draft_after is None else CacheLengths(before=d.draft_before, after_append=d.draft_appended,
                                                          after_rollback=draft_after),
            cycle_layout_fields(state.target_cache, d.draft_cache, d.layout_before, d.layout_appended),
            catch_up.happened, catch_up.time_s)

    def describe(self, state: RunState, step: CycleStep, committed: list[int], texts: TokenTexts) -> dict:
        """The distributions are on the CPU already: the shown numbers become lists at once."""
        d: ChainDetail = step.detail
        decision, draft_tokens = d.decision, step.draft_token_ids
        shown = shown_tensors(draft_tokens, d.proposal.p_draft, d.p_target, decision.residual_probs,
                              decision.num_accepted, decision.next_token_id, self.settings.trace_top_k)
        return describe_cycle({name: t.tolist() for name, t in shown.items()}, draft_tokens, decision.num_accepted,
                              decision.next_token_id, decision.accept_prob, decision.u, committed, texts)


def start_run(pair: Pair, prompt_ids: list[int], s: SpecSettings | None = None,
              rule: CycleRule = RATIO_TEST) -> RunState:
    """A chain run's state, prefilled (dynamic layout without settings), for callers that run cycles one by one."""
    return driver.start(ChainCycle(pair, s or SpecSettings(), rule), prompt_ids)


def run_cycle(pair: Pair, state: RunState, s: SpecSettings, gen: torch.Generator,
              cycle: int, texts: TokenTexts, rule: CycleRule = RATIO_TEST, record: bool = True) -> dict:
    """One chain cycle through the driver; returns its trace record."""
    return driver.run_one_cycle(ChainCycle(pair, s, rule), state, gen, cycle, texts, record)


def speculative_generate(pair: Pair, prompt_ids: list[int], s: SpecSettings,
                         rule: CycleRule = RATIO_TEST, record: bool = True) -> Iterator[dict]:
    """Yield one chain record per cycle until EOS or max_new_tokens."""
    return driver.generate(ChainCycle(pair, s, rule), prompt_ids, record)
