"""Tiny randomly initialised transformers models for fast, real tests."""
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from engine.cycle.pair import Pair
from engine.models.loading import wrap_model

WORDS = ["<eos>", "the", "cat", "dog", "sat", "ran", "on", "a", "mat", "log",
         "and", "then", "it", "slept", "far", "away"]


def tiny_tokenizer(words: list[str] = WORDS) -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=words[1]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token=words[1])


def tiny_llama(seed: int, layers: int, hidden: int, vocab: int = len(WORDS),
               init_std: float = 0.3) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, initializer_range=init_std,
                         eos_token_id=0, bos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(config).eval()


def tiny_pair(seed: int = 0, eos: bool = False, draft_seed: int | None = None) -> Pair:
    """Target 2 layers, draft 1 layer, same 16-word token space. EOS off unless asked."""
    tok = tiny_tokenizer()
    target = wrap_model("tiny-target", tiny_llama(seed, 2, 32), tok)
    draft = wrap_model("tiny-draft", tiny_llama(1000 + (seed if draft_seed is None else draft_seed), 1, 16), tok)
    return Pair(target, draft, {0} if eos else set())


def noisy_pair(seed: int = 0, noise: float = 0.05, eos: bool = False) -> Pair:
    """A draft that is the target plus weight noise: high but imperfect acceptance."""
    import copy
    tok = tiny_tokenizer()
    target_model = tiny_llama(seed, 2, 32)
    draft_model = copy.deepcopy(target_model)
    gen = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for p in draft_model.parameters():
            p.add_(noise * torch.randn(p.shape, generator=gen))
    return Pair(wrap_model("tiny-target", target_model, tok), wrap_model("tiny-noisy-draft", draft_model, tok),
                {0} if eos else set())


def save_tiny(pair: Pair, folder) -> tuple[str, str]:
    """Write both models and the tokenizer as ordinary transformers folders."""
    from pathlib import Path
    paths = []
    for name, m in (("target", pair.target), ("draft", pair.draft)):
        path = Path(folder) / name
        m.model.save_pretrained(path)
        m.tokenizer.save_pretrained(path)
        paths.append(str(path))
    return paths[0], paths[1]
