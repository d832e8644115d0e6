"""A tiny EAGLE head for plumbing tests: untrained, so it costs no training time.

Over the tiny 16-word vocabulary a random head still gets tokens accepted at a high
temperature: at T=2, K=3 the trace below has cycles with none, some and all K accepted,
so the head's catch-up runs (tests/test_eagle.py trains one for the exactness checks).
"""
from pathlib import Path

import torch

from engine.config import SpecSettings
from engine.cycle.pair import Pair
from engine.drafters.eagle import EagleDrafter, EagleHead, EagleState, head_config, save_head
from engine.kv.layouts import attended_kv
from engine.run import run_to_trace
from engine.trace import Trace
from tests.tiny import tiny_llama, tiny_pair, tiny_tokenizer

EAGLE_SETTINGS = SpecSettings(k=3, temperature=2.0, max_new_tokens=30, seed=1)
EAGLE_PROMPT = "the cat sat on a mat"


def random_head(target_config, seed: int = 0) -> EagleHead:
    torch.manual_seed(seed)
    return EagleHead(head_config(target_config)).eval()


def assert_head_is_a_fresh_start(drafter: EagleDrafter, state: EagleState, committed: list[int]) -> None:
    """The head holds committed - 1 entries built from the target's true features only: exactly what
    starting afresh on the committed sequence builds (its features and every attended K/V, any layout)."""
    assert drafter.cache_len(state) == len(committed) - 1 == state.features.shape[0]
    fresh = drafter.start(committed)  # runs the target afresh over the committed tokens
    # float32 kernels over other batch shapes and masks sum in another order: equal to ~1e-6
    assert torch.allclose(state.features, fresh.features, atol=1e-5)
    for ours, theirs in zip(attended_kv(state.cache), attended_kv(fresh.cache), strict=True):
        for a, b in zip(ours, theirs):
            assert a.shape == b.shape
            assert torch.allclose(a, b, atol=1e-5)


def random_eagle_pair(seed: int = 0) -> Pair:
    """tests/tiny.py's target (seed 0) with a random one-layer head and no draft model."""
    target = tiny_pair(seed).target
    return Pair(target, None, set(), EagleDrafter.build(target, random_head(target.model.config, seed)))


def eagle_trace(path: Path, s: SpecSettings = EAGLE_SETTINGS, prompt: str = EAGLE_PROMPT) -> Trace:
    """An eagle trace written by the engine (run_to_trace), with partial and full accepts."""
    return run_to_trace(random_eagle_pair(), prompt, s, path, chat_template=False)


def save_eagle_folders(folder: Path) -> dict[str, Path]:
    """target/, draft/ (a separate tiny draft model) and head/ (for that target), as saved folders."""
    folder = Path(folder)
    tok = tiny_tokenizer()
    paths = {"target": folder / "target", "draft": folder / "draft", "head": folder / "head"}
    target = tiny_llama(0, 2, 32)
    for name, model in (("target", target), ("draft", tiny_llama(1000, 1, 16))):
        model.save_pretrained(paths[name])
        tok.save_pretrained(paths[name])
    save_head(paths["head"], random_head(target.config), target.config, None, "tiny-eagle")
    return paths
