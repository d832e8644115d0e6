"""Whether transformers can shard a model over N ranks: checked from its config, before loading.

transformers shards by a per-architecture plan (`base_model_tp_plan` in the config class):
the query, key and value projections and the MLP's gate and up projections split by output
columns, the attention output and down projections by input rows (then all-reduced), the
output layer by vocabulary rows (then gathered, so every rank sees the full logits). Each
rank therefore runs num_attention_heads / N query heads and num_key_value_heads / N K/V
heads, and its cache holds only those. transformers accepts uneven splits at load time but
the attention reshape fails at the first forward, so both head counts must divide by N.
"""
import math
from pathlib import Path

from transformers import AutoConfig

from engine.models.errors import ModelLoadError


def text_config(config):
    """The decoder's config (a multimodal config nests it)."""
    get = getattr(config, "get_text_config", None)
    return get(decoder=True) if get else config


def shardable_sizes(heads: int, kv_heads: int) -> list[int]:
    """The TP sizes above 1 that split both head counts evenly."""
    return [n for n in range(2, math.gcd(heads, kv_heads) + 1) if heads % n == 0 and kv_heads % n == 0]


def check_config_shardable(config, tp: int) -> None:
    """Raise ModelLoadError unless `config`'s architecture has a TP plan and its heads split over `tp`."""
    text = text_config(config)
    arch = (getattr(config, "architectures", None) or [type(config).__name__])[0]
    if not getattr(text, "base_model_tp_plan", None):
        raise ModelLoadError(f"{arch} has no tensor-parallel plan in this transformers version, so --tp cannot "
                             "shard it (Llama, Mistral, Qwen2/3, Gemma, Phi-3 and about 150 other architectures have one)")
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    if heads % tp or kv_heads % tp:
        sizes = shardable_sizes(heads, kv_heads)
        fits = f"--tp {' or '.join(map(str, sizes))} would" if sizes else "no --tp above 1 can"
        raise ModelLoadError(f"--tp {tp} cannot split {arch}'s {heads} attention heads and {kv_heads} key/value "
                             f"heads evenly over {tp} ranks; {fits}")


def check_shardable(spec: str, tp: int, trust_remote_code: bool = False) -> None:
    """Read the target's config (not its weights) and check it can be sharded over `tp` ranks."""
    path = Path(spec).expanduser()
    if path.is_dir() and not (path / "config.json").exists() and any(path.glob("*.gguf")):
        raise ModelLoadError(f"{spec}: a GGUF file is not sharded here; under --tp the target must be a plain "
                             "transformers folder (config.json and safetensors)")
    try:
        config = AutoConfig.from_pretrained(str(path) if path.is_dir() else spec, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"could not read the config of {spec!r}: {err}") from err
    check_config_shardable(config, tp)
