"""An EAGLE-style draft head (Li et al. 2024): it drafts from the target's own features.

Positions. f_t is the target's top feature at position t (the output of its last decoder
layer, before the final norm), from which the target predicts token t+1. The head's entry
at position p reads the token x_p together with f_{p-1} (zeros at p = 0), fused by one
linear layer, runs its own decoder layer(s) over its own KV cache, and predicts f_p. The
target's frozen final norm and output layer (pruned to the kept vocabulary) turn a
predicted f_p into q(x_{p+1}).

One cycle, committed x_0..x_{n-1}, the target cache at n - 1 positions (f_0..f_{n-2} known):
  step 1 feeds (f_{n-2}, x_{n-1}) at position n - 1: the true feature, from the last verify;
  step i > 1 feeds (the head's own predicted feature, d_{i-1}).
After the verify pass the target has f_{n-1}..f_{n+K-1}. Entries built from predicted
features are cropped; the accepted tokens are fed again with the target's true features
(the catch-up), so between cycles the head cache holds committed length - 1 positions,
the project's convention, and the next cycle's first step again reads a true feature.
No second target pass: the features come from the prefill and the verify passes.
"""
import inspect
import json
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache, LlamaConfig, LlamaModel

from engine.config import SpecSettings
from engine.drafters.base import CatchUp, Proposal
from engine.kv.layouts import CacheLayout, new_cache
from engine.kv.ops import cache_len, crop
from engine.models.device import timed
from engine.models.loading import DRAFT_VOCAB_FILE, DRAFT_VOCAB_FORMAT, LoadedModel, ModelLoadError
from engine.models.sampling import draw, warp_probs
from engine.trace.schema import EAGLE

HEAD_FORMAT = "speclab-eagle-head"
HEAD_FILE = "head.safetensors"
HEAD_CONFIG_FILE = "head_config.json"


def head_config(target_config, layers: int = 1, intermediate_size: int | None = None) -> LlamaConfig:
    """A decoder stack as wide as the target (its features go in and come out unprojected)."""
    return LlamaConfig(
        vocab_size=1, pad_token_id=None, bos_token_id=None, eos_token_id=None,  # no embedding of its own
        hidden_size=target_config.hidden_size,
        intermediate_size=intermediate_size or target_config.intermediate_size,
        num_hidden_layers=layers, num_attention_heads=target_config.num_attention_heads,
        num_key_value_heads=target_config.num_key_value_heads,
        head_dim=getattr(target_config, "head_dim", None) or target_config.hidden_size // target_config.num_attention_heads,
        max_position_embeddings=target_config.max_position_embeddings,
        rms_norm_eps=target_config.rms_norm_eps,
        rope_parameters=getattr(target_config, "rope_parameters", None),
    )


class EagleHead(nn.Module):
    """fuse(token embedding, normed previous feature) -> decoder layer(s) -> predicted feature."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.fuse = nn.Linear(2 * h, h, bias=True)
        self.body = LlamaModel(config)
        self.body.norm = nn.Identity()  # the output is a feature; the target's own norm comes later
        self.cache_arg = "cache" if "cache" in inspect.signature(self.body.forward).parameters else "past_key_values"

    def forward(self, token_embeds: torch.Tensor, prev_features_normed: torch.Tensor,
                cache: DynamicCache | None = None, position_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, H) embeddings of x_p and (B, T, H) normed f_{p-1} -> (B, T, H) predicted f_p.

        Without `attention_mask` the body is causal over its cache; a draft tree (engine/tree/eagle.py)
        passes a 4D additive mask (1, 1, T, kv_len) with `position_ids`, as the tree forward of a model does."""
        x = self.fuse(torch.cat([token_embeds, prev_features_normed], dim=-1))  # (B, T, H)
        kwargs = {self.cache_arg: cache, "use_cache": cache is not None}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
        out = self.body(inputs_embeds=x, position_ids=position_ids, **kwargs)
        return out.last_hidden_state

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.config)


@dataclass
class TargetParts:
    """The frozen pieces of the target the head uses: its input embedding, final norm and
    output layer rows of the kept vocabulary."""

    embed: nn.Module
    norm: nn.Module
    out_weight: torch.Tensor  # (V_kept, H)
    kept_token_ids: torch.Tensor  # (V_kept,) full ids
    full_vocab_size: int

    @classmethod
    def of(cls, target: LoadedModel, kept_token_ids: torch.Tensor | None) -> "TargetParts":
        m = target.model
        weight = m.get_output_embeddings().weight  # (V_full, H)
        full = target.full_vocab_size
        kept = torch.arange(full) if kept_token_ids is None else kept_token_ids.long()
        return cls(m.get_input_embeddings(), m.model.norm, weight.detach()[kept.to(weight.device)],
                   kept.to(weight.device), full)

    def normed(self, features: torch.Tensor, first_is_start: bool = False) -> torch.Tensor:
        """The final norm of (T, H) features; row 0 zeroed when it stands for 'no feature' (p = 0)."""
        x = self.norm(features)
        if first_is_start:
            x = x.clone()
            x[0] = 0
        return x

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """(T, H) predicted features -> (T, V_full) logits, -inf outside the kept vocabulary."""
        kept_logits = self.norm(features) @ self.out_weight.T  # (T, V_kept)
        full = kept_logits.new_full((features.shape[0], self.full_vocab_size), float("-inf"))
        full[:, self.kept_token_ids] = kept_logits
        return full


@dataclass
class EagleState:
    cache: DynamicCache  # the head's K/V: committed length - 1 positions between cycles
    features: torch.Tensor  # (P, H) the target's f_0..f_{P-1}, P = the target's cache length
    true_len: int = 0  # head entries before this position were built from true features
    last_fed: list[int] = field(default_factory=list)  # positions fed in the last catch-up


@dataclass
class EagleDrafter:
    """K draft steps of the head; q is its warped distribution (same warping as the target)."""

    target: LoadedModel
    head: EagleHead
    parts: TargetParts
    name: str = "eagle-head"
    kind: str = EAGLE
    reads_target_features: bool = True  # the cycle hands it the verify pass's features

    @classmethod
    def build(cls, target: LoadedModel, head: EagleHead, kept_token_ids: torch.Tensor | None = None,
              name: str = "eagle-head") -> "EagleDrafter":
        head.to(target.device, target.dtype).eval()
        return cls(target, head, TargetParts.of(target, kept_token_ids), name)

    def describe(self) -> dict:
        return {"name": self.name, "architecture": "EagleHead (fuse + LlamaDecoderLayer x "
                f"{self.head.config.num_hidden_layers}; the target's norm and output layer)",
                "parameters": sum(p.numel() for p in self.head.parameters()),
                "vocab_size": self.parts.full_vocab_size, "kept_vocab": int(self.parts.kept_token_ids.numel())}

    def settings(self) -> dict:
        return {"kind": self.kind, "head": self.name, "feature": "target's last decoder layer output (pre-norm)",
                "head_layers": self.head.config.num_hidden_layers}

    def check_settings(self, s: SpecSettings) -> None:
        pass

    def start(self, prompt_ids: list[int], layout: CacheLayout | None = None,
              features: torch.Tensor | None = None) -> EagleState:
        """Fill the head over the prompt from the prefill's features f_0..f_{n-2}; its cache in
        the run's layout (kv_layouts.CacheLayout; dynamic without one).

        Without `features` (a calibration that has no run around it) the target is run
        over the prompt here, once; a run always passes the prefill's features.
        """
        if features is None:
            features = self.target.fill_with_features(prompt_ids[:-1], self.target.new_cache()) \
                if len(prompt_ids) > 1 else self.features_of_nothing()
        cache = self.head.new_cache() if layout is None else new_cache(layout, self.head.config)
        state = EagleState(cache, features)
        self.roll_back(state, list(prompt_ids))
        return state

    def features_of_nothing(self) -> torch.Tensor:
        return torch.zeros(0, self.head.config.hidden_size, device=self.target.device, dtype=self.target.dtype)

    @torch.inference_mode()
    def feed(self, state: EagleState, first_position: int, token_ids: list[int],
             prev_features: torch.Tensor) -> torch.Tensor:
        """Append head entries for positions first_position.. ; return predicted features (T, H)."""
        ids = torch.tensor(token_ids, device=self.target.device)
        normed = self.parts.normed(prev_features, first_is_start=first_position == 0)  # (T, H)
        positions = torch.arange(first_position, first_position + len(token_ids), device=self.target.device)
        out = self.head(self.parts.embed(ids)[None], normed[None], state.cache, positions[None])
        return out[0]

    def prev_true_features(self, state: EagleState, first: int, n: int) -> torch.Tensor:
        """(n, H) f_{p-1} for positions first..first+n-1, from the target."""
        lo = first - 1
        rows = state.features[max(lo, 0): lo + n]
        if lo < 0:  # position 0 has no previous feature: a zero row (zeroed again after the norm)
            rows = torch.cat([rows.new_zeros(1, rows.shape[-1]), rows])
        return rows

    def propose(self, state: EagleState, committed: list[int], k: int, s: SpecSettings,
                gen: torch.Generator) -> Proposal:
        n = len(committed)
        tokens, dists, step_times = [], [], []
        position, feed_token = n - 1, committed[-1]
        prev = self.prev_true_features(state, position, 1)  # (1, H) f_{n-2}: the target's own
        state.true_len = n  # entries 0..n-1 rest on true features; later ones on predictions
        for _ in range(k):
            (token, probs, predicted), elapsed = timed(
                partial(self.step, state, position, feed_token, prev, s, gen), self.target.device)
            step_times.append(elapsed)
            tokens.append(token)
            dists.append(probs)
            position, feed_token, prev = position + 1, token, predicted
        sources = ["target"] + ["head"] * (k - 1)  # which feature each draft step read (engine/trace/checks.py checks it)
        return Proposal(tokens, torch.stack(dists).cpu(), step_times,
                        {"kind": self.kind, "feature_sources": sources, "first_feature_position": n - 2})

    @torch.inference_mode()
    def step(self, state: EagleState, position: int, token: int, prev: torch.Tensor,
             s: SpecSettings, gen: torch.Generator) -> tuple[int, torch.Tensor, torch.Tensor]:
        predicted = self.feed(state, position, [token], prev)  # (1, H)
        probs = warp_probs(self.parts.logits(predicted)[-1], s)  # (V,)
        return draw(probs, s, gen), probs, predicted

    def take_target_features(self, state: EagleState, verify_features: torch.Tensor) -> None:
        """The verify pass's features (n+1, H) at positions len(state.features).. onward."""
        state.features = torch.cat([state.features, verify_features.to(state.features.dtype)])

    def cache_len(self, state: EagleState) -> int:
        return cache_len(state.cache)

    def roll_back(self, state: EagleState, committed: list[int]) -> CatchUp:
        """Drop entries built on predicted features or rejected tokens, then feed the committed
        tokens the head lacks with the target's true features."""
        keep = len(committed) - 1
        state.features = state.features[:keep]
        crop(state.cache, min(keep, state.true_len))
        first = cache_len(state.cache)
        state.true_len = first
        state.last_fed = list(range(first, keep))
        if first >= keep:
            return CatchUp()
        prev = self.prev_true_features(state, first, keep - first)
        _, elapsed = timed(lambda: self.feed(state, first, committed[first:keep], prev), self.target.device)
        state.true_len = keep
        return CatchUp(True, elapsed)


def load_head(folder: str | Path, target: LoadedModel) -> EagleDrafter:
    """An EagleDrafter for `target` from a folder written by save_head."""
    from safetensors.torch import load_file

    folder = Path(folder)
    spec_file = folder / HEAD_CONFIG_FILE
    if not spec_file.is_file():
        raise ModelLoadError(f"EAGLE head folder {folder}: {HEAD_CONFIG_FILE} not found")
    spec = json.loads(spec_file.read_text())
    if spec.get("format") != HEAD_FORMAT or spec.get("version") != 1:
        raise ModelLoadError(f"{spec_file}: not a version-1 {HEAD_FORMAT} file")
    tc = target.model.config
    for key in ("hidden_size", "vocab_size"):
        if spec["target"][key] != getattr(tc, key):
            raise ModelLoadError(f"{folder}: the head was trained for a target with {key} {spec['target'][key]}, "
                                 f"this target has {getattr(tc, key)}")
    head = EagleHead(head_config(tc, spec["layers"], spec["intermediate_size"]))
    state = {k: v.float() for k, v in load_file(str(folder / HEAD_FILE)).items()}
    head.load_state_dict(state)
    kept = None
    if (folder / DRAFT_VOCAB_FILE).is_file():
        kept = torch.tensor(json.loads((folder / DRAFT_VOCAB_FILE).read_text())["kept_token_ids"], dtype=torch.long)
    return EagleDrafter.build(target, head, kept, spec.get("name", folder.name))


def save_head(folder: str | Path, head: EagleHead, target_config, kept_token_ids: list[int] | None,
              name: str, extra: dict | None = None) -> None:
    """Write the head in half precision (the target's parts are never saved with it)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().half().contiguous() for k, v in head.state_dict().items()}, str(folder / HEAD_FILE))
    spec = {"format": HEAD_FORMAT, "version": 1, "name": name, "layers": head.config.num_hidden_layers,
            "intermediate_size": head.config.intermediate_size,
            "target": {"hidden_size": target_config.hidden_size, "vocab_size": target_config.vocab_size},
            **(extra or {})}
    (folder / HEAD_CONFIG_FILE).write_text(json.dumps(spec, indent=1))
    if kept_token_ids is not None:
        (folder / DRAFT_VOCAB_FILE).write_text(json.dumps({"format": DRAFT_VOCAB_FORMAT, "version": 1,
                                                     "full_vocab_size": target_config.vocab_size,
                                                     "kept_token_ids": list(kept_token_ids)}))
