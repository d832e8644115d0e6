"""KV cache helpers shared by the cycle and every drafter that keeps a cache.

Rolling a cache back is one call, `crop(cache, keep)`, wherever the engine does it, so a
different cache layout only has to change this module.
"""
from transformers import DynamicCache

from engine.kv.layouts import roll_back_cache


def cache_len(cache: DynamicCache) -> int:
    return int(cache.get_seq_length())


def crop(cache: DynamicCache, keep: int) -> None:
    """Roll the cache back to `keep` positions, the way its layout does (engine/kv/layouts.py)."""
    roll_back_cache(cache, keep)


def prefill(model, prompt_ids: list[int], cache: DynamicCache | None = None) -> DynamicCache:
    """Cache every prompt token but the last, which opens the first cycle."""
    cache = model.new_cache() if cache is None else cache
    if len(prompt_ids) > 1:
        model.fill(prompt_ids[:-1], cache)
    return cache
