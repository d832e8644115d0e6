"""engine/models/llama.py against Hugging Face's own modules: the same probabilities, step after step, on every layout.

Every comparison is with a Hugging Face model running the same inputs on its own cache of the
same layout, never the decoder against itself.

TOL: float32 matrix products and attention kernels block their sums differently by CPU (and the
fused q/k/v and gate/up products by shape), so the same float32 model differs in the 6th-7th
significant digit between kernels and machines (docs: design.md, "CPU facts"). 1e-5 on a
probability is far above that rounding and far below any real mistake (a wrong position, a
missed mask slot or a skipped norm moves probabilities by 1e-2 or more on these models).
"""
import pytest
import torch
from transformers import DynamicCache, LlamaForCausalLM, MistralConfig
from transformers import LlamaConfig as HFLlamaConfig

from engine.cycle.fast_forward import causal_mask as fast_causal_mask
from engine.kv.layouts import CacheLayout, new_cache, roll_back_cache
from engine.models import cpu_linear
from engine.models.llama import LlamaConfig, LlamaDecoder, UnsupportedArchitecture, from_hf
from engine.models.loading import load_model, wrap_model
from engine.models.presets import PRESETS
from engine.tree.attention import tree_forward, tree_inputs
from engine.tree.compact import compact

try:
    from transformers import Qwen2Config, Qwen2ForCausalLM
except ImportError:  # an older transformers without Qwen2
    Qwen2Config = Qwen2ForCausalLM = None

TOL = 1e-5  # max |dp| between the decoder's and Hugging Face's probabilities (why: the module docstring)
VOCAB = 97
CAPACITY = 64  # static and paged: every case below stays under it
BLOCK = 4  # paged: small blocks, so appends span blocks and rollbacks free some
MAX_DP: dict[str, float] = {}  # case -> the largest |dp| seen (printed with `pytest -s`)

VARIANTS = {
    # name: (model type, K/V heads of 4, tied embeddings, extra config)
    "llama-gqa-untied": ("llama", 2, False, {}),
    "llama-mha-tied": ("llama", 4, True, {}),
    "llama-gqa-bias": ("llama", 1, False, {"attention_bias": True, "mlp_bias": True}),
    "qwen2-gqa-tied": ("qwen2", 2, True, {}),
}
LAYOUTS = ("dynamic", "static", "paged")


def tiny_hf(variant: str, seed: int = 0) -> torch.nn.Module:
    kind, kv_heads, tied, extra = VARIANTS[variant]
    if kind == "qwen2" and Qwen2ForCausalLM is None:
        pytest.skip("this transformers has no Qwen2")
    config_class, model_class = (HFLlamaConfig, LlamaForCausalLM) if kind == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    # initializer_range 0.2: peaked distributions (max p ~0.3-0.9), so a wrong detail shows in the probabilities
    config = config_class(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=256,
                          rms_norm_eps=1e-5, initializer_range=0.2, tie_word_embeddings=tied,
                          rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
                          bos_token_id=None, eos_token_id=None, pad_token_id=None, **extra)
    torch.manual_seed(seed)
    model = model_class(config).eval()
    with torch.no_grad():  # biases start at zero: make them count
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.2)
    return model


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def note(case: str, dp: float) -> None:
    MAX_DP[case] = max(MAX_DP.get(case, 0.0), dp)


@pytest.fixture(scope="module", autouse=True)
def print_max_dp():
    yield
    for case, dp in sorted(MAX_DP.items()):
        print(f"max |dp| {case}: {dp:.2e}")


class Both:
    """A Hugging Face model and the decoder on its weights, each on its own cache of one layout, fed the same inputs."""

    def __init__(self, hf: torch.nn.Module, layout: str, case: str) -> None:
        self.hf, self.ours, self.case = hf, from_hf(hf), case
        make = lambda: new_cache(CacheLayout(layout, CAPACITY, BLOCK), hf.config)  # noqa: E731
        self.hf_cache, self.our_cache = make(), make()
        assert type(self.hf_cache) is type(self.our_cache)

    @torch.inference_mode()
    def step(self, ids: list[int], **extra) -> torch.Tensor:
        """Append ids on both sides (extra: position_ids / attention_mask); assert the same probabilities; ours."""
        x = torch.tensor([ids])
        hf_mask = extra.pop("hf_attention_mask", None)  # a mask built on HF's cache (same values as ours)
        p_hf = self.hf(input_ids=x, use_cache=True, cache=self.hf_cache,
                       **({**extra, "attention_mask": hf_mask} if hf_mask is not None else extra)).logits.softmax(-1)
        out = self.ours(input_ids=x, use_cache=True, cache=self.our_cache, **extra)
        p_ours = out.logits.softmax(-1)  # (1, T, V)
        assert p_ours.shape == p_hf.shape == (1, len(ids), VOCAB)
        dp = (p_ours - p_hf).abs().max().item()
        note(self.case, dp)
        assert dp <= TOL, f"{self.case}: max |dp| {dp:.2e} after {len(ids)} tokens"
        assert int(self.our_cache.get_seq_length()) == int(self.hf_cache.get_seq_length())
        return p_ours[0]

    def roll_back(self, keep: int) -> None:
        roll_back_cache(self.hf_cache, keep)
        roll_back_cache(self.our_cache, keep)

    def length(self) -> int:
        return int(self.our_cache.get_seq_length())


# ---------------------------------------------------------------- configuration

def test_config_reads_llama_and_qwen2():
    llama = LlamaConfig.from_hf(tiny_hf("llama-gqa-untied").config)
    assert (llama.model_type, llama.num_heads, llama.num_kv_heads, llama.n_rep, llama.head_dim) == ("llama", 4, 2, 2, 16)
    assert (llama.rope_theta, llama.rms_norm_eps, llama.tie_word_embeddings, llama.qkv_bias) == (5000.0, 1e-5, False, False)
    assert LlamaConfig.from_hf(tiny_hf("llama-gqa-bias").config).o_bias
    qwen = LlamaConfig.from_hf(tiny_hf("qwen2-gqa-tied").config)
    assert (qwen.model_type, qwen.qkv_bias, qwen.o_bias, qwen.tie_word_embeddings) == ("qwen2", True, False, True)


@pytest.mark.parametrize("variant", ["llama-gqa-untied", "qwen2-gqa-tied"])
def test_rotary_tables_are_hugging_faces(variant):
    """The precomputed tables hold exactly the cos/sin Hugging Face computes per call."""
    hf = tiny_hf(variant)
    ours = from_hf(hf)
    assert torch.equal(ours.model.rotary.inv_freq, hf.model.rotary_emb.inv_freq)
    positions = torch.tensor([[0, 1, 7, 100, 255]])
    cos, sin = hf.model.rotary_emb(torch.zeros(1, dtype=torch.float32), positions)  # (1, T, D)
    our_cos, our_sin = ours.model.rotary(positions)  # (1, 1, T, D)
    assert torch.equal(our_cos[:, 0], cos) and torch.equal(our_sin[:, 0], sin)
    ours.model.rotary.reserve(1000)  # grown past max_position_embeddings: the same formula
    cos, _ = hf.model.rotary_emb(torch.zeros(1), torch.tensor([[999]]))
    assert torch.equal(ours.model.rotary(torch.tensor([[999]]))[0][:, 0], cos)


def test_weights_are_shared_or_fused():
    hf = tiny_hf("llama-mha-tied")
    ours = from_hf(hf)
    assert ours.lm_head.weight is ours.model.embed_tokens.weight  # tied stays tied
    assert ours.model.embed_tokens.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()  # no copy
    attn = hf.model.layers[0].self_attn
    assert torch.equal(ours.model.layers[0].attention.wqkv.weight,
                       torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
    assert not any(p.requires_grad for p in ours.parameters())
    assert isinstance(ours, LlamaDecoder)


# ---------------------------------------------------------------- chains on every layout, with rollbacks

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_chain_steps_match_hugging_face(variant, layout):
    """Prefill, decode steps of 1 and of K+1 = 4 tokens, rollbacks of a rejected tail, more steps."""
    both = Both(tiny_hf(variant), layout, f"chain {variant} {layout}")
    both.step(tokens(9, 1))  # prefill: every position's distribution
    for i in range(3):
        both.step(tokens(1, 10 + i))
    for i in range(2):
        both.step(tokens(4, 20 + i))  # a verify of K = 3 drafts plus the last committed token
    both.roll_back(both.length() - 2)  # two drafts rejected
    both.step(tokens(1, 30))
    both.step(tokens(4, 31))
    both.roll_back(both.length() - 4)  # the whole verify rejected: back across a block boundary on paged
    both.step(tokens(4, 32))
    both.step(tokens(1, 33))
    assert both.length() == 9 + 3 + 8 - 2 + 5 - 4 + 5


@pytest.mark.parametrize("variant", ["llama-gqa-untied", "llama-mha-tied"])
def test_static_with_the_fast_paths_bool_mask(variant):
    """The fast path (engine/cycle/fast_forward.py) hands a 4-D bool causal mask over the static buffer."""
    both = Both(tiny_hf(variant), "static", f"fast-path bool mask {variant}")
    for i, n in enumerate([7, 1, 4, 1, 4]):
        mask = fast_causal_mask(both.our_cache, n)
        both.step(tokens(n, 40 + i), attention_mask=mask, hf_attention_mask=fast_causal_mask(both.hf_cache, n))
        if n == 4:
            both.roll_back(both.length() - 1)


@pytest.mark.parametrize("variant", ["llama-gqa-untied", "qwen2-gqa-tied"])
def test_greedy_decoding_matches_token_for_token(variant):
    hf = tiny_hf(variant, seed=3)
    ours = from_hf(hf)
    prompt = tokens(6, 50)

    @torch.inference_mode()
    def greedy(model, layout: str) -> list[int]:
        cache = new_cache(CacheLayout(layout, CAPACITY, BLOCK), hf.config)
        out, ids = [], prompt
        for _ in range(20):
            logits = model(input_ids=torch.tensor([ids]), use_cache=True, cache=cache).logits
            ids = [int(logits[0, -1].argmax())]
            out.append(ids[0])
        return out

    reference = greedy(hf, "dynamic")
    assert len(set(reference)) > 3  # a real continuation, not one token repeated
    for layout in LAYOUTS:
        assert greedy(ours, layout) == reference, layout


# ---------------------------------------------------------------- trees

def tree_layout(cache_len: int) -> tuple[list[int], list[list[int]]]:
    """Root r at slot L; children a, b of r; c under a, d under b; e under c: positions by depth."""
    L = cache_len
    r, a, b, c, d, e = range(L, L + 6)
    positions = [L, L + 1, L + 1, L + 2, L + 2, L + 3]
    attends = [[r], [r, a], [r, b], [r, a, c], [r, b, d], [r, a, c, e]]
    return positions, attends


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("variant", ["llama-gqa-untied", "llama-mha-tied", "qwen2-gqa-tied"])
def test_tree_mask_matches_hugging_face(variant, layout):
    """A draft tree's verify (4-D additive mask, positions by depth), compaction to one path, then a chain step."""
    both = Both(tiny_hf(variant), layout, f"tree {variant} {layout}")
    both.step(tokens(8, 60))
    L = both.length()
    positions, attends = tree_layout(L)
    ids = tokens(6, 61)
    pos, mask = tree_inputs(both.our_cache, positions, attends, L, torch.float32, torch.device("cpu"))
    _, hf_mask = tree_inputs(both.hf_cache, positions, attends, L, torch.float32, torch.device("cpu"))
    p = both.step(ids, position_ids=pos, attention_mask=mask, hf_attention_mask=hf_mask)
    # siblings share a position but not a distribution: the mask really separates them
    assert (p[1] - p[2]).abs().max() > 1e-3
    for cache in (both.hf_cache, both.our_cache):
        compact(cache, L, [L, L + 2, L + 4])  # accept the path r, b, d
    both.step(tokens(2, 62))


# ---------------------------------------------------------------- as the engine calls it

def test_drop_in_through_loaded_model(monkeypatch):
    """LoadedModel's forward, prefill (logits_to_keep), features tap and tree forward, with the decoder as runner."""
    hf = tiny_hf("llama-gqa-untied")
    reference = wrap_model("hf", hf, tokenizer=None)
    ours = wrap_model("ours", hf, tokenizer=None)
    decoder = from_hf(hf)
    calls = []
    decoder.register_forward_hook(lambda *a: calls.append(1))
    monkeypatch.setattr(reference, "runner_for", lambda width: hf)  # Hugging Face's modules, unpacked
    monkeypatch.setattr(ours, "runner_for", lambda width: decoder)
    assert ours.cache_arg in ("cache", "past_key_values")
    caches = {m.name: new_cache(CacheLayout("paged", CAPACITY, BLOCK), hf.config) for m in (reference, ours)}
    prompt = tokens(7, 70)
    for m in (reference, ours):
        m.fill(prompt[:-1], caches[m.name])
    assert int(caches["ours"].get_seq_length()) == 6
    got = {m.name: m.forward_with_features(prompt[-1:] + tokens(3, 71), caches[m.name]) for m in (reference, ours)}
    (lr, fr), (lo, fo) = got["hf"], got["ours"]
    dp = (lo.softmax(-1) - lr.softmax(-1)).abs().max().item()
    note("drop-in LoadedModel", dp)
    assert dp <= TOL and (fo - fr).abs().max() <= 1e-4 and fo.shape == fr.shape == (4, 64)
    L = int(caches["ours"].get_seq_length())
    positions, attends = tree_layout(L)
    tree = {m.name: tree_forward(m, tokens(6, 72), positions, attends, L, caches[m.name]) for m in (reference, ours)}
    dp = (tree["ours"].softmax(-1) - tree["hf"].softmax(-1)).abs().max().item()
    note("drop-in LoadedModel", dp)
    assert dp <= TOL
    assert len(calls) == 3  # fill, forward, tree: the decoder really ran


@pytest.mark.skipif(not cpu_linear.available(torch.nn.Linear(2, 2)), reason="no oneDNN packing in this torch build")
def test_packed_twin_of_the_decoder():
    """engine/models/cpu_linear.py's packed twin applies to the decoder's fused layers as to Hugging Face's."""
    hf = tiny_hf("llama-gqa-untied")
    twin = cpu_linear.packed_twin(from_hf(hf))
    assert isinstance(twin.lm_head, cpu_linear.PackedLinear)
    ids = torch.tensor([tokens(5, 80)])
    with torch.inference_mode():
        p_hf = hf(input_ids=ids, cache=DynamicCache(config=hf.config)).logits.softmax(-1)
        p_twin = twin(input_ids=ids, cache=DynamicCache(config=hf.config)).logits.softmax(-1)
    note("packed twin", (p_twin - p_hf).abs().max().item())
    assert (p_twin - p_hf).abs().max() <= TOL


def test_logits_to_keep_and_no_cache():
    hf = tiny_hf("llama-mha-tied")
    ours = from_hf(hf)
    ids = torch.tensor([tokens(6, 90), tokens(6, 91)])  # batch of 2, no cache: plain causal attention
    with torch.inference_mode():
        full = hf(input_ids=ids, use_cache=False).logits.softmax(-1)
        mine = ours(input_ids=ids, use_cache=False).logits.softmax(-1)
        last = ours(input_ids=ids, use_cache=False, logits_to_keep=1).logits.softmax(-1)
        old_name = ours(input_ids=ids, past_key_values=DynamicCache(config=hf.config)).logits.softmax(-1)  # 4.x's name
    assert (mine - full).abs().max() <= TOL
    assert (old_name - full).abs().max() <= TOL
    assert last.shape == (2, 1, VOCAB) and (last[:, 0] - full[:, -1]).abs().max() <= TOL
    with pytest.raises(ValueError, match="4-D"):
        ours(input_ids=ids[:1], attention_mask=torch.ones(1, 6))  # a 2-D padding mask is not taken


# ---------------------------------------------------------------- what it refuses

def unsupported_configs() -> dict:
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4)
    cases = {
        "rope type 'linear'": HFLlamaConfig(**base, rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                    "rope_theta": 10000.0}),
        "activation 'gelu'": HFLlamaConfig(**base, hidden_act="gelu"),
        "model type 'mistral'": MistralConfig(**base),
    }
    if Qwen2Config is not None:
        cases["sliding-window"] = Qwen2Config(**base, use_sliding_window=True, sliding_window=16, max_window_layers=0)
    return cases


@pytest.mark.parametrize("what", list(unsupported_configs()))
def test_unsupported_architecture_says_what(what):
    with pytest.raises(UnsupportedArchitecture, match=what) as err:
        LlamaConfig.from_hf(unsupported_configs()[what])
    assert "\n" not in str(err.value)


def test_a_weight_the_decoder_does_not_compute_is_refused():
    hf = tiny_hf("llama-gqa-untied")
    hf.model.layers[0].self_attn.register_parameter("q_norm", torch.nn.Parameter(torch.ones(16)))  # as Qwen3 has
    with pytest.raises(UnsupportedArchitecture, match="q_norm"):
        from_hf(hf)


# ---------------------------------------------------------------- the shipped preset

def test_tiny_shakespeare_target():
    target = load_model(str(PRESETS["tiny-shakespeare"].target_folder()), torch.device("cpu"), torch.float32)
    hf = target.model
    ours = from_hf(hf)
    prompt = target.tokenizer.encode("Romeo.\n")
    assert len(prompt) > 3

    @torch.inference_mode()
    def run(model) -> tuple[list[int], list[torch.Tensor]]:
        """The engine's order: prefill all but the last prompt token, then one step per token, greedy."""
        cache = new_cache(CacheLayout("dynamic"), hf.config)
        model(input_ids=torch.tensor([prompt[:-1]]), use_cache=True, cache=cache, logits_to_keep=1)
        ids, out, probs = prompt[-1:], [], []
        for _ in range(16):
            p = model(input_ids=torch.tensor([ids]), use_cache=True, cache=cache).logits[0, -1].softmax(-1)
            ids = [int(p.argmax())]
            out.append(ids[0])
            probs.append(p)
        return out, probs

    (hf_ids, hf_p), (our_ids, our_p) = run(hf), run(ours)
    dp = max((a - b).abs().max().item() for a, b in zip(hf_p, our_p))
    note("tiny-shakespeare", dp)
    assert dp <= TOL
    assert our_ids == hf_ids
