"""The engine's own decoder for Llama-family causal LMs (Llama, SmolLM2, Qwen2), built from a Hugging Face model's weights.

What it holds:
- `LlamaConfig`: the few numbers the forward needs, read from a Hugging Face config; anything this
  decoder would compute differently (another rope type, sliding windows, another model type)
  raises `UnsupportedArchitecture` with one line saying what, so the caller can keep Hugging
  Face's modules instead.
- `LlamaDecoder`: embeddings, decoder blocks (fused QKV, fused gate/up), final norm and output
  layer; rotary cos/sin precomputed. Its forward takes the keyword arguments the engine hands a
  Hugging Face model (`input_ids`, `attention_mask`, `position_ids`, `cache` or
  `past_key_values`, `use_cache`, `logits_to_keep`) and returns an object with `.logits`, so it
  can stand where `LoadedModel.runner_for` returns a Hugging Face model.
- `from_hf(model)`: a `LlamaDecoder` on a Hugging Face model's weights (same device and dtype;
  embeddings and norms share its tensors, the fused projections are concatenated copies).

The numerics follow Hugging Face's Llama code step for step (RMSNorm's float32 variance, rotary
tables computed in float32 then cast, `rotate_half`, scaling by head_dim ** -0.5), so the two
agree to float32 rounding; only the kernels' blocking differs.

K/V go through the cache's own `update(key_states, value_states, layer_idx)`, which Hugging
Face's DynamicCache and the engine's StaticKVCache and PagedKVCache (engine/kv/layouts.py) all
implement; attention is torch's scaled_dot_product_attention over what `update` returns.

May import: torch, transformers' Cache type. Nothing else of the engine (engine/models/loading.py
and the cycles may import this module, not the reverse).
"""
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers.cache_utils import Cache

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")  # same block: pre-norm, RoPE, GQA, SwiGLU, RMSNorm
DEFAULT_ROPE_TYPES = (None, "default")


class UnsupportedArchitecture(ValueError):
    """This model computes something the decoder does not (the message says what): use Hugging Face's modules."""


# ---------------------------------------------------------------- configuration

@dataclass(frozen=True)
class LlamaConfig:
    """What the forward needs. `qkv_bias`: Qwen2 has biases on q/k/v (not o); Llama's `attention_bias` puts them on all four."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_positions: int  # rotary tables are precomputed this far and grown on demand
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool

    @property
    def n_rep(self) -> int:
        """Query heads per K/V head (GQA); 1 is plain multi-head attention."""
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_hf(cls, config) -> "LlamaConfig":
        """Read a transformers config; raise UnsupportedArchitecture for anything this decoder would get wrong."""
        model_type = getattr(config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedArchitecture(f"model type {model_type!r} is not one of {', '.join(SUPPORTED_MODEL_TYPES)}")
        if getattr(config, "hidden_act", "silu") != "silu":
            raise UnsupportedArchitecture(f"activation {config.hidden_act!r} (the decoder's MLP is SwiGLU with silu)")
        theta, rope_type = _rope(config)
        if rope_type not in DEFAULT_ROPE_TYPES:
            raise UnsupportedArchitecture(f"rope type {rope_type!r} (only plain RoPE is implemented)")
        types = getattr(config, "layer_types", None) or []
        if any(t != "full_attention" for t in types) or getattr(config, "use_sliding_window", False):
            raise UnsupportedArchitecture(f"sliding-window attention (layer types {sorted(set(types))})")
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        if heads % kv_heads:
            raise UnsupportedArchitecture(f"{heads} query heads do not split evenly over {kv_heads} K/V heads")
        bias = bool(getattr(config, "attention_bias", False))
        return cls(
            model_type=model_type,
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            rms_norm_eps=config.rms_norm_eps,
            rope_theta=float(theta),
            max_positions=config.max_position_embeddings,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            qkv_bias=True if model_type == "qwen2" else bias,  # Qwen2 hard-codes q/k/v biases
            o_bias=False if model_type == "qwen2" else bias,
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
        )


def _rope(config) -> tuple[float, str | None]:
    """(theta, rope type) from transformers 5.x `rope_parameters` or 4.x `rope_theta` / `rope_scaling`."""
    params = getattr(config, "rope_parameters", None) or {}
    scaling = getattr(config, "rope_scaling", None) or {}
    theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type")
    return theta, rope_type


# ---------------------------------------------------------------- the pieces

class RMSNorm(nn.Module):
    """Hugging Face's LlamaRMSNorm: variance in float32, cast back, then the weight (in that order: it changes bf16 rounding)."""

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)  # (C,)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()  # (B, T, C)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Rotary(nn.Module):
    """cos/sin tables (P, D) indexed by position: Hugging Face computes the same values per call
    (float32 position * inv_freq, cos/sin in float32, cast to the hidden dtype), so a lookup gives
    the same numbers without the per-step work."""

    def __init__(self, head_dim: int, theta: float, positions: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        # the exact expression of transformers' compute_default_rope_parameters, on the CPU in float32
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))  # (D/2,)
        self.dtype = dtype
        self.register_buffer("cos", torch.empty(0, head_dim, dtype=dtype, device=device), persistent=False)
        self.register_buffer("sin", torch.empty(0, head_dim, dtype=dtype, device=device), persistent=False)
        self.reserve(positions)

    def reserve(self, positions: int) -> None:
        """Make the tables cover positions 0..positions-1 (a host-side check: no device sync)."""
        if positions <= self.cos.shape[0]:
            return
        size = max(positions, 2 * self.cos.shape[0])
        freqs = torch.arange(size, dtype=torch.float32)[:, None] * self.inv_freq[None, :]  # (P, D/2)
        emb = torch.cat((freqs, freqs), dim=-1).to(self.cos.device)  # (P, D)
        self.cos = emb.cos().to(self.dtype)
        self.sin = emb.sin().to(self.dtype)

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids (B, T) -> cos, sin (B, 1, T, D), broadcast over heads."""
        return self.cos[position_ids][:, None], self.sin[position_ids][:, None]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, D); Hugging Face's formula term for term (a complex product would round differently)."""
    return x * cos + rotate_half(x) * sin


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, Hkv, S, D) -> (B, Hkv * n_rep, S, D); query head h reads K/V head h // n_rep, as in Hugging Face."""
    if n_rep == 1:
        return x
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, is_causal: bool,
           n_rep: int, scale: float) -> torch.Tensor:
    """q (B, H, T, D), k/v (B, Hkv, S, D) -> (B, H, T, D).

    GQA the way Hugging Face's sdpa path does it: SDPA's own `enable_gqa` when there is no mask
    (its fused kernels take GQA only unmasked); with a mask and one query, the n_rep query heads
    of a K/V head become n_rep query rows of it (no K/V copy: a static cache's K/V is its whole
    buffer); otherwise K/V are repeated."""
    if n_rep == 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale)
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=True)
    b, h, t, d = q.shape
    if t == 1 and mask.shape[1] == 1:
        folded = q.reshape(b, h // n_rep, n_rep, d)  # (B, Hkv, n_rep, D): rows of one K/V head
        out = F.scaled_dot_product_attention(folded, k, v, attn_mask=mask, scale=scale)  # mask (B|1, 1, 1, S) broadcasts
        return out.reshape(b, h, 1, d)
    return F.scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), attn_mask=mask, scale=scale)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig, layer_idx: int, wqkv: nn.Linear, wo: nn.Linear) -> None:
        super().__init__()
        self.layer_idx = layer_idx  # which layer of the cache `update` writes
        self.n_head, self.n_kv, self.head_dim, self.n_rep = (config.num_heads, config.num_kv_heads,
                                                             config.head_dim, config.n_rep)
        self.scale = config.head_dim ** -0.5
        self.wqkv, self.wo = wqkv, wo  # q, k, v stacked by rows: one matrix product instead of three

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                is_causal: bool, cache: Cache | None) -> torch.Tensor:
        b, t, _ = x.shape
        d = self.head_dim
        q, k, v = self.wqkv(x).split([self.n_head * d, self.n_kv * d, self.n_kv * d], dim=-1)
        q = q.view(b, t, self.n_head, d).transpose(1, 2)  # (B, H, T, D)
        k = k.view(b, t, self.n_kv, d).transpose(1, 2)  # (B, Hkv, T, D)
        v = v.view(b, t, self.n_kv, d).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)  # (B, Hkv, S, D): every slot the layout hands attention
        y = attend(q, k, v, mask, is_causal, self.n_rep, self.scale)  # (B, H, T, D)
        return self.wo(y.transpose(1, 2).reshape(b, t, self.n_head * d))


class FeedForward(nn.Module):
    def __init__(self, w13: nn.Linear, w2: nn.Linear) -> None:
        super().__init__()
        self.w13, self.w2 = w13, w2  # gate and up stacked by rows: one matrix product instead of two

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)  # (B, T, I) each
        return self.w2(F.silu(gate) * up)


class Block(nn.Module):
    """One pre-norm decoder layer; returns the hidden state (B, T, C), the feature an EAGLE head reads off the last one."""

    def __init__(self, attention: Attention, feed_forward: FeedForward, attention_norm: RMSNorm,
                 ffn_norm: RMSNorm) -> None:
        super().__init__()
        self.attention, self.feed_forward = attention, feed_forward
        self.attention_norm, self.ffn_norm = attention_norm, ffn_norm

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                is_causal: bool, cache: Cache | None) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin, mask, is_causal, cache)
        return h + self.feed_forward(self.ffn_norm(h))


class DecoderStack(nn.Module):
    """Embeddings, blocks, final norm. Named as in Hugging Face (`decoder.model.layers[-1]`) so the
    engine's TopFeatureTap finds the last block on this decoder as on a Hugging Face model."""

    def __init__(self, embed_tokens: nn.Embedding, layers: list[Block], norm: RMSNorm, rotary: Rotary) -> None:
        super().__init__()
        self.embed_tokens, self.layers, self.norm, self.rotary = embed_tokens, nn.ModuleList(layers), norm, rotary


@dataclass
class DecoderOutput:
    """What the engine reads off a forward: `.logits` (B, T', V), T' = T or the kept last positions."""

    logits: torch.Tensor
    cache: Cache | None = None


# ---------------------------------------------------------------- masks and positions

def _cache_extent(cache: Cache | None, t: int) -> tuple[int | torch.Tensor, int]:
    """(positions already cached, length of the K/V `update` will return) before appending t positions.

    The first is an int (dynamic, paged) or a 0-d device tensor (a static cache's write position:
    kept on the device so nothing here syncs); the second is always a host int."""
    if cache is None:
        return 0, t
    past = cache.get_seq_length()
    kv_len, kv_offset = cache.get_mask_sizes(t, 0)
    if kv_offset != 0:
        raise UnsupportedArchitecture("a cache whose attention does not start at slot 0 (sliding window)")
    return past, int(kv_len)


def causal_mask(past: int | torch.Tensor, t: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """(1, 1, T, kv_len) bool, True where query t (at slot past + t) may attend: every slot up to its own.

    The static layout hands attention its whole buffer, so the slots after the query (stale K/V of
    rejected tokens, or zeros) must be masked like this; it is what transformers builds for a cache."""
    query_slots = past + torch.arange(t, device=device)  # (T,)
    return (torch.arange(kv_len, device=device)[None, :] <= query_slots[:, None])[None, None]


def chain_mask(past: int | torch.Tensor, t: int, kv_len: int,
               device: torch.device) -> tuple[torch.Tensor | None, bool]:
    """(mask, is_causal) for a causal append: no mask where SDPA can do it alone (one query over
    exactly the attended slots; a prefill of an empty cache), else `causal_mask`."""
    if isinstance(past, int) and kv_len == past + t:
        if t == 1:
            return None, False
        if past == 0:
            return None, True
    return causal_mask(past, t, kv_len, device), False


# ---------------------------------------------------------------- the model

class LlamaDecoder(nn.Module):
    """A Llama-family causal LM on the engine's caches. Build it with `from_hf`."""

    def __init__(self, config: LlamaConfig, model: DecoderStack, lm_head: nn.Linear) -> None:
        super().__init__()
        self.config, self.model, self.lm_head = config, model, lm_head

    def get_output_embeddings(self) -> nn.Linear:
        """The output layer (engine/models/cpu_linear.py packs it with its own row policy)."""
        return self.lm_head

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cache: Cache | None = None,
                past_key_values: Cache | None = None, use_cache: bool = True,
                logits_to_keep: int | torch.Tensor = 0) -> DecoderOutput:
        """input_ids (B, T) -> logits (B, T, V), appending T positions' K/V to the cache if one is given.

        - `cache` / `past_key_values`: either name (transformers 5.x says `cache`, 4.x the other);
          `use_cache` is accepted for the same calls and changes nothing: a given cache is written.
        - `position_ids` (B, T): RoPE positions; by default the cache length onwards (a chain).
        - `attention_mask`: None for a causal append; or a 4-D mask (B|1, 1, T, kv_len) given as is
          to attention, bool (True = attend) or additive float (a draft tree's,
          engine/tree/attention.py), where kv_len is what the cache's `get_mask_sizes` says.
        - `logits_to_keep`: N > 0 computes logits for the last N positions only (a prefill needs one).
        """
        if cache is not None and past_key_values is not None and cache is not past_key_values:
            raise ValueError("pass the cache once, as `cache` or as `past_key_values`")
        cache = cache if cache is not None else past_key_values
        b, t = input_ids.shape
        past, kv_len = _cache_extent(cache, t)
        device = input_ids.device
        if position_ids is None:
            position_ids = (past + torch.arange(t, device=device))[None].expand(b, t)  # (B, T)
        if attention_mask is None:
            mask, is_causal = chain_mask(past, t, kv_len, device)
        else:
            if attention_mask.dim() != 4 or attention_mask.shape[-2:] != (t, kv_len):
                raise ValueError(f"attention_mask must be 4-D (B, 1, {t}, {kv_len}) for {t} new positions over "
                                 f"{kv_len} attended slots; got shape {tuple(attention_mask.shape)}")
            mask, is_causal = attention_mask, False
        # positions never exceed the slot count (a tree node's depth is below its slot), so this covers them
        self.model.rotary.reserve(kv_len)
        cos, sin = self.model.rotary(position_ids)  # (B, 1, T, D) each
        x = self.model.embed_tokens(input_ids)  # (B, T, C)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask, is_causal, cache)
        x = self.model.norm(x)
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        return DecoderOutput(self.lm_head(x[:, keep]), cache)  # (B, T', V)


# ---------------------------------------------------------------- from a Hugging Face model

def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    """An nn.Linear on these tensors (no init, no copy): an nn.Linear so that cpu_linear can pack it."""
    with torch.device("meta"):
        layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    layer.weight = nn.Parameter(weight.detach(), requires_grad=False)
    if bias is not None:
        layer.bias = nn.Parameter(bias.detach(), requires_grad=False)
    return layer


class _Weights:
    """The state dict, handed out key by key, so that a weight nobody took (a layer this decoder
    does not compute, e.g. a QK norm) is reported instead of silently ignored."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        self.state, self.taken = state, set()

    def __call__(self, key: str, required: bool = True) -> torch.Tensor | None:
        if key not in self.state:
            if required:
                raise UnsupportedArchitecture(f"the model has no weight {key!r}")
            return None
        self.taken.add(key)
        return self.state[key]

    def check_all_taken(self) -> None:
        left = sorted(set(self.state) - self.taken)
        if left:
            more = f" and {len(left) - 3} more" if len(left) > 3 else ""
            raise UnsupportedArchitecture(f"weights the decoder does not use: {', '.join(left[:3])}{more}")


def _check_plain_weights(model: nn.Module) -> None:
    if getattr(model, "tp_size", None) not in (None, 1):
        raise UnsupportedArchitecture("a tensor-parallel shard (its weights are DTensors)")
    if getattr(model, "hf_quantizer", None) is not None:
        raise UnsupportedArchitecture("weights quantised by a transformers quantizer")


# Builds the module that computes the named Hugging Face linear layers stacked by output rows
# (["model.layers.0.self_attn.q_proj", "...k_proj", "...v_proj"]), or None to stack their float weights.
LinearSource = Callable[[list[str]], nn.Module | None]


@torch.no_grad()
def from_hf(model: nn.Module, linear_source: LinearSource | None = None) -> LlamaDecoder:
    """The decoder on `model`'s weights (a LlamaForCausalLM or Qwen2ForCausalLM), same device and dtype.

    Embeddings, norms and a tied output layer share `model`'s tensors; the fused q/k/v and gate/up
    matrices are new (they cost one more copy of those weights). `linear_source`, when given, supplies
    the linear layers instead (the int4 path's blocks, engine/models/gguf_linear.py fused_source):
    whatever it returns for a group of layers computes them stacked, and a group it returns None for is
    built from the float weights as usual."""
    config = LlamaConfig.from_hf(model.config)
    _check_plain_weights(model)
    w = _Weights(model.state_dict())
    embed_weight = w("model.embed_tokens.weight")
    embed = nn.Embedding.from_pretrained(embed_weight, freeze=True)  # on that tensor: no init, no copy

    def stacked(names: list[str], has_bias: bool) -> nn.Module:
        """The layers `names` as one module: rows of the first, then the second's... (q, k, v; gate, up)."""
        weights = [w(n + ".weight") for n in names]
        biases = [w(n + ".bias", has_bias) for n in names]
        given = linear_source(names) if linear_source is not None else None
        if given is not None:
            return given
        return _linear(torch.cat(weights), torch.cat(biases) if has_bias else None)

    def layer(i: int) -> Block:
        p = f"model.layers.{i}."
        wqkv = stacked([p + f"self_attn.{n}_proj" for n in "qkv"], config.qkv_bias)
        wo = stacked([p + "self_attn.o_proj"], config.o_bias)
        w13 = stacked([p + f"mlp.{n}_proj" for n in ("gate", "up")], config.mlp_bias)
        w2 = stacked([p + "mlp.down_proj"], config.mlp_bias)
        return Block(Attention(config, i, wqkv, wo), FeedForward(w13, w2),
                     RMSNorm(w(p + "input_layernorm.weight"), config.rms_norm_eps),
                     RMSNorm(w(p + "post_attention_layernorm.weight"), config.rms_norm_eps))

    layers = [layer(i) for i in range(config.num_layers)]
    norm = RMSNorm(w("model.norm.weight"), config.rms_norm_eps)
    head_weight = w("lm_head.weight", required=not config.tie_word_embeddings)
    lm_head = linear_source(["lm_head"]) if linear_source is not None else None
    if lm_head is None and config.tie_word_embeddings:
        lm_head = _linear(embed_weight, None)
        lm_head.weight = embed.weight  # one Parameter, as in the tied model
    elif lm_head is None:
        lm_head = _linear(head_weight, None)
    w.check_all_taken()
    rotary = Rotary(config.head_dim, config.rope_theta, config.max_positions, embed_weight.dtype, embed_weight.device)
    return LlamaDecoder(config, DecoderStack(embed, layers, norm, rotary), lm_head).eval()
