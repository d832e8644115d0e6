"""An EAGLE-3 head (Li et al. 2025, "EAGLE-3", arXiv 2503.01840) in the speculators format, as vLLM runs it.

What differs from the EAGLE-1 head (eagle.py):
- It reads several target layers, not the top one: g_t = fc(concat(a_t^1, a_t^2, a_t^3)) fuses the
  hidden states after decoder layers l_1, l_2, l_3 at position t (config eagle_aux_hidden_state_layer_ids;
  vLLM numbers them as it collects them: id i is the hidden state after i decoder layers, pre-norm).
- Its one decoder layer attends over concat(input_layernorm(embed(x)), hidden_norm(g)), 2H wide, and
  adds the attention output to g (the residual), then its MLP; its own final norm and lm_head over a
  reduced draft vocabulary give q. The layer's pre-norm output is the hidden a later draft step reads
  in place of g: the head chains its own outputs, it does not predict the target's features.
- The draft vocabulary maps to target ids by d2t; a target token outside it has q = 0.

Positions, as vLLM's proposer lays them out. The head's entry at position t reads (x_{t+1}, g_t) and
its output predicts x_{t+2}. With committed x_0..x_{n-1} and the target's cache at n - 1 positions
(g_0..g_{n-2} known), the head holds entries 0..n-2 between cycles: committed length - 1, the project's
convention. The output of entry n-2, kept from the catch-up, gives draft token 1 without a head pass;
draft step i > 1 feeds (d_{i-1}, the previous step's output hidden) at position n + i - 3. After the
verify pass the target has g_{n-1}..g_{n+K-1}; entries from position n-1 on rest on the head's own
hiddens and are cropped, and the committed tokens x_n..x_{n+a} are fed again with the true g_{n-1}..
g_{n+a-1} (the catch-up, a + 1 entries every cycle). No second target pass: the features come from
the prefill and the verify passes.
"""
import inspect
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache, LlamaConfig, LlamaModel
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm

from engine.config import SettingsError, SpecSettings
from engine.drafters import speculators_format as fmt
from engine.drafters.base import CatchUp, Proposal
from engine.kv.layouts import CacheLayout, new_cache
from engine.kv.ops import cache_len, crop
from engine.models.device import timed
from engine.models.loading import LoadedModel, ModelLoadError
from engine.models.sampling import draw, warp_probs
from engine.trace.schema import EAGLE3, EAGLE3_AUX, EAGLE3_TOP


def layer_config(spec: fmt.Eagle3Spec) -> LlamaConfig:
    """The head's one-layer Llama config, from transformer_layer_config (no embedding of its own in the body)."""
    c = dict(spec.layer_config)
    kwargs = {k: c[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                                "rms_norm_eps", "max_position_embeddings")}
    if c.get("head_dim"):
        kwargs["head_dim"] = c["head_dim"]
    rope = c.get("rope_parameters") or {"rope_type": "default", "rope_theta": c.get("rope_theta", 10000.0)}
    return LlamaConfig(vocab_size=1, pad_token_id=None, bos_token_id=None, eos_token_id=None, num_hidden_layers=1,
                       attention_bias=bool(c.get("attention_bias", False)), mlp_bias=bool(c.get("mlp_bias", False)),
                       rope_parameters=rope, **kwargs)


class Eagle3Layer(LlamaDecoderLayer):
    """A Llama decoder layer whose attention reads [normed embedding, normed fused hidden] (2H wide)."""

    def __init__(self, config: LlamaConfig, norm_before_residual: bool) -> None:
        super().__init__(config, 0)
        h, hd, bias = config.hidden_size, config.head_dim, config.attention_bias
        self.self_attn.q_proj = nn.Linear(2 * h, config.num_attention_heads * hd, bias=bias)
        self.self_attn.k_proj = nn.Linear(2 * h, config.num_key_value_heads * hd, bias=bias)
        self.self_attn.v_proj = nn.Linear(2 * h, config.num_key_value_heads * hd, bias=bias)
        self.hidden_norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.norm_before_residual = norm_before_residual

    def forward(self, hidden_states: torch.Tensor, attention_mask=None, position_ids=None, cache=None,
                use_cache=False, position_embeddings=None, **kwargs) -> torch.Tensor:
        """(B, T, 2H) [embedding | fused hidden] -> (B, T, H) the layer's output (pre-norm)."""
        embeds, fused = hidden_states.chunk(2, dim=-1)  # (B, T, H) each
        normed = self.hidden_norm(fused)
        residual = normed if self.norm_before_residual else fused  # vLLM's _norm_before/_after_residual
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)  # (B, T, 2H)
        attn, _ = self.self_attn(hidden_states=x, attention_mask=attention_mask, position_ids=position_ids,
                                 cache=cache, use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
        h = residual + attn
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(nn.Module):
    """fc, one Eagle3Layer over its own KV cache, norm and lm_head over the draft vocabulary."""

    def __init__(self, config: LlamaConfig, n_aux: int, target_hidden: int, draft_vocab: int,
                 norm_before_residual: bool) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.fc = nn.Linear(n_aux * target_hidden, h, bias=False)  # (3H_t) -> H
        self.body = LlamaModel(config)  # its embedding (1 row) is unused: the caller passes embeddings
        self.body.layers[0] = Eagle3Layer(config, norm_before_residual)
        self.body.norm = nn.Identity()  # the pre-norm output is what later steps read
        self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(h, draft_vocab, bias=False)  # H -> V_d
        self.cache_arg = "cache" if "cache" in inspect.signature(self.body.forward).parameters else "past_key_values"

    def forward(self, token_embeds: torch.Tensor, fused: torch.Tensor, cache: DynamicCache | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, H) embeddings of x_{t+1} and (B, T, H) fused hiddens g_t -> (B, T, H) output hiddens (pre-norm)."""
        x = torch.cat([token_embeds, fused], dim=-1)  # (B, T, 2H): the body only reads its shape and dtype
        out = self.body(inputs_embeds=x, position_ids=position_ids,
                        **{self.cache_arg: cache, "use_cache": cache is not None})
        return out.last_hidden_state

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(T, H) output hiddens -> (T, V_d) logits over the draft vocabulary."""
        return self.lm_head(self.norm(hidden))

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.config)


# ---------------------------------------------------------------- speculators weight names <-> the module's

def to_speculators(head: Eagle3Head) -> dict[str, torch.Tensor]:
    """The head's weights under the speculators names (d2t, t2d and embed_tokens are the caller's)."""
    out = {}
    for name, tensor in head.state_dict().items():
        if name.startswith("body.layers.0."):
            out[fmt.LAYER + name.removeprefix("body.layers.0.")] = tensor
        elif not name.startswith("body."):  # fc, norm, lm_head (the body's 1-row embedding is not the head's)
            out[name] = tensor
    return out


def from_speculators(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The module's state-dict entries for the speculators weights it holds (float32)."""
    out = {}
    for name, tensor in weights.items():
        if name.startswith(fmt.LAYER):
            out["body.layers.0." + name.removeprefix(fmt.LAYER)] = tensor.float()
        elif name in ("fc.weight", "norm.weight", "lm_head.weight"):
            out[name] = tensor.float()
    return out


# ---------------------------------------------------------------- the drafter

@dataclass
class Eagle3State:
    cache: DynamicCache  # the head's K/V: committed length - 1 entries between cycles
    features: torch.Tensor  # (P, n_aux * H_t) the target's aux hidden states at positions 0..P-1
    last_hidden: torch.Tensor | None = None  # (1, H) output of the head's last true entry: it gives draft token 1
    true_len: int = 0  # head entries before this position were built from the target's features
    last_fed: list[int] = field(default_factory=list)  # positions fed in the last catch-up


@dataclass
class Eagle3Drafter:
    """K draft tokens from the head; q is its warped distribution over the draft vocabulary mapped to
    target ids (0 elsewhere), with the target's warping."""

    target: LoadedModel
    head: Eagle3Head
    draft_to_target: torch.Tensor  # (V_d,) target id of each draft index
    aux_layer_ids: tuple[int, ...]
    embed: nn.Module  # the checkpoint's embed_tokens, or the target's input embedding
    name: str = "eagle3-head"
    features_from: str = EAGLE3_AUX  # EAGLE3_TOP: mis-set on purpose, the target's last layer's output without fc
    trained_positions: int | None = None  # the longest sequence it was trained on, where its folder says
    kind: str = EAGLE3
    reads_target_features: bool = True  # the cycle hands it the verify pass's features
    calibration_steps: int = 2  # step 1 reads out the catch-up's output; step 2 is a head pass (engine/stats/calibrate.py)

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """Which target hidden states the prefill and verify passes must hand over (engine/cycle/reference.py)."""
        if self.features_from == EAGLE3_TOP:
            return (self.target.model.config.num_hidden_layers,)
        return self.aux_layer_ids

    @property
    def mis_set(self) -> bool:
        return self.features_from != EAGLE3_AUX

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """(m, n_aux * H_t) aux hidden states -> (m, H) g; a head mis-set to read the top layer takes it as g
        unchanged, as vLLM's EAGLE-3 model does when it is handed one H-wide state."""
        return features if self.mis_set else self.head.fc(features)

    @classmethod
    def build(cls, target: LoadedModel, head: Eagle3Head, draft_to_target: torch.Tensor, aux_layer_ids,
              embed: nn.Module | None = None, name: str = "eagle3-head", features_from: str = EAGLE3_AUX,
              trained_positions: int | None = None) -> "Eagle3Drafter":
        head.to(target.device, target.dtype).eval()
        embed = target.model.get_input_embeddings() if embed is None else embed.to(target.device, target.dtype)
        # vLLM hands the aux hidden states over in the order the layers run, whatever order the config lists
        return cls(target, head, draft_to_target.long().to(target.device), tuple(sorted(aux_layer_ids)), embed, name,
                   features_from=features_from, trained_positions=trained_positions)

    def describe(self) -> dict:
        return {"name": self.name, "architecture": "Eagle3Head (fc over target layers "
                f"{list(self.aux_layer_ids)} + one 2H-input LlamaDecoderLayer + norm + lm_head; speculators format)",
                "parameters": sum(p.numel() for p in self.head.parameters()),
                "vocab_size": self.target.full_vocab_size, "kept_vocab": int(self.draft_to_target.numel()),
                **({} if self.trained_positions is None else {"trained_positions": self.trained_positions})}

    def settings(self) -> dict:
        if self.mis_set:
            return {"kind": self.kind, "head": self.name, "aux_layer_ids": list(self.aux_layer_ids),
                    "feature": "the target's last layer's output, read as the fused state (no fc): mis-set",
                    "eagle3_features": self.features_from}
        return {"kind": self.kind, "head": self.name, "aux_layer_ids": list(self.aux_layer_ids),
                "feature": "target hidden states after the aux layers, fused by fc"}

    def check_settings(self, s: SpecSettings) -> None:
        pass

    def start(self, prompt_ids: list[int], layout: CacheLayout | None = None,
              features: torch.Tensor | None = None) -> Eagle3State:
        """Fill the head over the prompt from the prefill's aux features at positions 0..n-2 (without them,
        as in a calibration with no run around it, the target is run over the prompt here)."""
        if len(prompt_ids) < 2:
            raise SettingsError("the EAGLE-3 head drafts from the target's hidden state at the token before the "
                                "last one: it needs a prompt of at least two tokens")
        if features is None:
            features = self.target.fill_with_features(prompt_ids[:-1], self.target.new_cache(), self.feature_layers)
        cache = self.head.new_cache() if layout is None else new_cache(layout, self.head.config)
        state = Eagle3State(cache, features)
        self.roll_back(state, list(prompt_ids))
        return state

    @torch.inference_mode()
    def feed(self, state: Eagle3State, first_position: int, token_ids: list[int], fused: torch.Tensor) -> torch.Tensor:
        """Append head entries at positions first_position.. for tokens x_{t+1} and fused (T, H) g_t; return
        their output hiddens (T, H)."""
        ids = torch.tensor(token_ids, device=self.target.device)
        positions = torch.arange(first_position, first_position + len(token_ids), device=self.target.device)
        return self.head(self.embed(ids)[None], fused[None], state.cache, positions[None])[0]

    def full_vocab_probs(self, hidden: torch.Tensor, s: SpecSettings) -> torch.Tensor:
        """(1, H) output hidden -> (V_target,) warped q, 0 outside the draft vocabulary."""
        draft = self.head.draft_logits(hidden)[-1].float()  # (V_d,)
        full = draft.new_full((self.target.full_vocab_size,), float("-inf"))
        full[self.draft_to_target] = draft
        return warp_probs(full, s)

    def propose(self, state: Eagle3State, committed: list[int], k: int, s: SpecSettings,
                gen: torch.Generator) -> Proposal:
        n = len(committed)
        state.true_len = n - 1  # entries 0..n-2 rest on the target's features; later ones on the head's own
        tokens, dists, step_times = [], [], []
        hidden, position = state.last_hidden, n - 1
        for i in range(k):
            feed = None if i == 0 else (position + i - 1, tokens[-1])  # step 1 reuses the catch-up's output
            (token, probs, hidden), elapsed = timed(partial(self.step, state, feed, hidden, s, gen), self.target.device)
            step_times.append(elapsed)
            tokens.append(token)
            dists.append(probs)
        sources = ["target"] + ["head"] * (k - 1)  # which hidden each draft step's q came from (engine/trace checks it)
        return Proposal(tokens, torch.stack(dists).cpu(), step_times,
                        {"kind": self.kind, "feature_sources": sources, "first_feature_position": n - 2})

    @torch.inference_mode()
    def step(self, state: Eagle3State, feed: tuple[int, int] | None, hidden: torch.Tensor, s: SpecSettings,
             gen: torch.Generator) -> tuple[int, torch.Tensor, torch.Tensor]:
        """One draft step: feed (position, token) with the previous output hidden first, unless step 1."""
        if feed is not None:
            hidden = self.feed(state, feed[0], [feed[1]], hidden)  # (1, H)
        probs = self.full_vocab_probs(hidden, s)
        return draw(probs, s, gen), probs, hidden

    def take_target_features(self, state: Eagle3State, verify_features: torch.Tensor) -> None:
        """The verify pass's aux features (n+1, n_aux * H_t) at positions len(state.features).. onward."""
        state.features = torch.cat([state.features, verify_features.to(state.features.dtype)])

    def cache_len(self, state: Eagle3State) -> int:
        return cache_len(state.cache)

    def roll_back(self, state: Eagle3State, committed: list[int]) -> CatchUp:
        """Drop entries built on the head's own hiddens or rejected tokens, then feed entries
        (x_{t+1}, fc(a_t)) for the positions t the head lacks, up to committed length - 2."""
        keep = len(committed) - 1
        state.features = state.features[:keep]
        crop(state.cache, min(keep, state.true_len))
        first = cache_len(state.cache)
        state.true_len = first
        state.last_fed = list(range(first, keep))
        if first >= keep:
            return CatchUp()

        def catch_up() -> torch.Tensor:
            with torch.inference_mode():
                fused = self.fuse(state.features[first:keep])  # (m, H) g_first..g_{keep-1}
                return self.feed(state, first, committed[first + 1:keep + 1], fused)

        out, elapsed = timed(catch_up, self.target.device)
        state.last_hidden = out[-1:]
        state.true_len = keep
        return CatchUp(True, elapsed)


# ---------------------------------------------------------------- loading and saving

def check_against_target(folder: Path, spec: fmt.Eagle3Spec, target: LoadedModel) -> None:
    """The head's verifier must be this target: hidden size, vocabulary, and aux layers that exist."""
    tc = target.model.config
    where = f"EAGLE-3 head {folder}"
    if spec.target_hidden_size != tc.hidden_size:
        raise ModelLoadError(f"{where}: its verifier has hidden size {spec.target_hidden_size}, this target "
                             f"{tc.hidden_size}")
    if spec.target_vocab_size != target.full_vocab_size:
        raise ModelLoadError(f"{where}: its verifier has a vocabulary of {spec.target_vocab_size}, this target "
                             f"{target.full_vocab_size}")
    layers = tc.num_hidden_layers
    if len(set(spec.aux_layer_ids)) != len(spec.aux_layer_ids):
        raise ModelLoadError(f"{where}: aux layer ids {spec.aux_layer_ids} repeat a layer; vLLM collects each layer's "
                             "hidden state once, so fc would get fewer inputs than it reads")
    bad = [i for i in spec.aux_layer_ids if not 1 <= i <= layers]
    if bad:
        raise ModelLoadError(f"{where}: aux layer ids {bad} are out of range: this target has {layers} decoder layers "
                             f"(id i is the hidden state after i layers, 1..{layers})")


def load_eagle3(folder: str | Path, target: LoadedModel, features_from: str = EAGLE3_AUX) -> Eagle3Drafter:
    """An Eagle3Drafter for `target` from any speculators eagle3 folder (config.json + model.safetensors);
    `features_from` EAGLE3_TOP mis-sets it on purpose (engine/trace/schema.py)."""
    folder = Path(folder)
    spec = fmt.read_spec(folder)
    check_against_target(folder, spec, target)
    if features_from == EAGLE3_TOP and spec.hidden_size != spec.target_hidden_size:
        raise ModelLoadError(f"EAGLE-3 head {folder}: --eagle3-features {EAGLE3_TOP!r} reads the target's "
                             f"{spec.target_hidden_size}-wide top state as the head's {spec.hidden_size}-wide fused "
                             "state; they differ, so no engine could run this head that way")
    weights = fmt.read_weights(folder, spec)
    draft_to_target = fmt.check_vocab_maps(folder, weights["d2t"], weights["t2d"], target.full_vocab_size)
    head = Eagle3Head(layer_config(spec), len(spec.aux_layer_ids), spec.target_hidden_size, spec.draft_vocab_size,
                      spec.norm_before_residual)
    own = head.state_dict()
    state = from_speculators(weights)
    for name, tensor in state.items():
        if tuple(own[name].shape) != tuple(tensor.shape):
            raise ModelLoadError(f"EAGLE-3 head {folder}: {name} has shape {tuple(tensor.shape)}, the layer config "
                                 f"implies {tuple(own[name].shape)}")
    head.load_state_dict(state, strict=False)  # the body's unused 1-row embedding keeps its initial value
    embed = None
    if "embed_tokens.weight" in weights:
        embed = nn.Embedding.from_pretrained(weights["embed_tokens.weight"].float(), freeze=True)
    return Eagle3Drafter.build(target, head, draft_to_target, spec.aux_layer_ids, embed, folder.name, features_from,
                               fmt.read_trained_positions(folder))


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """vLLM's default choice of aux layers: early, middle and late (2, L // 2, L - 3); distinct from 8 layers on."""
    return [2, num_layers // 2, num_layers - 3]


def spec_for(target: LoadedModel, draft_to_target: list[int], aux_layer_ids: list[int], k: int = 3,
             intermediate_size: int | None = None, norm_before_residual: bool = False,
             verifier_name: str | None = None) -> fmt.Eagle3Spec:
    """The spec of a new head for `target`: a layer as wide as the target, its attention shape and RoPE."""
    tc = target.model.config
    layer = {"hidden_size": tc.hidden_size, "intermediate_size": intermediate_size or tc.intermediate_size,
             "num_attention_heads": tc.num_attention_heads, "num_key_value_heads": tc.num_key_value_heads,
             "head_dim": getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads,
             "rms_norm_eps": tc.rms_norm_eps, "vocab_size": target.full_vocab_size,
             "max_position_embeddings": tc.max_position_embeddings, "hidden_act": "silu",
             "rope_parameters": getattr(tc, "rope_parameters", None)
             or {"rope_type": "default", "rope_theta": getattr(tc, "rope_theta", 10000.0)},
             "tie_word_embeddings": False}
    layer["rope_theta"] = layer["rope_parameters"].get("rope_theta", 10000.0)  # older readers look here
    return fmt.Eagle3Spec(layer, len(draft_to_target), tc.hidden_size, target.full_vocab_size, list(aux_layer_ids),
                          norm_before_residual, k, verifier_name or target.name,
                          list(getattr(tc, "architectures", None) or ["LlamaForCausalLM"]))


def new_head(spec: fmt.Eagle3Spec) -> Eagle3Head:
    return Eagle3Head(layer_config(spec), len(spec.aux_layer_ids), spec.target_hidden_size, spec.draft_vocab_size,
                      spec.norm_before_residual)


def save_eagle3(folder: str | Path, head: Eagle3Head, spec: fmt.Eagle3Spec, draft_to_target: list[int],
                dtype: torch.dtype = torch.float16, embed_tokens: torch.Tensor | None = None,
                extra: dict | None = None) -> None:
    """Write a head in the speculators format (d2t and t2d from the draft vocabulary's target ids)."""
    d2t, t2d = fmt.vocab_maps(draft_to_target, spec.target_vocab_size)
    weights = {**to_speculators(head), "d2t": d2t, "t2d": t2d}
    if embed_tokens is not None:
        weights["embed_tokens.weight"] = embed_tokens
    fmt.write_folder(folder, weights, spec, dtype, extra)
