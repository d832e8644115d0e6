"""Tiny randomly initialised transformers models for fast, real tests."""
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from engine.models import LoadedModel, wrap_model
from engine.speculative import Pair

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
