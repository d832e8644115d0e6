"""KV cache helpers shared by the cycle and every drafter that keeps a cache.

Rolling a cache back is one call, `crop(cache, keep)`, wherever the engine does it, so a
different cache layout only has to change this module.
"""
import torch
from transformers import DynamicCache


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cache_len(cache: DynamicCache) -> int:
    return int(cache.get_seq_length())


def crop(cache: DynamicCache, keep: int) -> None:
    """Drop every position at or after `keep` (portable across transformers 4.x and 5.x)."""
    extra = cache_len(cache) - keep
    if extra > 0:
        cache.crop(-extra)


def prefill(model, prompt_ids: list[int]) -> DynamicCache:
    """Cache every prompt token but the last, which opens the first cycle."""
    cache = model.new_cache()
    if len(prompt_ids) > 1:
        model.fill(prompt_ids[:-1], cache)
    return cache
