"""One speculative-decoding cycle at a time, as the design notes lay it out.

Cache convention (stated in every trace): after each cycle, the target's and the
draft's caches hold K/V for every committed token except the last one. The last
committed token is the first input of the next cycle, for both models.
"""
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol, TypeVar

import torch
from transformers import DynamicCache

from engine.config import SpecSettings
from engine.cycle import driver
from engine.cycle.pair import Pair, TokenTexts
from engine.cycle.record import describe_cycle, shown_tensors
from engine.cycle.step import CycleStep, Settled
from engine.drafters.base import Drafter, Proposal
from engine.kv.layouts import cycle_layout_state, layout_for_run, layout_name, layout_state, new_cache
from engine.kv.ops import cache_len, crop, prefill
from engine.models.device import timed
from engine.models.loading import LoadedModel
from engine.models.sampling import draw, residual, sample, uniform, warp_probs
from engine.trace.commit import final_tokens
from engine.trace.format import CacheLengths


@dataclass
class Decision:
    num_accepted: int
    accept_prob: list[float]  # (n,) min(1, p_target/p_draft) of each draft token
    u: list[float]  # one draw per tested position
    rejected_position: int | None  # 1-based, None when all n passed
    next_token_id: int  # the resampled or bonus token
    residual_probs: torch.Tensor | None  # (V,) at the rejection, None for a bonus


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
           s: SpecSettings, keep_features: bool = False) -> torch.Tensor:
    """One target pass over [last committed, d1..dn]: n+1 distributions (n+1, V).

    With keep_features, the same pass also leaves the target's top features at those n+1
    positions in state.verify_features (a drafter that reads them needs no second pass).
    """
    ids = [state.committed[-1], *draft_tokens]
    if keep_features:
        logits, state.verify_features = target.forward_with_features(ids, state.target_cache)
    else:
        logits = target.forward(ids, state.target_cache)
    return warp_probs(logits, s).cpu()


def reads_target_features(drafter: Drafter) -> bool:
    """True for a drafter (the EAGLE head) that drafts from the target's features."""
    return getattr(drafter, "reads_target_features", False)


def accept_reject(draft_tokens: list[int], p_draft: torch.Tensor, p_target: torch.Tensor,
                  gen: torch.Generator) -> Decision:
    """Left-to-right ratio test; resample at the first rejection or add the bonus token.

    p_draft (n, V) and p_target (n+1, V); n may be 0 (a plain target step: only the bonus).
    """
    k = len(draft_tokens)
    idx = torch.arange(k)
    p_t = p_target[idx, draft_tokens]  # (n,) target probability of each draft token
    p_d = p_draft[idx, draft_tokens]  # (n,)
    accept_prob = torch.clamp(p_t / p_d, max=1.0).tolist()
    draws: list[float] = []
    for i in range(k):
        draws.append(uniform(gen))
        # Strict '<': a token the target gives probability 0 is never accepted, even at u = 0.
        if not draws[-1] < accept_prob[i]:
            res = residual(p_target[i], p_draft[i])
            return Decision(i, accept_prob, draws, i + 1, sample(res, gen), res)
    return Decision(k, accept_prob, draws, None, sample(p_target[k], gen), None)


class CycleRule(Protocol):
    """How a cycle decides and rolls back, for every cycle kind (the fast path runs RATIO_TEST only).
    The engine runs RATIO_TEST; only the teaching code (engine/teaching/faults.py) passes
    deliberately broken rules, through the run mode (engine/mode.py)."""

    def decide(self, draft_tokens: list[int], p_draft: torch.Tensor, p_target: torch.Tensor,
               gen: torch.Generator) -> Decision: ...

    def roll_back(self, cache: DynamicCache, keep: int) -> None: ...

    def drafter(self, drafter: Drafter) -> Drafter: ...

    # A tree's rollback: (cache, start, kept_slots) -> moves (engine/tree/compact.py's Rollback);
    # None means the correct compaction.
    tree_rollback: Callable | None
    for_chains: bool  # the cycle kinds this rule can run in
    for_trees: bool


class RatioTest:
    """The correct rule: the ratio test, rejected K/V cropped (a tree's compacted), the drafter as it is."""

    tree_rollback = None
    for_chains, for_trees = True, True  # the cycle kinds a rule applies to (engine/mode.py refuses the others)

    def decide(self, draft_tokens, p_draft, p_target, gen) -> Decision:
        return accept_reject(draft_tokens, p_draft, p_target, gen)

    def roll_back(self, cache: DynamicCache, keep: int) -> None:
        crop(cache, keep)

    def drafter(self, drafter: Drafter) -> Drafter:
        return drafter


RATIO_TEST = RatioTest()


def commit_tokens(draft_tokens: list[int], d: Decision, budget: int,
                  eos_ids: set[int]) -> tuple[list[int], bool]:
    """Tokens this cycle makes final: the accepted drafts and the resampled or bonus token,
    cut at the first EOS and at the token budget (engine.trace.commit, the rule the checks apply)."""
    return final_tokens(draft_tokens[: d.num_accepted] + [d.next_token_id], budget, eos_ids)


def layout_states(target_cache, draft_cache) -> tuple[dict | None, dict | None]:
    """The layout facts of the target's and (if the drafter keeps one) the draft's cache."""
    return (None if target_cache is None else layout_state(target_cache),
            None if draft_cache is None else layout_state(draft_cache))


def cycle_layout_fields(target_cache, draft_cache, before: tuple, after_append: tuple) -> dict:
    """Layout state of one cycle; none for a dynamic cache (its state is its length), and none
    for the draft when the drafter keeps no cache over the target's positions."""
    if layout_name(target_cache) == "dynamic":
        return {}
    fields = {"target_cache_layout_state": cycle_layout_state(target_cache, before[0], after_append[0])}
    if draft_cache is not None:
        fields["draft_cache_layout_state"] = cycle_layout_state(draft_cache, before[1], after_append[1])
    return fields


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
            features = pair.target.fill_with_features(prompt_ids[:-1], target_cache) if len(prompt_ids) > 1 else None
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
        p_target, verify_s = timed(lambda: verify(self.pair.target, state, draft_tokens, s, reads), self.pair.target.device)
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


Token = TypeVar("Token")  # an int on the host, or a device scalar on the fast path


def decode_plain(step: Callable[[Token], Token], last: Token, max_new_tokens: int,
                 stop: Callable[[Token], bool]) -> list[Token]:
    """Plain (target-only) decoding's one loop: `step` turns the last token into the next, until
    max_new_tokens or a token `stop` ends the run on. The step is all that differs between the
    reference path, the sweep and the fast path (which stops nowhere: no per-token sync)."""
    out = []
    while len(out) < max_new_tokens:
        last = step(last)
        out.append(last)
        if stop(last):
            break
    return out


def target_step(target: LoadedModel, cache: DynamicCache, s: SpecSettings) -> Callable[[int], int]:
    """One plain decoding step of the target over `cache`, one forward per token, with the
    run's own generator (seeded from the settings, as a speculative run's)."""
    gen = torch.Generator().manual_seed(s.seed)
    return lambda last: draw(warp_probs(target.forward([last], cache)[-1], s), s, gen)


def target_generate(target: LoadedModel, prompt_ids: list[int], s: SpecSettings,
                    eos_ids: set[int]) -> list[int]:
    """Plain autoregressive decoding of the target alone, one token per forward."""
    step = target_step(target, prefill(target, prompt_ids), s)
    return decode_plain(step, prompt_ids[-1], s.max_new_tokens, lambda t: t in eos_ids)
