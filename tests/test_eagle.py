"""The EAGLE-style head drafts from the target's features and stays exact.

Tiny models only: the target is tests/tiny.py's 2-layer Llama, the head one decoder layer
as wide as it, briefly trained here (scripts/train_eagle_head.py's loss) so that draft
tokens are often accepted and the catch-up with the target's true features really runs.
"""
import importlib
import json
import math
from pathlib import Path

import pytest
import torch

from engine.cli import main
from engine.config import SpecSettings
from engine.cycle.pair import Pair, TokenTexts
from engine.cycle.plain import target_generate
from engine.cycle.reference import run_cycle, speculative_generate, start_run
from engine.drafters.eagle import EagleDrafter, EagleHead, head_config, load_head, save_head
from engine.models.loading import ModelLoadError, TopFeatureTap
from engine.run import run_to_trace
from engine.teaching.faults import Faults
from engine.trace import load_trace
from tests.checks import assert_self_consistent
from tests.eagle_tiny import assert_head_is_a_fresh_start
from tests.test_exactness import chi_square_p_value, exact_two_token_distribution, sample_two_tokens
from tests.tiny import save_tiny, tiny_pair

ROOT = Path(__file__).resolve().parent.parent
PROMPT = [1, 2, 4, 6, 7]


def train_script():
    return importlib.import_module("scripts.train_eagle_head")


def trained_tiny_head(target_model, steps: int = 150, seed: int = 0) -> EagleHead:
    """A tiny head fitted to the tiny target's own continuations with the training script's loss."""
    ts = train_script()
    gen = torch.Generator().manual_seed(seed)
    V = target_model.config.vocab_size
    recs = []
    with torch.no_grad():
        for _ in range(24):
            seq = torch.randint(1, V, (3,), generator=gen).tolist()
            probs = []
            for _ in range(20):  # the target's own sampled answer, with its full distribution
                p = torch.softmax(target_model(torch.tensor([seq])).logits[0, -1], -1)
                probs.append(p)
                seq.append(int(torch.multinomial(p, 1, generator=gen)))
            lp = torch.log(torch.stack(probs).clamp(min=1e-12))
            recs.append({"prompt_ids": seq[:3], "answer_ids": seq[3:], "topk_ids": torch.arange(V).expand(20, V).int(),
                         "topk_lp": lp.half()})
    kept = torch.arange(V)
    fr = ts.Frozen(target_model, kept)
    feats = ts.teacher_forced_features(target_model, [r["prompt_ids"] + r["answer_ids"][:-1] for r in recs])
    to_row = torch.arange(V)
    examples = [ts.make_example(r, f, to_row) for r, f in zip(recs, feats)]
    torch.manual_seed(seed)
    head = EagleHead(head_config(target_model.config))
    opt = torch.optim.Adam(head.parameters(), lr=3e-3)
    H = target_model.config.hidden_size
    for step in range(steps):
        batch = ts.collate(examples[(step * 8) % 24:(step * 8) % 24 + 8], H)
        loss = ts.losses(head, fr, batch, noise=0.0, cls_weight=1.0)[0]
        opt.zero_grad()
        loss.backward()
        opt.step()
    for p in target_model.parameters():
        p.requires_grad_(False)
    return head.eval()


@pytest.fixture(scope="module")
def eagle_pair() -> Pair:
    target = tiny_pair(0).target
    head = trained_tiny_head(target.model)
    return Pair(target, None, set(), EagleDrafter.build(target, head))


def fresh_pair(eagle_pair: Pair, eos: bool = False) -> Pair:
    return Pair(eagle_pair.target, None, {0} if eos else set(), eagle_pair.drafter)


# ---------------------------------------------------------------- exactness

@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_greedy_equals_plain_target_decoding(eagle_pair, k):
    s = SpecSettings(k=k, temperature=0, max_new_tokens=40)
    records = list(speculative_generate(eagle_pair, PROMPT, s))
    spec = [t for r in records for t in r["committed_token_ids"]]
    assert spec == target_generate(eagle_pair.target, PROMPT, s, eagle_pair.eos_ids)
    assert sum(r["num_accepted"] for r in records) > 0.3 * len(records)  # the head's tokens are really kept
    if k > 1:
        assert any(r["num_accepted"] >= 2 for r in records)  # a step that read a predicted feature was accepted


def test_chi_square_exact_at_temperature_one(eagle_pair):
    """The first two emitted tokens follow the target's own joint distribution."""
    s = SpecSettings(k=2, temperature=1.0, max_new_tokens=2, seed=77)
    with torch.inference_mode():
        exact = exact_two_token_distribution(eagle_pair, s)
    tally: dict = {}
    counts = sample_two_tokens(eagle_pair, s, Faults(), 2000, tally=tally)
    assert tally["accepted"] > 500  # the head proposes tokens the target often keeps
    assert chi_square_p_value(counts, exact) > 1e-3


def test_chi_square_catches_a_head_reported_with_the_wrong_distribution(eagle_pair):
    """Control: the same test fails when the ratio test is fed a q the tokens were not drawn from."""

    class LyingDrafter(EagleDrafter):
        def propose(self, state, committed, k, s, gen):
            p = super().propose(state, committed, k, s, gen)
            p.p_draft = torch.softmax(torch.zeros_like(p.p_draft), -1)  # claims uniform q
            return p

    d = eagle_pair.drafter
    pair = Pair(eagle_pair.target, None, set(), LyingDrafter(d.target, d.head, d.parts))
    s = SpecSettings(k=2, temperature=1.0, max_new_tokens=2, seed=77)
    with torch.inference_mode():
        exact = exact_two_token_distribution(pair, s)
    assert chi_square_p_value(sample_two_tokens(pair, s, Faults(), 2000), exact) < 1e-3


# ---------------------------------------------------------------- the head's cache and features

@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_head_cache_is_a_fresh_start_over_the_committed_sequence_after_every_cycle(eagle_pair, temperature):
    """After each cycle the head holds committed - 1 positions, built from the target's true
    features only: exactly what starting afresh on the committed sequence builds."""
    pair = eagle_pair
    s = SpecSettings(k=4, temperature=temperature, max_new_tokens=40, seed=3)
    gen = torch.Generator().manual_seed(s.seed)
    state = start_run(pair, PROMPT)
    texts = TokenTexts(pair.target.tokenizer)
    cycle, saw_partial, saw_full = 0, False, False
    while not state.finished:
        rec = run_cycle(pair, state, s, gen, cycle, texts)
        n = len(state.committed)
        d = rec["draft_cache_len"]
        assert d["before"] + len(rec["draft_token_ids"]) == d["after_append"]
        assert d["after_rollback"] == n - 1
        assert_head_is_a_fresh_start(pair.drafter, state.draft_state, state.committed)
        assert rec["drafter_state"]["feature_sources"] == ["target"] + ["head"] * 3
        saw_partial |= 0 < rec["num_accepted"] < 4
        saw_full |= rec["num_accepted"] == 4
        cycle += 1
    assert saw_partial  # rejections after accepted tokens were rolled back and caught up


def test_no_second_target_pass_per_cycle(eagle_pair):
    """One target forward per cycle (the verify pass); the head takes its features from it."""
    pair = eagle_pair
    calls = []
    handle = pair.target.runner.register_forward_hook(lambda *a: calls.append(1))  # what the engine calls
    try:
        s = SpecSettings(k=3, temperature=0, max_new_tokens=20)
        records = list(speculative_generate(pair, PROMPT, s))
    finally:
        handle.remove()
    assert len(calls) == 1 + len(records)  # the prefill, then one verify per cycle


def test_verify_features_are_the_last_layer_outputs_of_a_full_pass(eagle_pair):
    target = eagle_pair.target
    ids = [1, 2, 3, 4, 5, 6]
    cache = target.new_cache()
    target.fill(ids[:3], cache)
    _, feats = target.forward_with_features(ids[3:], cache)
    with torch.inference_mode():
        with TopFeatureTap(target.model) as tap:
            target.model(torch.tensor([ids]))
    assert torch.allclose(feats, tap.features[3:], atol=1e-5)  # cached verify = one full pass
    # the tapped features are the top ones: the final norm and output layer turn them into the logits
    normed = target.model.model.norm(tap.features)
    assert torch.allclose(normed @ target.model.lm_head.weight.T,
                          target.model(torch.tensor([ids])).logits[0], atol=1e-4)


# ---------------------------------------------------------------- the head against a hand-written reference

def rms_norm(x, weight, eps):
    return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rope(x, positions, theta):
    """x (heads, T, d): rotate pairs (i, i + d/2) by position x inverse frequency (Llama's layout)."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    angles = positions[:, None].float() * inv_freq[None]  # (T, d/2)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    rotated = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + rotated * sin


def reference_head(head: EagleHead, target_model, tokens: list[int], prev_features: torch.Tensor,
                   kept: torch.Tensor, temperature: float) -> torch.Tensor:
    """Features in, distribution out, written from the definitions: (T, V_full)."""
    cfg = head.config
    sd = {k: v.double() for k, v in head.state_dict().items()}
    tnorm_w = target_model.model.norm.weight.double()
    eps = target_model.config.rms_norm_eps
    emb = target_model.model.embed_tokens.weight.double()[tokens]  # (T, H)
    f_normed = rms_norm(prev_features.double(), tnorm_w, eps)  # row 0 stays zero: no feature before x_0
    x = torch.cat([emb, f_normed], -1) @ sd["fuse.weight"].T + sd["fuse.bias"]  # (T, H)
    T, nh, nkv, hd = len(tokens), cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    pre = "body.layers.0."
    h = rms_norm(x, sd[pre + "input_layernorm.weight"], cfg.rms_norm_eps)
    q = (h @ sd[pre + "self_attn.q_proj.weight"].T).view(T, nh, hd).transpose(0, 1)
    k = (h @ sd[pre + "self_attn.k_proj.weight"].T).view(T, nkv, hd).transpose(0, 1)
    v = (h @ sd[pre + "self_attn.v_proj.weight"].T).view(T, nkv, hd).transpose(0, 1)
    theta = cfg.rope_parameters["rope_theta"]
    pos = torch.arange(T)
    q, k = rope(q, pos, theta), rope(k, pos, theta)
    k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    attn = (torch.softmax(scores, -1) @ v).transpose(0, 1).reshape(T, nh * hd)
    x = x + attn @ sd[pre + "self_attn.o_proj.weight"].T
    h = rms_norm(x, sd[pre + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
    gate, up = h @ sd[pre + "mlp.gate_proj.weight"].T, h @ sd[pre + "mlp.up_proj.weight"].T
    x = x + (torch.nn.functional.silu(gate) * up) @ sd[pre + "mlp.down_proj.weight"].T  # predicted features
    logits_kept = rms_norm(x, tnorm_w, eps) @ target_model.lm_head.weight.double()[kept].T / temperature
    probs = torch.zeros(T, target_model.config.vocab_size, dtype=torch.double)
    probs[:, kept] = torch.softmax(logits_kept, -1)
    return probs.float()


def random_head(target, seed: int) -> EagleHead:
    """An untrained head with large random weights, so every part of it shows in the output."""
    torch.manual_seed(seed)
    head = EagleHead(head_config(target.model.config))
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.2)
    return head


def test_head_distribution_matches_a_hand_written_reference():
    """Target features in, q out: one draft step of the engine against the definitions, with a
    random head and a pruned output layer (8 of 16 tokens kept)."""
    target = tiny_pair(3).target
    head = random_head(target, seed=11)
    kept = torch.tensor([0, 1, 2, 3, 5, 8, 9, 13])
    drafter = EagleDrafter.build(target, head, kept)
    committed = [1, 2, 4, 6, 7, 3]
    state = drafter.start(committed)  # the head holds positions 0..4 from the target's features
    s = SpecSettings(k=1, temperature=0.7)
    proposal = drafter.propose(state, committed, 1, s, torch.Generator().manual_seed(0))
    with torch.inference_mode():
        with TopFeatureTap(target.model) as tap:
            target.model(torch.tensor([committed]))
    feats = tap.features  # (6, H) f_0..f_5
    prev = torch.cat([torch.zeros(1, feats.shape[1]), feats[:-1]])  # f_{p-1}, zeros at p = 0
    with torch.no_grad():
        ref = reference_head(head, target.model, committed, prev, kept, 0.7)
    # position 5 is the first draft step: it reads x_5 and the target's f_4
    assert torch.allclose(proposal.p_draft[0], ref[-1], atol=1e-5)
    assert proposal.p_draft[0][[4, 6, 7]].sum() == 0  # never proposes outside the kept vocabulary
    assert proposal.token_ids[0] in kept.tolist()


def test_training_time_test_step_two_is_the_engines_second_draft_step():
    """The training script's unrolled step 2 at the first answer entry must be what a cycle's
    second draft step computes: the head fed its own step-1 prediction, over a cache of true
    features. Otherwise the training-time test trains the head for a situation that never occurs."""
    ts = train_script()
    target = tiny_pair(3).target
    head = random_head(target, seed=5)
    prompt, answer = [1, 2, 4, 6, 7], [3, 9, 12, 5]
    V = target.model.config.vocab_size
    with torch.inference_mode():
        with TopFeatureTap(target.model) as tap:
            target.model(torch.tensor([prompt + answer[:-1]]))
    feats = tap.features.float()  # (L, H) f_0..f_{L-1}
    rec = {"prompt_ids": prompt, "answer_ids": answer, "topk_ids": torch.arange(V).expand(len(answer), V).int(),
           "topk_lp": torch.zeros(len(answer), V).half()}
    fr = ts.Frozen(target.model, torch.arange(V))
    ids, fb, pb, pt, _, _ = ts.collate([ts.make_example(rec, feats, torch.arange(V))], feats.shape[1])
    own = ts.reads_prediction(ids, pb, pt)
    assert own[0].tolist() == [False] * len(prompt) + [True] * (len(answer) - 1)
    with torch.no_grad():
        step1, step2 = ts.unrolled_predictions(head, fr, ids, fr.prev_inputs(fb), own, 2)

    drafter = EagleDrafter.build(target, head)
    P = len(prompt)
    state = drafter.start(prompt, features=feats[:P - 1])  # head entries 0..P-2 from true features
    engine1 = drafter.feed(state, P - 1, [prompt[-1]], feats[P - 2:P - 1])  # draft step 1 reads f_{P-2}
    engine2 = drafter.feed(state, P, [answer[0]], engine1)  # step 2 reads its own predicted f_{P-1}
    assert torch.allclose(step1[0, P - 1], engine1[0], atol=1e-5)
    assert torch.allclose(step2[0, P], engine2[0], atol=1e-5)
    assert not torch.allclose(step1[0, P], step2[0, P], atol=1e-3)  # step 2 really read something else


# ---------------------------------------------------------------- files, trace and CLI

def test_save_and_load_round_trip_in_half_precision(eagle_pair, tmp_path):
    d = eagle_pair.drafter
    save_head(tmp_path / "head", d.head, eagle_pair.target.model.config, None, "tiny-eagle")
    loaded = load_head(tmp_path / "head", eagle_pair.target)
    for (name, a), (_, b) in zip(d.head.state_dict().items(), loaded.head.state_dict().items()):
        assert torch.equal(a.half().float(), b), name
    assert loaded.name == "tiny-eagle" and loaded.describe()["kept_vocab"] == 16


def test_a_head_for_another_target_is_refused(eagle_pair, tmp_path):
    d = eagle_pair.drafter
    save_head(tmp_path / "head", d.head, eagle_pair.target.model.config, None, "tiny-eagle")
    spec = json.loads((tmp_path / "head" / "head_config.json").read_text())
    spec["target"]["hidden_size"] = 576
    (tmp_path / "head" / "head_config.json").write_text(json.dumps(spec))
    with pytest.raises(ModelLoadError, match="hidden_size 576"):
        load_head(tmp_path / "head", eagle_pair.target)


def test_trace_names_the_drafter_and_loads(eagle_pair, tmp_path):
    pair = eagle_pair
    trace = run_to_trace(pair, "the cat sat on a mat", SpecSettings(k=3, temperature=1.0, max_new_tokens=20, seed=2),
                         tmp_path / "t.jsonl", chat_template=False)
    loaded = load_trace(tmp_path / "t.jsonl")
    assert loaded.header["drafter"]["kind"] == "eagle" and loaded.drafter_kind == "eagle"
    assert loaded.header["draft"]["architecture"].startswith("EagleHead")
    assert all(c["drafter_state"]["feature_sources"][0] == "target" for c in loaded.cycles)
    assert_self_consistent(loaded)
    assert trace.summary["num_generated"] == 20


def test_cli_runs_the_eagle_drafter(eagle_pair, tmp_path):
    pair = tiny_pair(0)
    target_dir, _ = save_tiny(pair, tmp_path)
    save_head(tmp_path / "head", eagle_pair.drafter.head, pair.target.model.config, None, "tiny-eagle")
    out = tmp_path / "cli.jsonl"
    rc = main(["run", "--target", target_dir, "--drafter", "eagle", "--draft", str(tmp_path / "head"),
               "--prompt", "the cat sat", "--k", "3", "--max-new-tokens", "12", "--temperature", "0",
               "--out", str(out), "--device", "cpu"])
    assert rc in (0, None)
    trace = load_trace(out)
    assert trace.drafter_kind == "eagle" and trace.header["draft"]["name"] == "tiny-eagle"
    spec = [t for c in trace.cycles for t in c["committed_token_ids"]]
    s = SpecSettings(k=3, temperature=0, max_new_tokens=12)
    assert spec == target_generate(pair.target, trace.header["prompt_token_ids"], s, set())[: len(spec)]


@pytest.mark.parametrize("layout", ["static", "paged"])
def test_head_cache_in_every_layout_greedy_equal_and_trace_loads(eagle_pair, layout, tmp_path):
    """The head's cache is made in the run's layout and rolled back by that layout's crop."""
    from engine.trace.schema import LAYOUTS
    assert layout in LAYOUTS
    s = SpecSettings(k=4, temperature=0, max_new_tokens=30, cache_layout=layout, block_size=4)
    tokens = [t for r in speculative_generate(eagle_pair, PROMPT, s) for t in r["committed_token_ids"]]
    assert tokens == target_generate(eagle_pair.target, PROMPT, s, set())
    run_to_trace(eagle_pair, "the cat sat on a mat", s, tmp_path / "t.jsonl", chat_template=False)
    trace = load_trace(tmp_path / "t.jsonl")
    assert trace.header["cache_layout"]["name"] == layout
    assert_self_consistent(trace)
    assert all("draft_cache_layout_state" in c for c in trace.cycles)  # the head's cache is its own row


def test_shipped_chat_head_is_half_precision_small_and_documented():
    from safetensors import safe_open
    folder = ROOT / "assets" / "models" / "chat-eagle"
    assert (folder / "head.safetensors").stat().st_size <= 25 * 2**20
    with safe_open(str(folder / "head.safetensors"), "pt") as f:
        assert all(f.get_tensor(k).dtype == torch.float16 for k in f.keys())
    spec = json.loads((folder / "head_config.json").read_text())
    assert spec["format"] == "speclab-eagle-head" and spec["target"] == {"hidden_size": 576, "vocab_size": 49152}
    info = json.loads((folder / "training.json").read_text())
    m = info["measurements"]
    assert 0 < m["alpha_temperature_1"] < 1 and 0 < m["greedy_agreement"] < 1 and m["c"] > 0
    assert info["data"]["train_answer_tokens"] > 0 and info["training"]["curve"]
