"""KV cache helpers shared by the cycle and every drafter that keeps a cache.

Rolling a cache back is one call, `crop(cache, keep)`, wherever the engine does it, so a
different cache layout only has to change this module.
"""
import torch
from transformers import DynamicCache

from engine.kv.layouts import attended_kv, layout_name, roll_back_cache


def cache_len(cache: DynamicCache) -> int:
    return int(cache.get_seq_length())


def crop(cache: DynamicCache, keep: int) -> None:
    """Roll the cache back to `keep` positions, the way its layout does (engine/kv/layouts.py)."""
    roll_back_cache(cache, keep)


def prefill(model, prompt_ids: list[int], cache: DynamicCache | None = None) -> DynamicCache:
    """Cache every prompt token but the last, which opens the first cycle. A model with a prefix store on
    (engine/kv/prefix.py) copies the K/V of the start it shares with the last prompt it read, and reads the rest."""
    cache = model.new_cache() if cache is None else cache
    if len(prompt_ids) <= 1:
        return cache
    store = getattr(model, "prefix_store", None)
    if store is None or layout_name(cache) != "dynamic" or cache_len(cache) != 0:
        model.fill(prompt_ids[:-1], cache)
        return cache
    ids = prompt_ids[:-1]
    reused = store.reusable(ids)
    copy_in(cache, [(k[:, :, :reused], v[:, :, :reused]) for k, v in store.kv] if reused else [])
    model.fill(ids[reused:], cache)
    store.remember(ids, attended_kv(cache))
    return cache


@torch.inference_mode()  # the K/V were made by inference-mode forwards
def copy_in(cache: DynamicCache, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Append per-layer (1, H, T, D) K/V to an empty dynamic cache."""
    for layer, (k, v) in enumerate(kv):
        cache.update(k.clone(), v.clone(), layer)
