"""The fast path's random draws and sampling, as device tensor ops (engine/cycle/fast.py).

- `UniformStream`: the reference path's uniforms, drawn ahead from its CPU generator and
  consumed on the device in the reference's order, so both paths draw the same numbers;
- sampling, the residual and the ratio test (`decide_on_device`) without a host read: the
  reference's engine.models.sampling and engine.cycle.reference.accept_reject, batched.
"""
from dataclasses import dataclass

import torch

from engine.config import SpecSettings

# ---------------------------------------------------------------- random draws, ahead of time

class UniformStream:
    """The reference path's uniforms, drawn ahead from its CPU generator and kept on the device.

    `offset` (a device scalar) is how many the run has consumed; a cycle reads a window
    after it and advances it by the number the reference path would have drawn.
    """

    def __init__(self, seed: int, count: int, device: torch.device) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.values = torch.rand(count, generator=gen).to(device)  # (count,) float32
        self.offset = torch.zeros((), dtype=torch.long, device=device)

    def window(self, width: int) -> torch.Tensor:
        """The next `width` uniforms (clamped at the end; a run never reads past what it drew)."""
        idx = (self.offset + torch.arange(width, device=self.offset.device)).clamp(max=self.values.numel() - 1)
        return self.values[idx]  # (width,)

    def advance(self, used: torch.Tensor) -> None:
        self.offset.add_(used)


def uniforms_needed(s: SpecSettings) -> int:
    """Most draws a run can make: every cycle commits at least one token and draws at most 2K+1."""
    return s.max_new_tokens * (2 * s.k + 1) + 1


# ---------------------------------------------------------------- sampling as tensor ops

def sample_on_device(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """engine.models.sampling.sample with the draw given: inverse CDF in float64, no host read. Returns a () long."""
    cdf = probs.double().cumsum(-1)  # (V,)
    point = (u.double() * cdf[-1]).reshape(1)
    index = torch.searchsorted(cdf, point, right=True)[0]
    positions = torch.arange(probs.shape[-1], device=probs.device)
    last_possible = torch.where(probs > 0, positions, -1).max()  # rounding put the point at the very top
    return torch.where(index >= probs.shape[-1], last_possible, index)


def draw_on_device(probs: torch.Tensor, u: torch.Tensor, greedy: bool) -> torch.Tensor:
    """The next token: argmax when greedy (the draw is not spent), else a sample."""
    return probs.argmax(-1) if greedy else sample_on_device(probs, u)


def residual_on_device(p_target_row: torch.Tensor, p_draft_row: torch.Tensor) -> torch.Tensor:
    """engine.models.sampling.residual without the branch: the target's row when nothing is left to owe."""
    diff = torch.clamp(p_target_row - p_draft_row, min=0.0)  # (V,)
    total = diff.sum()
    return torch.where(total <= 1e-12, p_target_row, diff / total)


@dataclass
class DeviceDecision:
    """The ratio test's outcome, every field a device tensor."""

    num_accepted: torch.Tensor  # () long, 0..K
    accept_prob: torch.Tensor  # (K,) min(1, p_target/p_draft)
    u_test: torch.Tensor  # (K,) the draws of positions 1..K (only the first min(n+1, K) are used)
    next_token: torch.Tensor  # () long: resampled or bonus
    residual: torch.Tensor  # (V,) the distribution the next token came from
    draws_used: torch.Tensor  # () long: uniforms this cycle consumed


def decide_on_device(draft_tokens: torch.Tensor, p_draft: torch.Tensor, p_target: torch.Tensor,
                     u: torch.Tensor, draft_draws: int) -> DeviceDecision:
    """The left-to-right ratio test, resample and bonus of engine.cycle.reference.accept_reject, batched.

    draft_tokens (K,), p_draft (K, V), p_target (K+1, V), u: this cycle's window of uniforms
    (2K+1,), whose first `draft_draws` went to the draft.
    """
    k = draft_tokens.shape[0]
    idx = torch.arange(k, device=draft_tokens.device)
    accept_prob = torch.clamp(p_target[idx, draft_tokens] / p_draft[idx, draft_tokens], max=1.0)  # (K,)
    u_test = u[draft_draws: draft_draws + k]  # (K,)
    passes = (u_test < accept_prob).long()  # strict '<' as in the reference
    num_accepted = passes.cumprod(0).sum()  # () the run of passes from position 1
    tested = torch.clamp(num_accepted + 1, max=k)
    row = torch.clamp(num_accepted, max=k - 1)
    res = residual_on_device(p_target.index_select(0, row.reshape(1))[0], p_draft.index_select(0, row.reshape(1))[0])
    final = torch.where(num_accepted == k, p_target[k], res)  # (V,)
    u_final = u.index_select(0, (draft_draws + tested).reshape(1))[0]
    next_token = sample_on_device(final, u_final)
    return DeviceDecision(num_accepted, accept_prob, u_test, next_token, res, draft_draws + tested + 1)
