"""Turning logits into the distributions both models are tested with, and drawing from them.

The same warping (temperature, top-k, top-p) is applied to the draft and the target:
speculative sampling is exact only for the distributions it actually compares.
"""
import torch

from engine.config import SpecSettings


def warp_probs(logits: torch.Tensor, s: SpecSettings) -> torch.Tensor:
    """logits (..., V) -> probabilities (..., V) in float32 after temperature, top-k, top-p.

    Temperature 0 gives a one-hot distribution on the argmax, so greedy decoding is
    the same acceptance rule with degenerate distributions.
    """
    logits = logits.float()
    if s.temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / s.temperature
    if s.top_k and s.top_k < logits.shape[-1]:
        kth = torch.topk(logits, s.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if s.top_p < 1.0:
        probs = _nucleus(probs, s.top_p)
    return probs


# Candidates `_nucleus` ranks first: a full sort of 49,152 probabilities costs about 8 ms for a
# verify's 5 rows on a 2-core Xeon, the top 256 about 0.4 ms; most nuclei are far smaller.
NUCLEUS_CANDIDATES = 256


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep, in descending order, each token while the mass before it is under top_p (the top token
    always survives), then renormalise. The top NUCLEUS_CANDIDATES decide it whenever they hold at
    least top_p in every row: every token after them has that much mass before it and is dropped.
    Else every token is ranked."""
    k = min(NUCLEUS_CANDIDATES, probs.shape[-1])
    ranked, order = torch.topk(probs, k, dim=-1)  # (..., k), descending
    mass = torch.cumsum(ranked, dim=-1)
    if not bool((mass[..., -1] >= top_p).all()):
        ranked, order = torch.sort(probs, dim=-1, descending=True)
        mass = torch.cumsum(ranked, dim=-1)
    mass_before = mass - ranked
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, mass_before < top_p)
    probs = probs * keep
    return probs / probs.sum(-1, keepdim=True)


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token id from a (V,) distribution, by inverse CDF with one draw from the CPU generator.

    torch.multinomial costs about 1.7 ms on a 49k vocabulary on this CPU; a cumulative
    sum and a binary search cost about 0.06 ms, and the draw stays on the CPU generator
    so a run is reproducible on any device.
    """
    cdf = probs.double().cumsum(-1)  # (V,) non-decreasing; flat over zero-probability tokens
    point = uniform(generator) * float(cdf[-1])
    # The first index whose cdf exceeds the point: a token of probability 0 has cdf equal to
    # its predecessor's, so it can never be that first index.
    index = int(torch.searchsorted(cdf, torch.tensor([point], dtype=cdf.dtype, device=cdf.device), right=True))
    if index >= cdf.shape[-1]:  # rounding put the point at the very top: take the last possible token
        index = int(torch.nonzero(probs > 0)[-1])
    return index


def draw(probs: torch.Tensor, s: SpecSettings, generator: torch.Generator) -> int:
    """The next token: the argmax when greedy (no random draw spent), else a sample."""
    if s.temperature == 0:
        return int(probs.argmax())
    return sample(probs, generator)


def uniform(generator: torch.Generator) -> float:
    """One draw u ~ U[0, 1) for the acceptance test."""
    return float(torch.rand((), generator=generator).item())


def residual(p_target: torch.Tensor, p_draft: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p_target - p_draft)): what the target still owes after the draft's proposal.

    If the two agree to rounding there is nothing left to owe; a rejection is then
    only possible through float error, and the target's own distribution is the exact
    fallback.
    """
    diff = torch.clamp(p_target - p_draft, min=0.0)
    total = diff.sum()
    if total <= 1e-12:
        return p_target
    return diff / total
