"""Hugging Face `generate` baselines for the speed benchmark: plain and assisted.

Both run with the benchmark's sampling settings (temperature, no top-k / top-p) and no
EOS stop, so every method generates exactly max_new_tokens tokens.

A pruned-vocabulary draft (engine/models/loading.py: row 0 an unknown bucket, row i+1 the full
id kept_token_ids[i]) cannot be an HF assistant as it is: its logits have a different
width from the target's. `full_vocab_assistant` wraps it so HF sees full-vocabulary
ids and logits: input ids are mapped to draft rows, and logits are scattered into the
full vocabulary with -inf for ids the draft never proposes, as our engine does.
"""
import copy

import torch
from transformers import GenerationConfig

from engine.config import SpecSettings
from engine.models.loading import LoadedModel


def no_eos(model) -> None:
    """Stop HF from ending at EOS: `generate` fills unset values from the model's own config."""
    model.generation_config.eos_token_id = None
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = 0


def generation_config(s: SpecSettings) -> GenerationConfig:
    sampled = s.temperature > 0
    return GenerationConfig(max_new_tokens=s.max_new_tokens, min_new_tokens=None, do_sample=sampled,
                            temperature=s.temperature if sampled else None, top_k=s.top_k if sampled else None,
                            top_p=s.top_p if sampled else None)


def fix_k(assistant, k: int) -> None:
    """A constant K draft tokens per cycle (design notes: HF assisted generation with a fixed K)."""
    assistant.generation_config.num_assistant_tokens = k
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    assistant.generation_config.assistant_confidence_threshold = 0.0


def full_vocab_assistant(draft: LoadedModel):
    """The draft as an HF model with full-vocabulary inputs and logits (shares its weights)."""
    if draft.kept_token_ids is None:
        return draft.model
    base = type(draft.model)
    kept, full_to_row, size = draft.kept_token_ids, draft.full_to_row, draft.full_vocab_size

    class FullVocabDraft(base):
        def forward(self, input_ids=None, **kwargs):
            out = super().forward(input_ids=None if input_ids is None else full_to_row[input_ids], **kwargs)
            full = out.logits.new_full((*out.logits.shape[:-1], size), float("-inf"))
            full[..., kept] = out.logits[..., 1:]  # row 0 (the unknown bucket) is never proposed
            out.logits = full
            return out

    wrapped = copy.copy(draft.model)  # a shallow copy: same modules and weights, own attributes
    wrapped.__class__ = FullVocabDraft
    wrapped.config = copy.deepcopy(draft.model.config)
    wrapped.config.vocab_size = size
    wrapped.generation_config = copy.deepcopy(draft.model.generation_config)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):  # those are draft rows, not full ids
        setattr(wrapped.generation_config, name, None)
    return wrapped


@torch.inference_mode()
def hf_generate(target, prompt_ids: list[int], s: SpecSettings, assistant=None) -> list[int]:
    """New token ids from `target.generate`, assisted when an assistant is given."""
    ids = torch.tensor([prompt_ids], device=target.device)
    out = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=generation_config(s),
                          assistant_model=assistant)
    return out[0, len(prompt_ids):].tolist()
