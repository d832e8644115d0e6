"""Loading a draft/target pair and running one forward step against a KV cache."""
import inspect
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache
from transformers.distributed import DistributedConfig

from engine.models import cpu_linear
from engine.models.errors import ModelLoadError, TokenizerMismatchError
from engine.trace.schema import (
    ACTIVATIONS,
    AS_LOADED,
    DECODER_HF,
    DECODER_OWN,
    DECODERS,
    GGUF_WEIGHTS,
    MAX_DECODER_FALLBACK_TEXT,
    ROWS,
    TARGET_WEIGHTS,
    WEIGHTS_FLOAT32,
)

DRAFT_VOCAB_FILE = "draft_vocab.json"  # a draft's kept token ids (a draft model's or an EAGLE head's)
DRAFT_VOCAB_FORMAT = "speclab-draft-vocab"


@dataclass
class LoadedModel:
    """A causal LM ready for cached decoding.

    `kept_token_ids` is set for a draft whose output layer covers only part of the
    target's vocabulary (row i+1 of its vocabulary is full id kept_token_ids[i]; row 0
    is a bucket for every input id it does not know). Its outputs are scattered back
    into the full vocabulary so both models are compared over the same token space.
    """

    name: str
    model: torch.nn.Module
    tokenizer: object
    device: torch.device
    dtype: torch.dtype
    full_vocab_size: int
    kept_token_ids: torch.Tensor | None = None  # (V_kept,) full ids, on device
    full_to_row: torch.Tensor | None = None  # (V_full,) model row of each full id
    cache_arg: str = "past_key_values"
    can_skip_logits: bool = False
    fast_linear: bool = True  # engine forwards use engine/models/cpu_linear.py's packed twin where it applies
    # width -> AS_LOADED, PACKED or ROWS (engine/trace/schema.py), as measured on this machine
    # (engine/models/linear_paths.py); a width it does not name (a prompt's prefill) runs packed, as before any measurement.
    linear_paths: dict[int, str] | None = None
    # The rows kernel's variant per width (engine/models/f32_rows_kernel.py VARIANTS numbers), from the same
    # measurement; a width it does not name runs the kernel's unmeasured default.
    rows_variants: dict[int, int] | None = None
    gguf_file: Path | None = None  # the GGUF file the weights came from, if they did
    # WEIGHTS_FLOAT32 (the model as loaded), WEIGHTS_INT4 or WEIGHTS_INT4_A8 (engine/models/gguf_linear.py): set by use_weights()
    weights: str = WEIGHTS_FLOAT32
    gguf_weights: object | None = None  # gguf_linear.GGUFWeights of the int4 twin
    # DECODER_HF or DECODER_OWN (engine/trace/schema.py): which code computes the engine's forwards, set by
    # use_decoder(); what was asked, and why own did not apply to this model when it was asked and refused
    decoder: str = DECODER_HF
    decoder_asked: str = DECODER_HF
    decoder_fallback: str | None = None
    # engine/kv/prefix.py's PrefixStore while a run that reuses prompt starts has it on (engine.kv.ops.prefill reads it)
    prefix_store: object | None = field(default=None, repr=False, compare=False)
    _twin: torch.nn.Module | None = field(default=None, repr=False, compare=False)
    _rows_twin: torch.nn.Module | None = field(default=None, repr=False, compare=False)  # f32_rows_kernel.rows_twin
    _own: torch.nn.Module | None = field(default=None, repr=False, compare=False)  # engine/models/llama.py's decoder
    _int4_twin: torch.nn.Module | None = field(default=None, repr=False, compare=False)
    _own_int4: torch.nn.Module | None = field(default=None, repr=False, compare=False)  # the own decoder on the blocks
    _bf16_rows: bool | None = field(default=None, repr=False, compare=False)  # bfloat16_on_rows(), once known

    def __post_init__(self) -> None:
        params = inspect.signature(self.model.forward).parameters
        # transformers 5.x renamed the argument to `cache`; 4.x only knows `past_key_values`.
        if "cache" in params:
            self.cache_arg = "cache"
        self.can_skip_logits = "logits_to_keep" in params
        if os.environ.get("SPECLAB_FAST_LINEAR", "1") == "0":
            self.fast_linear = False

    def use_weights(self, weights: str) -> None:
        """Run the engine's forwards on `weights`: WEIGHTS_INT4 (or WEIGHTS_INT4_A8, the same blocks with
        8-bit activations) builds the twin whose linear layers multiply by the GGUF file's blocks
        (engine/models/gguf_linear.py) and refuses, with the reason, a model that has no GGUF file or one
        of another block type."""
        if weights not in TARGET_WEIGHTS:
            raise ValueError(f"unknown target weights {weights!r}; choose one of {', '.join(TARGET_WEIGHTS)}")
        if weights in GGUF_WEIGHTS and self._int4_twin is None:
            if self.gguf_file is None:
                raise ModelLoadError(f"{weights} target weights come from a GGUF file, and {self.name} was not loaded "
                                     "from one (name a folder holding a .gguf file, or use the chat preset)")
            from engine.models.gguf_linear import gguf_twin
            self._int4_twin, self.gguf_weights = gguf_twin(self.model, self.gguf_file)
        if weights in GGUF_WEIGHTS:
            from engine.models.gguf_linear import use_activations
            for module in (self._int4_twin, self._own_int4):  # both share the one blocks; the graphs compile anew
                if module is not None:
                    use_activations(module, ACTIVATIONS[weights])
        self.weights = weights

    def use_decoder(self, decoder: str) -> None:
        """Run the engine's forwards on `decoder`: DECODER_OWN builds engine/models/llama.py's decoder on this
        model's weights; a model it refuses (UnsupportedArchitecture: another model type, rope scaling, a
        tensor-parallel shard...) keeps Hugging Face's modules, and `decoder_fallback` says why.
        `self.model` stays the Hugging Face model: the tokenizer's config, the teaching pages and
        `generate` keep using it."""
        if decoder not in DECODERS:
            raise ValueError(f"unknown decoder {decoder!r}; choose one of {', '.join(DECODERS)}")
        self.decoder_asked, self.decoder, self.decoder_fallback = decoder, DECODER_HF, None
        # the twins wrap or copy the module that runs: built again on first use
        self._own = self._twin = self._rows_twin = self._own_int4 = None
        if decoder == DECODER_HF:
            return
        from engine.models.llama import UnsupportedArchitecture, from_hf
        try:
            self._own = from_hf(self.model)
        except UnsupportedArchitecture as err:
            reason = " ".join(str(err).split()) or type(err).__name__  # one line, as the header keeps it
            cut = MAX_DECODER_FALLBACK_TEXT
            self.decoder_fallback = reason if len(reason) <= cut else reason[:cut - 3].rstrip() + "..."
            return
        self.decoder = DECODER_OWN

    def describe_decoder(self) -> dict:
        """This model's entry in a trace header's "decoder" (engine/trace/header_checks.py checks it)."""
        return {"ran": self.decoder} | ({} if self.decoder_fallback is None else {"fallback": self.decoder_fallback})

    @property
    def base(self) -> torch.nn.Module:
        """The module the float path runs: the engine's own decoder when it is on, else the model as loaded."""
        return self._own if self._own is not None else self.model

    def describe_weights(self) -> dict:
        """What a trace header records as "target_weights" (engine/trace/checks.py checks it)."""
        if self.weights in GGUF_WEIGHTS:
            return {"path": self.weights, "activations": ACTIVATIONS[self.weights], **self.gguf_weights.describe()}
        return {"path": WEIGHTS_FLOAT32}

    @property
    def compiled_module(self) -> torch.nn.Module:
        """What torch.compile compiles (engine/cycle/fast_forward.py): the int4 module on int4 weights,
        else `base`, never the packed twin (inductor cannot lower its oneDNN calls; with its weights
        frozen in, inductor packs them for oneDNN itself)."""
        return self.int4_runner if self.weights in GGUF_WEIGHTS else self.base

    def compiled_module_for(self, width: int) -> torch.nn.Module:
        """What torch.compile compiles for a forward over `width` positions: the rows twin where this
        machine's measurement chose it (its kernel is one opaque operator in the graph, which inductor
        leaves as it is), else `compiled_module`."""
        if self.weights not in GGUF_WEIGHTS and self.linear_paths and self.linear_paths.get(width) == ROWS:
            from engine.models.f32_rows_kernel import prepare_compiled
            prepare_compiled()  # the operator the graph calls without Python, where it builds
            return self.rows_runner
        if self.weights in GGUF_WEIGHTS:
            from engine.models.gguf_kernel import prepare_compiled as prepare_int4
            prepare_int4()  # the same for the int4 kernel's operator
        return self.compiled_module

    @property
    def rows_runner(self) -> torch.nn.Module:
        """`base` with every linear layer on engine/models/f32_rows_kernel.py's kernel. Built on first use."""
        if self._rows_twin is None:
            from engine.models.f32_rows_kernel import rows_twin
            self._rows_twin = rows_twin(self.base)
        plan = self._rows_twin.rows_plan
        if plan.by_rows != (self.rows_variants or {}):  # the measured variants, as settled now (a graph compiled
            plan.by_rows = dict(self.rows_variants or {})  # on the twin guards on them: replaced only when changed
        return self._rows_twin

    @property
    def int4_runner(self) -> torch.nn.Module:
        """The int4 path's module: the twin on the GGUF blocks (Hugging Face's modules), or under
        use_decoder(DECODER_OWN) the engine's own decoder on the same blocks, its q/k/v and gate/up
        fused into one block matrix each (engine/models/gguf_linear.py fused_source). Built on first use."""
        if self.decoder != DECODER_OWN:
            return self._int4_twin
        if self._own_int4 is None:
            from engine.models.gguf_linear import fused_source
            from engine.models.llama import from_hf
            self._own_int4 = from_hf(self.model, fused_source(self._int4_twin))
        return self._own_int4

    @property
    def runner(self) -> torch.nn.Module:
        """What the engine's forwards call: with int4 weights, the twin on the GGUF blocks; on a
        float32 CPU model, a twin whose linear layers run oneDNN with pre-packed weights
        (engine/models/cpu_linear.py: a verify over K+1 positions then costs about one step); on a
        bfloat16 one without bfloat16 instructions, the rows twin (bfloat16_on_rows);
        otherwise `base` itself (the model, or the engine's own decoder under use_decoder(DECODER_OWN),
        whose packed twin is built the same way). `self.model` stays untouched, so Hugging Face's
        `generate` on it is what a user would run. Built on first use."""
        if self.weights in GGUF_WEIGHTS:
            return self.int4_runner
        base = self.base
        if self.bfloat16_on_rows():
            return self.rows_runner
        if not self.fast_linear or not cpu_linear.available(base):
            return base
        if self._twin is None:
            self._twin = cpu_linear.packed_twin(base)
        return self._twin

    def bfloat16_on_rows(self) -> bool:
        """A bfloat16 CPU model runs the rows kernel by default where the CPU has no bfloat16 instructions:
        torch converts every bfloat16 product there, and on a 2-core AMD EPYC with AVX2 the chat target's output
        layer took 3.6 ms at one row and 14.7 at five against the kernel's 1.9 and 2.5 (bench/results/bf16-rows-*).
        Where the CPU has them, the model as loaded stays the default; a calibrated run chooses per width."""
        if not (self.fast_linear and self.dtype == torch.bfloat16 and self.device.type == "cpu"):
            return False
        if self._bf16_rows is None:  # asked before every forward: /proc/cpuinfo is read once
            from engine.models.device import NATIVE_BF16
            from engine.models.f32_rows_kernel import unavailable
            from engine.models.machine import cpu_features
            self._bf16_rows = not any(f in cpu_features() for f in NATIVE_BF16) and unavailable() is None
        return self._bf16_rows

    def runner_for(self, width: int) -> torch.nn.Module:
        """The module a forward over `width` new positions runs on: the model as loaded or the rows twin
        where this machine's measurement found it fastest at that width, else `runner`. The int4 path is one
        path at every width: it is another target distribution, never swapped in per width."""
        if self.weights in GGUF_WEIGHTS:
            return self.int4_runner
        path = self.linear_paths.get(width) if self.linear_paths else None
        if path == AS_LOADED:
            return self.base
        if path == ROWS:
            return self.rows_runner
        return self.runner

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.model.config)

    def model_input(self, token_ids: list[int]) -> torch.Tensor:
        """(1, T) ids as the model numbers them: a pruned draft's own rows."""
        ids = torch.tensor([token_ids], dtype=torch.long, device=self.device)
        return ids if self.full_to_row is None else self.full_to_row[ids]

    @torch.inference_mode()
    def forward(self, token_ids: list[int], cache: DynamicCache, position_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Append K/V for `token_ids` to `cache`; return full-vocabulary logits (T, V_full).

        A draft tree's forward (engine/tree/attention.py) also passes `position_ids` (1, T) and a
        4D additive `attention_mask` (1, 1, T, kv_len); without them the call is the plain causal
        one, the model numbering positions on from the cache length."""
        placed = {"position_ids": position_ids, "attention_mask": attention_mask}
        out = self.runner_for(len(token_ids))(input_ids=self.model_input(token_ids), use_cache=True,
                                              **{self.cache_arg: cache},
                                              **{k: v for k, v in placed.items() if v is not None})
        return self.full_vocab_logits(out.logits[0])

    def full_vocab_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The model's logits (T, V_model) as float32 over the full vocabulary (T, V_full)."""
        logits = logits.float()
        if self.kept_token_ids is None:
            return logits[:, : self.full_vocab_size]
        full = logits.new_full((logits.shape[0], self.full_vocab_size), float("-inf"))
        full[:, self.kept_token_ids] = logits[:, 1:]  # row 0 (unknown bucket) is never proposed
        return full

    @torch.inference_mode()
    def fill(self, token_ids: list[int], cache: DynamicCache) -> None:
        """Append K/V for `token_ids` without using their logits (a prompt's prefill).

        The output layer is asked for the last position only where the model allows it:
        over a 49k vocabulary, logits for every prompt position cost more than the rest
        of a short prompt's forward.
        """
        extra = {"logits_to_keep": 1} if self.can_skip_logits else {}
        self.runner_for(len(token_ids))(input_ids=self.model_input(token_ids), use_cache=True,
                                        **{self.cache_arg: cache}, **extra)

    @torch.inference_mode()
    def forward_with_features(self, token_ids: list[int], cache: DynamicCache,
                              feature_layers: tuple[int, ...] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """forward(), and the top feature (T, H) at each position: an EAGLE head drafts from it. With
        `feature_layers` (an EAGLE-3 head's aux layers), the hidden states after those layers instead,
        side by side: (T, len(feature_layers) * H)."""
        with feature_tap(self.runner_for(len(token_ids)), feature_layers) as tap:  # the module the forward runs
            logits = self.forward(token_ids, cache)
        return logits, tap.features

    @torch.inference_mode()
    def fill_with_features(self, token_ids: list[int], cache: DynamicCache,
                           feature_layers: tuple[int, ...] | None = None) -> torch.Tensor:
        """fill(), and the top feature (T, H) at each position (or those after `feature_layers`)."""
        with feature_tap(self.runner_for(len(token_ids)), feature_layers) as tap:
            self.fill(token_ids, cache)
        return tap.features


class TopFeatureTap:
    """Records the output of a causal LM's last decoder layer (before the final norm) during
    one forward: the same pass that yields the logits, not a second one."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.layer = model.model.layers[-1]
        self.features: torch.Tensor | None = None

    def _record(self, module, args, output) -> None:
        hidden = output[0] if isinstance(output, tuple) else output  # (1, T, H)
        self.features = hidden[0].detach()

    def __enter__(self) -> "TopFeatureTap":
        self.handle = self.layer.register_forward_hook(self._record)
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()


class LayerOutputsTap:
    """Records the hidden states after decoder layers l_1, l_2, ... (id i: the output of the i-th layer,
    before any final norm, as vLLM collects an EAGLE-3 head's aux hidden states) during one forward."""

    def __init__(self, model: torch.nn.Module, layer_ids: tuple[int, ...]) -> None:
        self.layers = [model.model.layers[i - 1] for i in layer_ids]  # id i is after layer i - 1 (0-based) ran
        self.outputs: dict[int, torch.Tensor] = {}
        self.handles: list = []

    @property
    def features(self) -> torch.Tensor:
        """(T, n * H): the aux hidden states side by side, in the order of the ids."""
        return torch.cat([self.outputs[j] for j in range(len(self.layers))], dim=-1)

    def _recorder(self, j: int):
        def record(module, args, output) -> None:
            hidden = output[0] if isinstance(output, tuple) else output  # (1, T, H)
            self.outputs[j] = hidden[0].detach()
        return record

    def __enter__(self) -> "LayerOutputsTap":
        self.handles = [layer.register_forward_hook(self._recorder(j)) for j, layer in enumerate(self.layers)]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()


def feature_tap(model: torch.nn.Module, feature_layers: tuple[int, ...] | None) -> TopFeatureTap | LayerOutputsTap:
    return TopFeatureTap(model) if feature_layers is None else LayerOutputsTap(model, feature_layers)


def _gguf_file(folder: Path) -> str | None:
    files = sorted(p.name for p in folder.glob("*.gguf"))
    return files[0] if files else None


def load_model(spec: str, device: torch.device, dtype: torch.dtype,
               trust_remote_code: bool = False, tp_size: int = 1) -> LoadedModel:
    """Load from a local folder (plain or holding a .gguf file) or a hub id.

    With `tp_size` > 1 (a process of a torchrun group, engine/parallel), transformers shards
    the model's linear layers over the group by its tensor-parallel plan and places this
    rank's shard on its device; the weights become DTensors. The packed oneDNN twin
    (cpu_linear.py) copies whole weights, so it is off: a shard's linear layers run as loaded.
    """
    path = Path(spec).expanduser()
    if spec.startswith((".", "/", "~")) and not path.exists():
        raise ModelLoadError(f"model folder not found: {spec}")
    source = str(path) if path.is_dir() else spec
    kwargs: dict = {"trust_remote_code": trust_remote_code}
    gguf = _gguf_file(path) if path.is_dir() else None
    from_gguf = bool(gguf) and not (path / "config.json").exists()
    if from_gguf:
        kwargs["gguf_file"] = gguf  # transformers dequantises it on load
    sharding = {} if tp_size == 1 else {"distributed_config": DistributedConfig(tp_size=tp_size)}
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs, **sharding)
    except (OSError, ValueError) as err:
        where = "folder" if path.is_dir() else (
            "hub id: not in the local Hugging Face cache, and the hub is off by default "
            "(set HF_HUB_OFFLINE=0 to download, or pass a local folder)")
        raise ModelLoadError(f"could not load model {spec!r} as a {where}: {err}") from err
    if tp_size == 1:
        model.to(device)
    model.eval()
    loaded = _wrap(spec, model, tokenizer, device, dtype, path if path.is_dir() else None)
    loaded.fast_linear = loaded.fast_linear and tp_size == 1
    if from_gguf:
        loaded.gguf_file = path / gguf
    return loaded


def _wrap(name: str, model, tokenizer, device, dtype, folder: Path | None) -> LoadedModel:
    vocab_map = folder / DRAFT_VOCAB_FILE if folder else None
    if vocab_map is None or not vocab_map.exists():
        return LoadedModel(name, model, tokenizer, device, dtype, model.config.vocab_size)
    spec = json.loads(vocab_map.read_text())
    if spec.get("format") != DRAFT_VOCAB_FORMAT or spec.get("version") != 1:
        raise ModelLoadError(f"{vocab_map}: not a version-1 {DRAFT_VOCAB_FORMAT} file")
    kept = torch.tensor(spec["kept_token_ids"], dtype=torch.long)
    if model.config.vocab_size != len(kept) + 1:
        raise ModelLoadError(f"{vocab_map}: {len(kept)} kept ids but the model has {model.config.vocab_size} rows "
                             "(expected kept + 1)")
    full_size = int(spec["full_vocab_size"])
    full_to_row = torch.zeros(full_size, dtype=torch.long)
    full_to_row[kept] = torch.arange(1, len(kept) + 1)
    return LoadedModel(name, model, tokenizer, device, dtype, full_size,
                       kept.to(device), full_to_row.to(device))


def wrap_model(name: str, model, tokenizer, device: torch.device | None = None) -> LoadedModel:
    """Wrap an in-memory model (tests build tiny random ones)."""
    device = device or next(model.parameters()).device
    model.eval()
    return LoadedModel(name, model, tokenizer, device, next(model.parameters()).dtype, model.config.vocab_size)


def check_same_token_space(target: LoadedModel, draft: LoadedModel) -> None:
    """Raise unless both tokenizers map every string to the same ids.

    The acceptance test compares p_target(d) with p_draft(d) for one token id d; if the
    ids mean different strings in the two models, that ratio compares unrelated events.
    """
    why = "the acceptance test compares both models' probabilities of the same token id, so they must share one token space"
    t_tok, d_tok = target.tokenizer, draft.tokenizer
    if t_tok.get_vocab() != d_tok.get_vocab():
        t_vocab, d_vocab = t_tok.get_vocab(), d_tok.get_vocab()
        diff = sorted(set(t_vocab.items()) ^ set(d_vocab.items()))[:3]
        raise TokenizerMismatchError(
            f"draft tokenizer ({len(d_vocab)} tokens) differs from the target's ({len(t_vocab)} tokens), "
            f"e.g. {diff}: {why}")
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        if getattr(t_tok, attr, None) != getattr(d_tok, attr, None):
            raise TokenizerMismatchError(
                f"special token {attr} differs (target {getattr(t_tok, attr, None)}, draft {getattr(d_tok, attr, None)}): {why}")
    if target.full_vocab_size != draft.full_vocab_size:
        raise TokenizerMismatchError(
            f"output sizes differ (target {target.full_vocab_size}, draft {draft.full_vocab_size}): {why}")
