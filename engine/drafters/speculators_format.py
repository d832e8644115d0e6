"""The speculators folder format of an EAGLE-3 head (vllm-project/speculators), read and written.

A folder holds two files. config.json says what the head is:
  speculators_model_type "eagle3", architectures ["Eagle3Speculator"], speculators_version,
  speculators_config {algorithm "eagle3", proposal_methods [{proposal_type "greedy", speculative_tokens K, ...}],
                      default_proposal_method "greedy", verifier {name_or_path, architectures}},
  transformer_layer_config (a LlamaConfig dict for the head's decoder layer; its vocab_size is the target's),
  draft_vocab_size, target_hidden_size, eagle_aux_hidden_state_layer_ids, norm_before_residual.
model.safetensors holds the weights under these names (H the head's width, V_d the draft vocabulary):
  fc.weight (H, n_aux * H_target), layers.0.{self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj,
  input_layernorm, post_attention_layernorm, hidden_norm}.weight, norm.weight (H,), lm_head.weight (V_d, H),
  d2t (V_d,) int64 with target id = draft index + d2t[draft index], t2d (V_target,) bool, and optionally
  embed_tokens.weight (V_target, H); without it the head reads the target's own embedding (as vLLM does).

A third file is the lab's own and optional: training.json, its record of how the head was trained. Its
"trained_positions" is the longest sequence (prompt and answer, in tokens) the head saw in training: past
it the head attends over positions it never learnt to (the diagnosis counts the cycles that do). Heads from
other tools carry no such file; their trained length is then unknown.

Only safetensors and json are read: nothing here can run code from the folder. Every problem is one
line of ModelLoadError naming the folder.
"""
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.models.loading import ModelLoadError

CONFIG_FILE = "config.json"
TRAINING_FILE = "training.json"  # the lab's record of training, optional
MAX_TRAINED_POSITIONS = 10_000_000  # beyond any context a head is trained on: a larger number is not a length
WEIGHTS_FILE = "model.safetensors"
MODEL_TYPE = "eagle3"
ARCHITECTURE = "Eagle3Speculator"
SPECULATORS_VERSION = "0.3.0"  # the version string written; any is read
LAYER = "layers.0."
LAYER_WEIGHTS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                 "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                 "input_layernorm.weight", "post_attention_layernorm.weight", "hidden_norm.weight")
REQUIRED_WEIGHTS = ("fc.weight", *(LAYER + w for w in LAYER_WEIGHTS), "norm.weight", "lm_head.weight", "d2t", "t2d")
OPTIONAL_WEIGHTS = ("embed_tokens.weight",)
LAYER_CONFIG_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                     "rms_norm_eps", "vocab_size", "max_position_embeddings")


@dataclass
class Eagle3Spec:
    """What config.json says about a head, checked for types; the head's layer is a Llama layer."""

    layer_config: dict  # transformer_layer_config as stored (a LlamaConfig dict)
    draft_vocab_size: int
    target_hidden_size: int
    target_vocab_size: int  # transformer_layer_config.vocab_size: the verifier's vocabulary
    aux_layer_ids: list[int]  # the verifier's layers whose hidden states the head fuses
    norm_before_residual: bool
    speculative_tokens: int
    verifier_name: str | None
    verifier_architectures: list[str]

    @property
    def hidden_size(self) -> int:
        return int(self.layer_config["hidden_size"])


def _fail(folder: Path, what: str) -> None:
    raise ModelLoadError(f"EAGLE-3 head {folder}: {what}")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def read_spec(folder: str | Path) -> Eagle3Spec:
    """config.json of a speculators eagle3 folder; refuses anything else in one line."""
    folder = Path(folder)
    path = folder / CONFIG_FILE
    if not path.is_file():
        _fail(folder, f"{CONFIG_FILE} not found")
    try:
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        _fail(folder, f"{CONFIG_FILE} is not JSON ({e})")
    if not isinstance(cfg, dict) or cfg.get("speculators_model_type") != MODEL_TYPE:
        _fail(folder, f"{CONFIG_FILE} is not a speculators eagle3 config (speculators_model_type must be "
                      f"{MODEL_TYPE!r})")
    layer = cfg.get("transformer_layer_config")
    if not isinstance(layer, dict) or not all(k in layer for k in LAYER_CONFIG_KEYS):
        _fail(folder, f"transformer_layer_config must be a Llama layer config with {', '.join(LAYER_CONFIG_KEYS)}")
    if layer.get("model_type", "llama") != "llama":
        _fail(folder, f"the head's layer is a {layer.get('model_type')!r} layer; the lab runs Llama layers only")
    sc = cfg.get("speculators_config")
    if not isinstance(sc, dict) or sc.get("algorithm") != MODEL_TYPE:
        _fail(folder, "speculators_config.algorithm must be 'eagle3'")
    methods = sc.get("proposal_methods") or [{}]
    tokens = methods[0].get("speculative_tokens", 1) if isinstance(methods[0], dict) else None
    verifier = sc.get("verifier") or {}
    aux = cfg.get("eagle_aux_hidden_state_layer_ids")
    if not (isinstance(aux, list) and aux and all(_is_int(i) for i in aux)):
        _fail(folder, "eagle_aux_hidden_state_layer_ids must be a non-empty list of layer numbers")
    draft_vocab = cfg.get("draft_vocab_size")
    target_hidden = cfg.get("target_hidden_size") or layer["hidden_size"]
    if not (_is_int(draft_vocab) and draft_vocab > 0 and _is_int(target_hidden) and _is_int(tokens)):
        _fail(folder, "draft_vocab_size, target_hidden_size and speculative_tokens must be positive integers")
    return Eagle3Spec(layer, draft_vocab, target_hidden, int(layer["vocab_size"]), list(aux),
                      bool(cfg.get("norm_before_residual", False)), tokens, verifier.get("name_or_path"),
                      list(verifier.get("architectures") or []))


def read_trained_positions(folder: str | Path) -> int | None:
    """training.json's trained_positions, if the folder has the file and it says; a file that is there but
    broken, or a number that cannot be a length, is refused in one line (rather than a check silently lost)."""
    folder = Path(folder)
    path = folder / TRAINING_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        _fail(folder, f"{TRAINING_FILE} is not JSON ({e})")
    value = record.get("trained_positions") if isinstance(record, dict) else None
    if value is not None and not (_is_int(value) and 2 <= value <= MAX_TRAINED_POSITIONS):
        _fail(folder, f"{TRAINING_FILE}: trained_positions must be a whole number of tokens, 2 to "
                      f"{MAX_TRAINED_POSITIONS:,}, got {value!r}")
    return value


def read_weights(folder: str | Path, spec: Eagle3Spec) -> dict[str, torch.Tensor]:
    """model.safetensors: every required weight present, at the shape config.json implies."""
    from safetensors.torch import load_file

    folder = Path(folder)
    path = folder / WEIGHTS_FILE
    if not path.is_file():
        _fail(folder, f"{WEIGHTS_FILE} not found")
    tensors = load_file(str(path))
    missing = [k for k in REQUIRED_WEIGHTS if k not in tensors]
    if missing:
        _fail(folder, f"{WEIGHTS_FILE} lacks {', '.join(missing)}")
    h, th, vd, vt = spec.hidden_size, spec.target_hidden_size, spec.draft_vocab_size, spec.target_vocab_size
    want = {"fc.weight": (h, len(spec.aux_layer_ids) * th), "norm.weight": (h,), "lm_head.weight": (vd, h),
            "d2t": (vd,), "t2d": (vt,), LAYER + "hidden_norm.weight": (h,), LAYER + "input_layernorm.weight": (h,),
            "embed_tokens.weight": (vt, h)}
    for name, shape in want.items():
        if name in tensors and tuple(tensors[name].shape) != shape:
            _fail(folder, f"{name} has shape {tuple(tensors[name].shape)}, config.json implies {shape}")
    return tensors


def check_vocab_maps(folder: str | Path, d2t: torch.Tensor, t2d: torch.Tensor, target_vocab: int) -> torch.Tensor:
    """The draft index -> target id map (V_d,) long, after checking d2t and t2d agree with each other
    and with the target's vocabulary: every mapped id in range and distinct, and t2d true exactly there."""
    folder = Path(folder)
    if d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
        _fail(folder, f"d2t must hold integers (offsets), not {d2t.dtype}")
    if t2d.dtype != torch.bool:
        _fail(folder, f"t2d must be bool, not {t2d.dtype}")
    if t2d.numel() != target_vocab:
        _fail(folder, f"t2d covers {t2d.numel()} target tokens, the target has {target_vocab}")
    targets = torch.arange(d2t.numel()) + d2t.long()  # (V_d,)
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= target_vocab):
        _fail(folder, f"d2t maps draft tokens outside the target's vocabulary of {target_vocab}")
    if torch.unique(targets).numel() != targets.numel():
        _fail(folder, "d2t maps two draft tokens to the same target token")
    marked = torch.zeros(target_vocab, dtype=torch.bool)
    marked[targets] = True
    if not torch.equal(marked, t2d):
        _fail(folder, f"t2d marks {int(t2d.sum())} target tokens, but not exactly the {targets.numel()} that d2t maps to")
    return targets


def vocab_maps(draft_to_target: list[int], target_vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """d2t (V_d,) int64 and t2d (V_target,) bool from the sorted target ids the draft vocabulary keeps."""
    ids = torch.tensor(sorted(draft_to_target), dtype=torch.long)
    t2d = torch.zeros(target_vocab, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(ids.numel()), t2d


def write_folder(folder: str | Path, weights: dict[str, torch.Tensor], spec: Eagle3Spec,
                 dtype: torch.dtype = torch.float16, extra: dict | None = None) -> None:
    """Write config.json and model.safetensors; floating weights in `dtype` (d2t, t2d keep theirs)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = {k: (v.detach().to(dtype) if v.dtype.is_floating_point else v.detach()).contiguous().cpu()
           for k, v in weights.items()}
    save_file(out, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    cfg = {
        "architectures": [ARCHITECTURE],
        "speculators_model_type": MODEL_TYPE,
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": {
            "algorithm": MODEL_TYPE,
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": spec.speculative_tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": spec.verifier_name, "architectures": spec.verifier_architectures},
        },
        "transformer_layer_config": {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                                     **spec.layer_config, "num_hidden_layers": 1},
        "draft_vocab_size": spec.draft_vocab_size,
        "target_hidden_size": spec.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": spec.aux_layer_ids,
        "norm_before_residual": spec.norm_before_residual,
        "torch_dtype": str(dtype).removeprefix("torch."),
        **(extra or {}),
    }
    (folder / CONFIG_FILE).write_text(json.dumps(cfg, indent=1))
