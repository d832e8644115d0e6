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
from dataclasses import dataclass

import torch

from engine.config import SpecSettings
from engine.cycle.reference import target_generate
from engine.kv.ops import prefill
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


def agreement(target: LoadedModel, draft: LoadedModel, prompt_ids: list[int], continuation: list[int],
              s: SpecSettings) -> Agreement:
    """The draft against the target at every position of `continuation` (which follows `prompt_ids`)."""
    target_logits = continuation_logits(target, prompt_ids, continuation)  # (T, V)
    draft_logits = continuation_logits(draft, prompt_ids, continuation)  # (T, V)
    p, q = warp_probs(target_logits, s), warp_probs(draft_logits, s)  # as the run tests them
    top2 = torch.softmax(target_logits, -1).topk(2, dim=-1).values  # (T, 2), unwarped: how close a tie is
    return Agreement(continuation, (draft_logits.argmax(-1) == target_logits.argmax(-1)).tolist(),
                     torch.minimum(p, q).sum(-1).tolist(), (top2[:, 0] - top2[:, 1]).tolist())


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
