"""How far the draft agrees with the target, from one teacher-forced forward of each model.

Why it predicts greedy speculation exactly: at temperature 0 every cycle starts on the target's
greedy path, and draft token i is tested only if tokens 1..i-1 were the target's own. So the draft
always proposes from a context on that path, and its proposal at path position j is its argmax
there. One forward of the draft over the prompt and the target's greedy continuation gives all
those argmaxes at once; where each agrees with the continuation, the draft token would be
accepted. Walking the agreements K at a time gives every cycle's accepted count (up to near-ties,
where a full forward and a cached one can round differently). For sampling, sum_x min(p, q) at a
position is the chance the ratio test accepts the draft's token there (Leviathan et al. 2023,
alpha = E[sum_x min(p, q)]), on the target's path.
"""
import time
from dataclasses import dataclass

import torch

from engine.config import SpecSettings
from engine.cycle.plain import target_generate
from engine.kv.ops import prefill
from engine.kv.rows import check_batchable, forward_rows, new_rows_cache, prefill_rows
from engine.models.loading import LoadedModel
from engine.models.sampling import warp_probs


@dataclass(frozen=True)
class Agreement:
    """Per position of the target's continuation (predicting continuation[j] from everything before it)."""

    continuation: list[int]  # the target's own tokens
    top1: list[bool]  # the draft's top token is the target's (on the greedy path: the continuation's token)
    overlap: list[float]  # sum_x min(p_target, p_draft) after the run's warping
    target_margin: list[float]  # the target's top-1 minus top-2 probability (small: a near-tie)

    @property
    def top1_rate(self) -> float:
        return sum(self.top1) / len(self.top1) if self.top1 else 0.0

    @property
    def mean_overlap(self) -> float:
        return sum(self.overlap) / len(self.overlap) if self.overlap else 0.0


def continuation_logits(model: LoadedModel, prompt_ids: list[int], continuation: list[int],
                        cache=None) -> torch.Tensor:
    """(T, V) logits predicting each token of `continuation`: the prompt's prefill (`prefill`, the
    engine's own; pass `cache` already filled to reuse one), then one forward over the prompt's last
    token and the continuation but its last, as a verify pass reads its positions."""
    cache = prefill(model, prompt_ids) if cache is None else cache
    return model.forward([prompt_ids[-1]] + continuation[:-1], cache)  # row j predicts continuation[j]


def compare(continuation: list[int], target_logits: torch.Tensor, draft_logits: torch.Tensor,
            s: SpecSettings) -> Agreement:
    """The agreement from both models' (T, V) logits over `continuation`."""
    p, q = warp_probs(target_logits, s), warp_probs(draft_logits, s)  # as the run tests them
    top2 = torch.softmax(target_logits, -1).topk(2, dim=-1).values  # (T, 2), unwarped: how close a tie is
    return Agreement(continuation, (draft_logits.argmax(-1) == target_logits.argmax(-1)).tolist(),
                     torch.minimum(p, q).sum(-1).tolist(), (top2[:, 0] - top2[:, 1]).tolist())


def agreement(target: LoadedModel, draft: LoadedModel, prompt_ids: list[int], continuation: list[int],
              s: SpecSettings) -> Agreement:
    """The draft against the target at every position of `continuation` (which follows `prompt_ids`)."""
    return compare(continuation, continuation_logits(target, prompt_ids, continuation),
                   continuation_logits(draft, prompt_ids, continuation), s)


# Rows per batched forward: enough to amortise each forward's fixed cost (on the small Shakespeare
# models that cost is most of a forward), few enough that the chunk's (rows, T, V) float32 logits
# stay small (16 x 40 x 49,152 x 4 bytes = 126 MB on the chat vocabulary).
ROWS_PER_FORWARD = 16
# Padded positions a chunk may hold per real one: rows are padded to the chunk's longest prompt, and
# on the Shakespeare models (prompts of 35 to 635 characters) one chunk of all lengths cost more
# than the requests one by one.
PADDING_SLACK = 1.25


def chunks(lengths: list[int], rows: int | None = None, slack: float = PADDING_SLACK) -> list[list[int]]:
    """Indices grouped for batched forwards: by length, at most `rows` (ROWS_PER_FORWARD) per group, and
    padded to its longest member each group holds at most `slack` times its real positions."""
    rows = rows or ROWS_PER_FORWARD
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        group = groups[-1] if groups else None
        if group and len(group) < rows and lengths[i] * (len(group) + 1) <= slack * (sum(lengths[j] for j in group) + lengths[i]):
            group.append(i)
        else:
            groups.append([i])
    return groups


def batched_continuation_logits(model: LoadedModel, prompts: list[list[int]], continuations: list[list[int]],
                                timings: dict[str, float] | None = None) -> list[torch.Tensor]:
    """`continuation_logits` for many requests in two forwards (engine/batch): every prompt but its
    last token into one ragged cache, then every row's [last prompt token, continuation but its last].
    Rows are padded at the end; padding writes stale slots no real position attends to. `timings`
    gains the seconds of each forward ("prompts_s", "continuations_s")."""
    width = max(len(c) for c in continuations)
    # the longest prompt's cached tokens, then a forward of `width` slots on every row
    cache = new_rows_cache(model.model.config, len(prompts), max(len(p) for p in prompts) - 1 + width)
    started = time.perf_counter()
    prefill_rows(model, cache, prompts)
    prompts_done = time.perf_counter()
    ids = [[p[-1], *c[:-1]] + [c[-1]] * (width - len(c)) for p, c in zip(prompts, continuations)]
    logits = forward_rows(model, cache, ids, [len(c) for c in continuations])  # (B, width, V)
    if timings is not None:
        timings["prompts_s"] = timings.get("prompts_s", 0.0) + prompts_done - started
        timings["continuations_s"] = timings.get("continuations_s", 0.0) + time.perf_counter() - prompts_done
    return [logits[r, :len(c)] for r, c in enumerate(continuations)]


def can_batch(model: LoadedModel) -> bool:
    """Whether `batched_continuation_logits` runs this model (full attention that adds a 4-D mask)."""
    try:
        check_batchable(model)
        new_rows_cache(model.model.config, 1, 1)
    except ValueError:
        return False
    return True


def agreements(target: LoadedModel, draft: LoadedModel, prompts: list[list[int]], continuations: list[list[int]],
               s: SpecSettings, timings: dict[str, float] | None = None) -> list[Agreement]:
    """`agreement` for each (prompt, continuation), requests of similar length batched (`chunks`) where
    both models allow it (one by one where not). Same positions, same figures: the batched rows
    differ from a single forward by float32 rounding only. `timings`: as batched_continuation_logits'."""
    if not (can_batch(target) and can_batch(draft)):
        return [agreement(target, draft, p, c, s) for p, c in zip(prompts, continuations)]
    found: dict[int, Agreement] = {}
    for chunk in chunks([len(p) + len(c) for p, c in zip(prompts, continuations)]):
        chunk = [i for i in chunk if continuations[i]]
        if not chunk:
            continue
        ps, cs = [prompts[i] for i in chunk], [continuations[i] for i in chunk]
        target_logits = batched_continuation_logits(target, ps, cs, timings)
        draft_logits = batched_continuation_logits(draft, ps, cs, timings)
        for i, t, d in zip(chunk, target_logits, draft_logits):
            found[i] = compare(continuations[i], t, d, s)
    return [found.get(i) or Agreement([], [], [], []) for i in range(len(prompts))]


def greedy_agreement(target: LoadedModel, draft: LoadedModel, prompt_ids: list[int], s: SpecSettings,
                     eos_ids: set[int]) -> Agreement:
    """The agreement along the target's greedy continuation, K tokens past the budget (the last
    cycle drafts that far)."""
    longer = SpecSettings(k=s.k, temperature=0.0, max_new_tokens=s.max_new_tokens + s.k)
    return agreement(target, draft, prompt_ids, target_generate(target, prompt_ids, longer, eos_ids), s)


def simulate_greedy_cycles(top1: list[bool], k: int, max_new_tokens: int) -> list[int]:
    """Each greedy cycle's accepted count, from the draft's agreement along the target's path."""
    accepted, position = [], 0
    while position < min(max_new_tokens, len(top1)):
        run = 0
        while run < k and position + run < len(top1) and top1[position + run]:
            run += 1
        accepted.append(run)
        position += run + 1  # the accepted tokens and the target's correction (or bonus)
    return accepted
