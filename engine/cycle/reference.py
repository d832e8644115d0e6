"""One speculative-decoding cycle at a time, as the design notes lay it out.

Cache convention (stated in every trace): after each cycle, the target's and the
draft's caches hold K/V for every committed token except the last one. The last
committed token is the first input of the next cycle, for both models.
"""
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol, TypeVar

import torch
from transformers import DynamicCache

from engine.config import SpecSettings
from engine.cycle.record import CycleTimes, cycle_record, describe_cycle, shown_tensors
from engine.drafters.base import Drafter
from engine.drafters.model import ModelDrafter
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
class Pair:
    """A target and what drafts for it. `draft` is the draft model, if the drafter has one
    that shares the target's token space; `drafter` defaults to drafting with it."""

    target: LoadedModel
    draft: LoadedModel | None
    eos_ids: set[int]
    drafter: Drafter | None = None

    def __post_init__(self) -> None:
        if self.drafter is None:
            if self.draft is None:
                raise ValueError("a pair needs a draft model or a drafter")
            self.drafter = ModelDrafter(self.draft)


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
    """How a cycle decides and rolls back. The engine runs RATIO_TEST; only the teaching
    code (engine/teaching/faults.py) passes deliberately broken rules."""

    def decide(self, draft_tokens: list[int], p_draft: torch.Tensor, p_target: torch.Tensor,
               gen: torch.Generator) -> Decision: ...

    def roll_back(self, cache: DynamicCache, keep: int) -> None: ...

    def drafter(self, drafter: Drafter) -> Drafter: ...


class RatioTest:
    """The correct rule: the ratio test, rejected K/V cropped, the drafter as it is."""

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


class TokenTexts:
    """Decoded text of single token ids, remembered across a run."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.known: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        if token_id not in self.known:
            self.known[token_id] = self.tokenizer.decode([token_id])
        return self.known[token_id]

    def many(self, token_ids: list[int]) -> list[str]:
        return [self(t) for t in token_ids]


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


def run_cycle(pair: Pair, state: RunState, s: SpecSettings, gen: torch.Generator,
              cycle: int, texts: TokenTexts, rule: CycleRule = RATIO_TEST,
              record: bool = True) -> dict:
    """Draft up to K, verify once, test, commit, roll back. Returns the cycle's trace record."""
    drafter = rule.drafter(pair.drafter)
    before = {"committed_len": len(state.committed), "target": cache_len(state.target_cache),
              "draft": drafter.cache_len(state.draft_state)}
    draft_cache = state.draft_cache if before["draft"] is not None else None  # one over the target's positions
    layout_before = layout_states(state.target_cache, draft_cache)
    cycle_start = time.perf_counter()
    proposal = drafter.propose(state.draft_state, state.committed, s.k, s, gen)
    draft_tokens = proposal.token_ids
    draft_cache_appended = drafter.cache_len(state.draft_state)
    draft_layout_appended = layout_states(None, draft_cache)[1]
    reads = reads_target_features(drafter)
    p_target, verify_time = timed(lambda: verify(pair.target, state, draft_tokens, s, reads), pair.target.device)
    target_cache_appended = cache_len(state.target_cache)
    target_layout_appended = layout_states(state.target_cache, None)[0]
    decision = rule.decide(draft_tokens, proposal.p_draft, p_target, gen)
    budget = s.max_new_tokens - len(state.generated)
    committed, state.finished = commit_tokens(draft_tokens, decision, budget, pair.eos_ids)
    state.committed += committed
    state.generated += committed
    rule.roll_back(state.target_cache, len(state.committed) - 1)
    if reads:
        drafter.take_target_features(state.draft_state, state.verify_features)
    catch_up = drafter.roll_back(state.draft_state, state.committed)
    cycle_time = time.perf_counter() - cycle_start
    draft_after = drafter.cache_len(state.draft_state)
    description = None
    if record:  # the distributions are on the CPU already: the shown numbers become lists at once
        shown = shown_tensors(draft_tokens, proposal.p_draft, p_target, decision.residual_probs,
                              decision.num_accepted, decision.next_token_id, s.trace_top_k)
        description = describe_cycle({name: t.tolist() for name, t in shown.items()}, draft_tokens,
                                     decision.num_accepted, decision.next_token_id, decision.accept_prob,
                                     decision.u, committed, texts)
    return cycle_record(
        cycle, before["committed_len"], draft_tokens, decision.num_accepted, committed, state.finished,
        CacheLengths(before=before["target"], after_append=target_cache_appended,
                     after_rollback=cache_len(state.target_cache)),
        None if draft_after is None else CacheLengths(before=before["draft"], after_append=draft_cache_appended,
                                                      after_rollback=draft_after),
        cycle_layout_fields(state.target_cache, draft_cache, layout_before, (target_layout_appended, draft_layout_appended)),
        catch_up.happened, CycleTimes(proposal.step_times_s, verify_time, catch_up.time_s, cycle_time),
        proposal.state, description)


def start_run(pair: Pair, prompt_ids: list[int], s: SpecSettings | None = None,
              rule: CycleRule = RATIO_TEST) -> RunState:
    """Prefill the target's cache and start the drafter, in the layout `s.cache_layout`
    (dynamic without settings); a rule that never rolls back needs room for every cycle."""
    if not prompt_ids:
        raise ValueError("the prompt is empty: at least one token is needed to start decoding")
    layout = layout_for_run(s or SpecSettings(), len(prompt_ids), getattr(rule, "keep_rejected_kv", False))
    target_cache = new_cache(layout, pair.target.model.config)
    if reads_target_features(pair.drafter):  # the prefill's features fill the head: no second pass
        features = pair.target.fill_with_features(prompt_ids[:-1], target_cache) if len(prompt_ids) > 1 else None
        return RunState(list(prompt_ids), target_cache, pair.drafter.start(prompt_ids, layout, features))
    target_cache = prefill(pair.target, prompt_ids, target_cache)
    return RunState(list(prompt_ids), target_cache, pair.drafter.start(prompt_ids, layout))


def speculative_generate(pair: Pair, prompt_ids: list[int], s: SpecSettings,
                         rule: CycleRule = RATIO_TEST, record: bool = True) -> Iterator[dict]:
    """Yield one record per cycle until EOS or max_new_tokens."""
    pair.drafter.check_settings(s)
    gen = torch.Generator().manual_seed(s.seed)
    texts = TokenTexts(pair.target.tokenizer)
    state = start_run(pair, prompt_ids, s, rule)
    cycle = 0
    while not state.finished:
        yield run_cycle(pair, state, s, gen, cycle, texts, rule, record)
        cycle += 1


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


def eos_ids_of(model: LoadedModel) -> set[int]:
    ids = set()
    for source in (model.tokenizer.eos_token_id, getattr(model.model.generation_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(int(i) for i in source)
    return ids
