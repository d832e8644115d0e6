"""The packed oneDNN twin (engine/models/cpu_linear.py) computes what the model computes, and caches the same K/V."""
import inspect

import pytest
import torch
from torch import nn
from transformers import DynamicCache

from engine.config import SpecSettings
from engine.cycle.plain import target_generate
from engine.cycle.reference import speculative_generate
from engine.kv.ops import crop
from engine.models import cpu_linear
from engine.models.cpu_linear import PackedLinear, RowPolicy, packed_twin
from engine.models.loading import wrap_model
from tests.tiny import noisy_pair, tiny_llama, tiny_tokenizer

pytestmark = pytest.mark.skipif(not cpu_linear.available(nn.Linear(2, 2)), reason="no oneDNN linear in this torch")

# A vocabulary larger than the hidden size, so the output layer is a real (M, 64) x (64, 300) product.
WIDE_VOCAB = 300


def wide_model() -> nn.Module:
    torch.manual_seed(0)
    return tiny_llama(seed=3, layers=2, hidden=64, vocab=WIDE_VOCAB, init_std=0.1)


def run(model: nn.Module, ids: torch.Tensor, cache) -> torch.Tensor:
    arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.inference_mode():
        return model(input_ids=ids, use_cache=True, **{arg: cache}).logits[0]  # (T, V)


def test_twin_shares_weights_and_leaves_the_model_alone():
    model = wide_model()
    twin = packed_twin(model)
    assert all(isinstance(m, nn.Linear) and not isinstance(m, PackedLinear) for n, m in model.named_modules()
               if n.endswith(("proj", "lm_head")))
    packed = [m for m in twin.modules() if isinstance(m, PackedLinear)]
    assert len(packed) == sum(isinstance(m, nn.Linear) for m in model.modules())
    model_params = {id(p) for p in model.parameters()}
    assert {id(p) for p in twin.parameters()} <= model_params  # no parameter copied
    assert twin.model.embed_tokens.weight is model.model.embed_tokens.weight


@pytest.mark.parametrize("policy", [None, {"decoder": RowPolicy(), "output": RowPolicy()},
                                    {"decoder": RowPolicy(pad_to=4), "output": RowPolicy(pad_to=5)}])
def test_every_width_1_to_9_matches_the_model_and_caches_the_same_kv(policy):
    model = wide_model()
    twin = packed_twin(model, policy)
    ids = torch.randint(0, WIDE_VOCAB, (1, 30), generator=torch.Generator().manual_seed(1))
    ref_cache, fast_cache = DynamicCache(config=model.config), DynamicCache(config=model.config)
    torch.testing.assert_close(run(twin, ids[:, :20], fast_cache), run(model, ids[:, :20], ref_cache),
                               rtol=1e-4, atol=1e-5)
    for width in range(1, 10):
        new = ids[:, 20:20 + width]
        fast, ref = run(twin, new, fast_cache), run(model, new, ref_cache)
        assert fast.shape == ref.shape == (width, WIDE_VOCAB)
        torch.testing.assert_close(fast, ref, rtol=1e-4, atol=1e-5)
        assert torch.equal(fast.argmax(-1), ref.argmax(-1))
        for fl, rl in zip(fast_cache.layers, ref_cache.layers):
            assert fl.keys.shape[-2] == rl.keys.shape[-2] == 20 + width  # padding never reaches the cache
            torch.testing.assert_close(fl.keys, rl.keys, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(fl.values, rl.values, rtol=1e-4, atol=1e-5)
        crop(fast_cache, 20)
        crop(ref_cache, 20)


def test_padded_rows_are_discarded_and_change_no_real_row():
    torch.manual_seed(0)
    linear = nn.Linear(16, 40)
    x = torch.randn(2, 16)
    padded = PackedLinear(linear, RowPolicy(pad_to=5))
    with torch.inference_mode():
        out = padded(x)
        alone = [padded(x[i:i + 1]) for i in range(2)]
    assert out.shape == (2, 40)
    torch.testing.assert_close(out, linear(x).detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.cat(alone), out, rtol=1e-6, atol=1e-7)


def test_dense_below_keeps_f_linear_bit_for_bit():
    torch.manual_seed(0)
    linear = nn.Linear(16, 40, bias=False)
    x = torch.randn(1, 3, 16)
    with torch.inference_mode():
        assert torch.equal(PackedLinear(linear, RowPolicy(dense_below=4))(x), linear(x))
        assert PackedLinear(linear, RowPolicy())(x).shape == (1, 3, 40)


def test_loaded_model_runs_the_twin_on_cpu_and_can_be_switched_off(monkeypatch):
    tok = tiny_tokenizer()
    fast = wrap_model("t", tiny_llama(0, 2, 32), tok)
    assert fast.runner is not fast.model
    assert any(isinstance(m, PackedLinear) for m in fast.runner.modules())
    assert fast.runner is fast.runner  # built once
    monkeypatch.setenv("SPECLAB_FAST_LINEAR", "0")
    plain = wrap_model("t", tiny_llama(0, 2, 32), tok)
    assert plain.runner is plain.model


@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_speculation_on_the_fast_path_equals_reference_plain_decoding(k):
    pair = noisy_pair(2)
    s = SpecSettings(k=k, temperature=0, max_new_tokens=40)
    prompt = [1, 2, 4, 6, 7]
    spec = [t for r in speculative_generate(pair, prompt, s) for t in r["committed_token_ids"]]
    assert pair.target.runner is not pair.target.model  # speculation ran on the packed twin
    pair.target.fast_linear = False  # plain decoding with the model as loaded (MKL F.linear)
    assert spec == target_generate(pair.target, prompt, s, pair.eos_ids)


@pytest.mark.parametrize("layout", ["dynamic", "static", "paged"])
def test_fast_path_works_with_every_cache_layout(layout):
    pair = noisy_pair(1)
    s = SpecSettings(k=4, temperature=0, max_new_tokens=30, cache_layout=layout)
    prompt = [1, 2, 4, 6, 7]
    spec = [t for r in speculative_generate(pair, prompt, s) for t in r["committed_token_ids"]]
    pair.target.fast_linear = False
    assert spec == target_generate(pair.target, prompt, SpecSettings(k=4, temperature=0, max_new_tokens=30),
                                   pair.eos_ids)
