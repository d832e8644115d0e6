"""One speculative-decoding cycle at a time, as the design notes lay it out.

Cache convention (stated in every trace): after each cycle, the target's and the
draft's caches hold K/V for every committed token except the last one. The last
committed token is the first input of the next cycle, for both models.
"""
import time
from dataclasses import dataclass, field
from typing import Iterator

import torch
from transformers import DynamicCache

from .config import SpecSettings
from .kv_layouts import cycle_layout_fields, layout_for_run, layout_state, new_cache, roll_back_cache
from .models import LoadedModel
from .sampling import draw, residual, sample, uniform, warp_probs

CACHE_CONVENTION = "committed_minus_one"
CACHE_CONVENTION_TEXT = (
    "After each cycle both caches hold K/V for all committed tokens except the last; "
    "the last committed token is fed at the start of the next cycle."
)


@dataclass(frozen=True)
class Faults:
    """Deliberate bugs for the teaching pages only; normal runs never set them."""

    keep_rejected_kv: bool = False  # skip the rollback of both caches
    skip_draft_catch_up: bool = False  # after a full accept, never feed d_K to the draft
    acceptance_rule: str = "ratio"  # see ACCEPTANCE_RULES
    greedy_draft: bool = False  # draft proposes its argmax but is judged by its sampling distribution


ACCEPTANCE_RULES = {
    "ratio": "accept with probability min(1, p_target/p_draft); resample from the residual (correct)",
    "p_target_only": "accept with probability p_target alone (wrong: ignores how often the draft proposes)",
    "no_residual": "on rejection sample from p_target instead of the residual (wrong: double-counts the overlap)",
    "token_match": "accept only if a fresh target sample equals the draft token, else resample from the residual (wrong)",
}


NO_FAULTS = Faults()


@dataclass
class Decision:
    num_accepted: int
    accept_prob: list[float]  # (K,) min(1, p_target/p_draft) of each draft token
    u: list[float]  # one draw per tested position
    rejected_position: int | None  # 1-based, None when all K passed
    next_token_id: int  # the resampled or bonus token
    residual_probs: torch.Tensor | None  # (V,) at the rejection, None for a bonus


@dataclass
class RunState:
    """What persists between cycles: the committed ids and both caches."""

    committed: list[int]
    target_cache: DynamicCache
    draft_cache: DynamicCache
    generated: list[int] = field(default_factory=list)
    finished: bool = False


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cache_len(cache: DynamicCache) -> int:
    return int(cache.get_seq_length())


def crop(cache: DynamicCache, keep: int) -> None:
    """Roll the cache back to `keep` positions, the way its layout does (engine/kv_layouts.py)."""
    roll_back_cache(cache, keep)


def prefill(model: LoadedModel, prompt_ids: list[int], cache: DynamicCache | None = None) -> DynamicCache:
    """Cache every prompt token but the last, which opens the first cycle."""
    cache = model.new_cache() if cache is None else cache
    if len(prompt_ids) > 1:
        model.fill(prompt_ids[:-1], cache)
    return cache


def propose(draft: LoadedModel, state: RunState, s: SpecSettings, gen: torch.Generator,
            faults: Faults = NO_FAULTS) -> tuple[list[int], torch.Tensor, list[float]]:
    """K autoregressive draft steps; returns tokens, their distributions (K, V), step times."""
    tokens: list[int] = []
    dists, step_times = [], []
    feed = state.committed[-1]
    for _ in range(s.k):
        start = time.perf_counter()
        logits = draft.forward([feed], state.draft_cache)  # (1, V)
        probs = warp_probs(logits[-1], s)  # (V,)
        feed = int(probs.argmax()) if faults.greedy_draft else draw(probs, s, gen)
        sync(draft.device)
        step_times.append(time.perf_counter() - start)
        tokens.append(feed)
        dists.append(probs)
    return tokens, torch.stack(dists).cpu(), step_times


def verify(target: LoadedModel, state: RunState, draft_tokens: list[int],
           s: SpecSettings) -> torch.Tensor:
    """One target pass over [last committed, d1..dK]: K+1 distributions (K+1, V)."""
    logits = target.forward([state.committed[-1], *draft_tokens], state.target_cache)
    return warp_probs(logits, s).cpu()


def accept_reject(draft_tokens: list[int], p_draft: torch.Tensor, p_target: torch.Tensor,
                  gen: torch.Generator, rule: str = "ratio") -> Decision:
    """Left-to-right ratio test; resample at the first rejection or add the bonus token."""
    k = len(draft_tokens)
    idx = torch.arange(k)
    p_t = p_target[idx, draft_tokens]  # (K,) target probability of each draft token
    p_d = p_draft[idx, draft_tokens]  # (K,)
    accept_prob = torch.clamp(p_t / p_d, max=1.0).tolist()
    draws: list[float] = []
    for i in range(k):
        draws.append(uniform(gen))
        if not _passes(rule, draws[-1], accept_prob[i], float(p_t[i]), p_target[i], draft_tokens[i], gen):
            res = p_target[i] if rule == "no_residual" else residual(p_target[i], p_draft[i])
            return Decision(i, accept_prob, draws, i + 1, sample(res, gen), res)
    return Decision(k, accept_prob, draws, None, sample(p_target[k], gen), None)


def _passes(rule: str, u: float, accept_prob: float, p_t: float, target_probs: torch.Tensor,
            token: int, gen: torch.Generator) -> bool:
    if rule == "ratio":
        # Strict '<': a token the target gives probability 0 is never accepted, even at u = 0.
        return u < accept_prob
    if rule == "p_target_only":
        return u < p_t
    if rule == "no_residual":
        return u < accept_prob
    if rule == "token_match":
        return sample(target_probs, gen) == token
    raise ValueError(f"unknown acceptance rule {rule!r}; known: {', '.join(ACCEPTANCE_RULES)}")


def commit_tokens(draft_tokens: list[int], d: Decision, budget: int,
                  eos_ids: set[int]) -> tuple[list[int], bool]:
    """Tokens this cycle makes final, cut at the first EOS and at the token budget."""
    tokens = draft_tokens[: d.num_accepted] + [d.next_token_id]
    for i, t in enumerate(tokens):
        if t in eos_ids:
            tokens = tokens[: i + 1]
            break
    tokens = tokens[:budget]
    hit_eos = bool(tokens) and tokens[-1] in eos_ids
    return tokens, hit_eos or len(tokens) == budget


def roll_back(draft: LoadedModel, state: RunState, faults: Faults) -> tuple[bool, float]:
    """Bring both caches to committed length - 1; feed d_K to the draft if it never saw it.

    Returns whether the draft needed that catch-up, and its time.
    """
    keep = len(state.committed) - 1
    if not faults.keep_rejected_kv:
        crop(state.target_cache, keep)
        crop(state.draft_cache, keep)
    missing = state.committed[cache_len(state.draft_cache):keep]
    if not missing or faults.skip_draft_catch_up:
        return False, 0.0
    start = time.perf_counter()
    draft.forward(missing, state.draft_cache)  # after a full accept: only d_K
    sync(draft.device)
    return True, time.perf_counter() - start


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


def top_entries(probs: torch.Tensor, n: int, texts: TokenTexts) -> list[list[dict]]:
    """The n most likely tokens of each row of probs (R, V), as plain data."""
    values, ids = torch.topk(probs, min(n, probs.shape[-1]), dim=-1)
    return [[{"token_id": int(i), "text": texts(int(i)), "p": float(v)}
             for v, i in zip(row_v.tolist(), row_i.tolist()) if v > 0]
            for row_v, row_i in zip(values, ids)]


def residual_entries(d: Decision, p_target: torch.Tensor, p_draft: torch.Tensor,
                     n: int, texts: TokenTexts) -> list[dict] | None:
    """Top entries of the residual at the rejected position, with both models' probabilities."""
    if d.residual_probs is None:
        return None
    j = d.rejected_position - 1
    values, ids = torch.topk(d.residual_probs, min(n, d.residual_probs.shape[-1]))
    ids_list = ids.tolist()
    if d.next_token_id not in ids_list:  # the sampled token is always shown
        ids_list.append(d.next_token_id)
    return [{"token_id": t, "text": texts(t), "p_target": float(p_target[j, t]),
             "p_draft": float(p_draft[j, t]), "residual": float(d.residual_probs[t])}
            for t in ids_list if float(d.residual_probs[t]) > 0 or t == d.next_token_id]


@dataclass
class Pair:
    target: LoadedModel
    draft: LoadedModel
    eos_ids: set[int]


def run_cycle(pair: Pair, state: RunState, s: SpecSettings, gen: torch.Generator,
              cycle: int, texts: TokenTexts, faults: Faults = NO_FAULTS,
              record: bool = True) -> dict:
    """Draft K, verify once, test, commit, roll back. Returns the cycle's trace record."""
    before = {"committed_len": len(state.committed), "target": cache_len(state.target_cache),
              "draft": cache_len(state.draft_cache)}
    layout_before = (layout_state(state.target_cache), layout_state(state.draft_cache))
    cycle_start = time.perf_counter()
    draft_tokens, p_draft, step_times = propose(pair.draft, state, s, gen, faults)
    draft_cache_appended = cache_len(state.draft_cache)
    draft_layout_appended = layout_state(state.draft_cache)
    verify_start = time.perf_counter()
    p_target = verify(pair.target, state, draft_tokens, s)
    sync(pair.target.device)
    verify_time = time.perf_counter() - verify_start
    target_cache_appended = cache_len(state.target_cache)
    target_layout_appended = layout_state(state.target_cache)
    decision = accept_reject(draft_tokens, p_draft, p_target, gen, faults.acceptance_rule)
    budget = s.max_new_tokens - len(state.generated)
    committed, state.finished = commit_tokens(draft_tokens, decision, budget, pair.eos_ids)
    state.committed += committed
    state.generated += committed
    caught_up, catch_up_time = roll_back(pair.draft, state, faults)
    cycle_time = time.perf_counter() - cycle_start
    rec = {
        "type": "cycle", "cycle": cycle, "committed_len_before": before["committed_len"],
        "draft_token_ids": draft_tokens, "num_accepted": decision.num_accepted,
        "committed_token_ids": committed, "finished": state.finished,
        "target_cache_len": {"before": before["target"], "after_append": target_cache_appended,
                             "after_rollback": cache_len(state.target_cache)},
        "draft_cache_len": {"before": before["draft"], "after_append": draft_cache_appended,
                            "after_rollback": cache_len(state.draft_cache)},
        **cycle_layout_fields(state.target_cache, state.draft_cache, layout_before,
                              (target_layout_appended, draft_layout_appended)),
        "draft_catch_up": caught_up, "verify_positions": len(draft_tokens) + 1,
        "draft_time_s": sum(step_times), "draft_step_times_s": step_times,
        "verify_time_s": verify_time, "catch_up_time_s": catch_up_time, "cycle_time_s": cycle_time,
    }
    if record:
        rec.update(describe_cycle(draft_tokens, decision, p_draft, p_target, committed, s, texts))
    return rec


def describe_cycle(draft_tokens: list[int], d: Decision, p_draft: torch.Tensor,
                   p_target: torch.Tensor, committed: list[int], s: SpecSettings,
                   texts: TokenTexts) -> dict:
    """The probabilities and draws behind a cycle's decision, for the trace."""
    k = len(draft_tokens)
    idx = torch.arange(k)
    beta = torch.minimum(p_target[:k], p_draft).sum(-1)  # (K,) overlap of the two distributions
    return {
        "draft_token_texts": texts.many(draft_tokens),
        "p_draft": p_draft[idx, draft_tokens].tolist(),
        "p_target": p_target[idx, draft_tokens].tolist(),
        "accept_prob": d.accept_prob, "u": d.u, "beta": beta.tolist(),
        "rejected_position": d.rejected_position,
        "resampled_token_id": d.next_token_id if d.rejected_position else None,
        "bonus_token_id": None if d.rejected_position else d.next_token_id,
        "next_token_text": texts(d.next_token_id),
        "residual_top": residual_entries(d, p_target, p_draft, s.trace_top_k, texts),
        "target_top": top_entries(p_target, s.trace_top_k, texts),
        "draft_top": top_entries(p_draft, s.trace_top_k, texts),
        "committed_token_texts": texts.many(committed),
    }


def start_run(pair: Pair, prompt_ids: list[int], s: SpecSettings | None = None,
              faults: Faults = NO_FAULTS) -> RunState:
    """Prefill both caches, in the layout `s.cache_layout` (dynamic without settings)."""
    if not prompt_ids:
        raise ValueError("the prompt is empty: at least one token is needed to start decoding")
    layout = layout_for_run(s or SpecSettings(), len(prompt_ids), faults.keep_rejected_kv)
    caches = [new_cache(layout, m.model.config) for m in (pair.target, pair.draft)]
    return RunState(list(prompt_ids), prefill(pair.target, prompt_ids, caches[0]),
                    prefill(pair.draft, prompt_ids, caches[1]))


def speculative_generate(pair: Pair, prompt_ids: list[int], s: SpecSettings,
                         faults: Faults = NO_FAULTS, record: bool = True) -> Iterator[dict]:
    """Yield one record per cycle until EOS or max_new_tokens."""
    gen = torch.Generator().manual_seed(s.seed)
    texts = TokenTexts(pair.target.tokenizer)
    state = start_run(pair, prompt_ids, s, faults)
    cycle = 0
    while not state.finished:
        yield run_cycle(pair, state, s, gen, cycle, texts, faults, record)
        cycle += 1


def target_generate(target: LoadedModel, prompt_ids: list[int], s: SpecSettings,
                    eos_ids: set[int]) -> list[int]:
    """Plain autoregressive decoding of the target alone, one token per forward."""
    gen = torch.Generator().manual_seed(s.seed)
    cache = prefill(target, prompt_ids)
    last, out = prompt_ids[-1], []
    while len(out) < s.max_new_tokens:
        probs = warp_probs(target.forward([last], cache)[-1], s)
        last = draw(probs, s, gen)
        out.append(last)
        if last in eos_ids:
            break
    return out


def eos_ids_of(model: LoadedModel) -> set[int]:
    ids = set()
    for source in (model.tokenizer.eos_token_id, getattr(model.model.generation_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(int(i) for i in source)
    return ids
