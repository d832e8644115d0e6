"""The EAGLE-3 head (engine/drafters/eagle3.py) in the speculators format: files, refusals, exactness, caches.

The target is a tiny random 6-layer Llama (hidden 64) over tests/tiny.py's 16 words; the head is random and
written in the speculators format with a draft vocabulary of 10 of those 16 words, so 6 target tokens can
never be drafted. It fuses the hidden states after layers 2, 3 and 5: vLLM's default (2, L // 2, L - 3) repeats
layer 3 for six layers, and vLLM collects a repeated layer once (the loader refuses that).
"""
import importlib
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.cli import main
from engine.config import SettingsError, SpecSettings
from engine.cycle.pair import Pair, TokenTexts
from engine.cycle.plain import target_generate
from engine.cycle.reference import run_cycle, speculative_generate, start_run
from engine.drafters.eagle3 import (
    Eagle3Drafter,
    load_eagle3,
    new_head,
    save_eagle3,
    spec_for,
)
from engine.kv.layouts import attended_kv
from engine.models.loading import ModelLoadError, wrap_model
from engine.run import run_to_trace
from engine.teaching.faults import Faults
from engine.trace import TraceError, load_trace
from tests.checks import assert_self_consistent
from tests.test_exactness import chi_square_p_value, exact_two_token_distribution, sample_two_tokens
from tests.tiny import tiny_llama, tiny_tokenizer

PROMPT = [1, 2, 4, 6, 7]
KEPT = [0, 1, 2, 3, 5, 8, 9, 13, 14, 15]  # the draft vocabulary's target ids
LEFT_OUT = [4, 6, 7, 10, 11, 12]  # never drafted
LAYERS = 6
AUX = [2, 3, 5]


def tiny_target(seed: int = 0):
    return wrap_model("tiny-target-6", tiny_llama(seed, LAYERS, 64), tiny_tokenizer())


def random_head_folder(target, folder: Path, seed: int = 1, scale: float | None = None,
                       dtype: torch.dtype = torch.float32) -> Path:
    """A random head for `target` written in the speculators format; `scale` redraws every weight N(0, scale)
    so each part of the head shows in its output."""
    spec = spec_for(target, KEPT, AUX, k=3)
    torch.manual_seed(seed)
    head = new_head(spec)
    if scale is not None:
        with torch.no_grad():
            for p in head.parameters():
                p.normal_(0, scale)
    save_eagle3(folder, head, spec, KEPT, dtype=dtype)
    return Path(folder)


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def head_dir(target, tmp_path_factory) -> Path:
    return random_head_folder(target, tmp_path_factory.mktemp("eagle3") / "head")


@pytest.fixture(scope="module")
def pair(target, head_dir) -> Pair:
    return Pair(target, None, set(), load_eagle3(head_dir, target))


# ---------------------------------------------------------------- the format

def test_round_trip_keeps_every_weight_and_the_vocabulary_maps(target, tmp_path):
    spec = spec_for(target, KEPT, AUX)
    torch.manual_seed(3)
    head = new_head(spec)
    save_eagle3(tmp_path / "h", head, spec, KEPT, dtype=torch.float16)
    drafter = load_eagle3(tmp_path / "h", target)
    for (name, a), (_, b) in zip(head.state_dict().items(), drafter.head.state_dict().items(), strict=True):
        if not name.startswith("body.embed_tokens"):  # the body's 1-row embedding is never used nor saved
            assert torch.equal(a.half().float(), b), name
    assert drafter.draft_to_target.tolist() == KEPT
    assert drafter.aux_layer_ids == (2, 3, 5) and drafter.describe()["kept_vocab"] == len(KEPT)
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["architectures"] == ["Eagle3Speculator"]
    assert cfg["speculators_config"]["proposal_methods"][0] == {"proposal_type": "greedy", "speculative_tokens": 3,
                                                                 "verifier_accept_k": 1, "accept_tolerance": 0.0}
    assert cfg["transformer_layer_config"]["vocab_size"] == 16 and cfg["draft_vocab_size"] == len(KEPT)
    weights = load_file(str(tmp_path / "h" / "model.safetensors"))
    assert weights["d2t"].dtype == torch.int64 and weights["t2d"].dtype == torch.bool
    assert (torch.arange(len(KEPT)) + weights["d2t"]).tolist() == KEPT  # target id = draft index + d2t
    assert torch.nonzero(weights["t2d"]).flatten().tolist() == KEPT
    assert weights["layers.0.self_attn.q_proj.weight"].shape == (64, 128)  # q/k/v read 2H
    assert weights["fc.weight"].shape == (64, 3 * 64)


def edit_config(folder: Path, change) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    change(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))


def edit_weights(folder: Path, change) -> None:
    weights = load_file(str(folder / "model.safetensors"))
    change(weights)
    save_file(weights, str(folder / "model.safetensors"))


def flip_t2d(w):
    w["t2d"][4] = True  # marks a token d2t does not map to


def duplicate_d2t(w):
    w["d2t"][1] = w["d2t"][0] - 1  # draft 1 -> target id KEPT[0]


def d2t_past_vocab(w):
    w["d2t"][-1] = 100


REFUSALS = {
    "hidden size": (lambda f: edit_config(f, lambda c: c.update(target_hidden_size=576)), "verifier has hidden size 576"),
    "vocabulary": (lambda f: edit_config(f, lambda c: c["transformer_layer_config"].update(vocab_size=49152)),
                   "vocabulary of 49152"),
    "aux layer ids": (lambda f: edit_config(f, lambda c: c.update(eagle_aux_hidden_state_layer_ids=[2, 3, 7])),
                      r"aux layer ids \[7\] are out of range"),
    "aux layer zero": (lambda f: edit_config(f, lambda c: c.update(eagle_aux_hidden_state_layer_ids=[0, 3, 5])),
                       r"aux layer ids \[0\] are out of range"),
    "aux layer twice": (lambda f: edit_config(f, lambda c: c.update(eagle_aux_hidden_state_layer_ids=[2, 3, 3])),
                        "repeat a layer"),
    "missing weight": (lambda f: edit_weights(f, lambda w: w.pop("lm_head.weight")), "lacks lm_head.weight"),
    "missing d2t": (lambda f: edit_weights(f, lambda w: w.pop("d2t")), "lacks d2t"),
    "wrong shape": (lambda f: edit_weights(f, lambda w: w.update({"fc.weight": torch.zeros(64, 128)})),
                    "fc.weight has shape"),
    "t2d disagrees": (lambda f: edit_weights(f, flip_t2d), "t2d marks 11 target tokens"),
    "d2t twice": (lambda f: edit_weights(f, duplicate_d2t), "two draft tokens to the same target token"),
    "d2t outside": (lambda f: edit_weights(f, d2t_past_vocab), "outside the target's vocabulary"),
    "t2d not bool": (lambda f: edit_weights(f, lambda w: w.update(t2d=w["t2d"].long())), "t2d must be bool"),
    "not eagle3": (lambda f: edit_config(f, lambda c: c.update(speculators_model_type="eagle")),
                   "not a speculators eagle3 config"),
    "no config": (lambda f: (f / "config.json").unlink(), "config.json not found"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_each_bad_folder_is_refused_in_one_line(target, tmp_path, case):
    folder = random_head_folder(target, tmp_path / "h")
    spoil, message = REFUSALS[case]
    spoil(folder)
    with pytest.raises(ModelLoadError, match=message) as err:
        load_eagle3(folder, target)
    assert "\n" not in str(err.value) and str(folder) in str(err.value)


# ---------------------------------------------------------------- the target's aux hidden states

def test_aux_features_are_the_hidden_states_after_those_layers_from_the_same_pass(target):
    """Id i is the hidden state after i decoder layers (HF's hidden_states[i], pre-norm for i < L), side by
    side; a cached verify yields what one full pass does."""
    ids = [1, 2, 3, 4, 5, 6, 7]
    cache = target.new_cache()
    target.fill(ids[:4], cache)
    _, feats = target.forward_with_features(ids[4:], cache, (2, 3, 5))
    with torch.inference_mode():
        hs = target.model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    want = torch.cat([hs[2][0], hs[3][0], hs[5][0]], -1)[4:]  # (3, 3 * 64)
    assert feats.shape == (3, 192)
    # Another batch shape takes other float32 kernels (which also differ by CPU), whose rounding scales with the
    # residual stream (here up to ~80): an AVX2-only EPYC at 2 threads differed by 1.6e-4 on it, 2e-6 of its
    # largest value. So the bound is relative to that scale; a wrong layer differs by whole units.
    assert (feats - want).abs().max() <= 1e-5 * want.abs().max()


# ---------------------------------------------------------------- exactness

@pytest.mark.parametrize("k", [1, 2, 4])
def test_greedy_equals_plain_target_decoding(pair, k):
    s = SpecSettings(k=k, temperature=0, max_new_tokens=40)
    records = list(speculative_generate(pair, PROMPT, s))
    assert [t for r in records for t in r["committed_token_ids"]] == target_generate(pair.target, PROMPT, s, set())
    assert any(r["num_accepted"] >= 1 for r in records)  # the head's tokens are kept at times: rollbacks ran
    assert all(len(r["draft_token_ids"]) == k for r in records)


def test_chi_square_exact_at_temperature_one(pair):
    """The first two emitted tokens follow the target's joint distribution, though q is 0 on 6 of 16 tokens."""
    s = SpecSettings(k=2, temperature=1.0, max_new_tokens=2, seed=77)
    with torch.inference_mode():
        exact = exact_two_token_distribution(pair, s, PROMPT)
    assert exact[LEFT_OUT].sum() > 0.05  # tokens the head cannot draft carry real target mass
    tally: dict = {}
    counts = sample_two_tokens(pair, s, Faults(), 1500, PROMPT, tally=tally)
    assert tally["accepted"] > 150  # the head's tokens are often kept, so the ratio test really decides
    assert chi_square_p_value(counts, exact) > 1e-3


def test_chi_square_catches_a_head_that_reports_the_wrong_distribution(pair):
    """Control: the same test fails when the ratio test gets a q the tokens were not drawn from."""

    class LyingDrafter(Eagle3Drafter):
        def propose(self, state, committed, k, s, gen):
            p = super().propose(state, committed, k, s, gen)
            p.p_draft = torch.softmax(torch.zeros_like(p.p_draft), -1)  # claims uniform q
            return p

    d = pair.drafter
    liar = Pair(pair.target, None, set(), LyingDrafter(d.target, d.head, d.draft_to_target, d.aux_layer_ids, d.embed))
    s = SpecSettings(k=2, temperature=1.0, max_new_tokens=2, seed=77)
    with torch.inference_mode():
        exact = exact_two_token_distribution(liar, s, PROMPT)
    # 500 draws: the liar's p was below 1e-36 at that count over three seeds, far past 1e-3
    assert chi_square_p_value(sample_two_tokens(liar, s, Faults(), 500, PROMPT), exact) < 1e-3


def test_a_token_outside_the_draft_vocabulary_has_q_zero_and_is_never_drafted(pair):
    s = SpecSettings(k=3, temperature=2.0, max_new_tokens=60, seed=5)
    state = start_run(pair, PROMPT, s)
    gen = torch.Generator().manual_seed(s.seed)
    texts, cycle, drafted, emitted = TokenTexts(pair.target.tokenizer), 0, [], []
    while not state.finished:
        proposal = pair.drafter.propose(state.draft_state, state.committed, s.k, s, gen)
        assert proposal.p_draft[:, LEFT_OUT].sum() == 0  # exactly zero: never drawn, never credited
        assert torch.allclose(proposal.p_draft.sum(-1), torch.ones(s.k), atol=1e-5)
        pair.drafter.roll_back(state.draft_state, state.committed)  # undo the look; the cycle drafts again
        rec = run_cycle(pair, state, s, gen, cycle, texts)
        drafted += rec["draft_token_ids"]
        emitted += rec["committed_token_ids"]
        cycle += 1
    assert not set(drafted) & set(LEFT_OUT)
    assert set(emitted) & set(LEFT_OUT)  # the target still emits them (as the residual's or bonus token)


def test_diagnosis_counts_the_output_the_head_can_never_draft(pair, tmp_path):
    from collections import Counter

    from engine.diagnose.vocab import coverage, draft_vocab
    from engine.workload.requests import RequestRun

    assert draft_vocab(pair.drafter) == set(KEPT)
    assert draft_vocab(prompt_lookup_drafter(pair.target)) is None  # no vocabulary of its own
    out = tmp_path / "t.jsonl"
    run_to_trace(pair, "the cat sat", SpecSettings(k=3, temperature=2.0, max_new_tokens=60, seed=5), out)
    trace = load_trace(out)
    generated = trace.summary["generated_token_ids"]
    missed = Counter(t for t in generated if t in LEFT_OUT)
    assert missed  # at this temperature the target emits some of them
    c = coverage(set(KEPT), [RequestRun("r", "c", out.name, trace)], lambda t: f"<{t}>")
    assert (c["tokens"], c["outside"], c["draft_vocab_size"]) == (len(generated), sum(missed.values()), len(KEPT))
    assert c["outside_share"] == sum(missed.values()) / len(generated)
    assert [(m["token_id"], m["count"]) for m in c["most_missed"]] == missed.most_common(5)
    assert c["most_missed"][0]["text"] == f"<{c['most_missed'][0]['token_id']}>"


def prompt_lookup_drafter(target):
    from engine.drafters.registry import DrafterOptions, build_drafter

    return build_drafter(target, DrafterOptions("prompt-lookup"), lambda folder: None)


# ---------------------------------------------------------------- the head's cache

def close_to_scale(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to float32 rounding relative to the tensor's largest entry: the random 6-layer target's hidden
    states reach |140|, and kernels over other batch shapes sum in another order, so an entry near 0 can differ
    by ~1e-4 (1e-6 of 140 per rounding, over sums of 64-192 terms); a wrong position or token differs by O(1)."""
    return bool((a - b).abs().max() <= 4e-6 * b.abs().max() + 1e-6)


def assert_head_is_a_fresh_start(drafter: Eagle3Drafter, state, committed: list[int]) -> None:
    """The head holds committed - 1 entries built from the target's features only, and the output that gives
    the next draft token: exactly what starting afresh on the committed sequence builds."""
    assert drafter.cache_len(state) == len(committed) - 1 == state.features.shape[0]
    fresh = drafter.start(committed)  # runs the target afresh over the committed tokens
    assert close_to_scale(state.features, fresh.features)
    assert close_to_scale(state.last_hidden, fresh.last_hidden)
    for ours, theirs in zip(attended_kv(state.cache), attended_kv(fresh.cache), strict=True):
        for a, b in zip(ours, theirs):
            assert a.shape == b.shape
            assert close_to_scale(a, b)


@pytest.mark.parametrize("temperature", [0.0, 1.5])
def test_head_cache_holds_exactly_the_committed_sequence_after_every_cycle(pair, temperature):
    s = SpecSettings(k=4, temperature=temperature, max_new_tokens=40, seed=3)
    gen = torch.Generator().manual_seed(s.seed)
    state = start_run(pair, PROMPT, s)
    texts, cycle, accepted = TokenTexts(pair.target.tokenizer), 0, set()
    while not state.finished:
        n_before = len(state.committed)
        rec = run_cycle(pair, state, s, gen, cycle, texts)
        d = rec["draft_cache_len"]
        assert d["before"] == n_before - 1 and d["after_append"] == d["before"] + 3  # step 1 reads the last entry
        assert d["after_rollback"] == len(state.committed) - 1 and rec["draft_catch_up"]
        assert state.draft_state.last_fed == list(range(n_before - 1, len(state.committed) - 1))
        assert rec["drafter_state"] == {"kind": "eagle3", "feature_sources": ["target", "head", "head", "head"],
                                        "first_feature_position": n_before - 2}
        assert_head_is_a_fresh_start(pair.drafter, state.draft_state, state.committed)
        accepted.add(rec["num_accepted"])
        cycle += 1
    assert accepted - {0}  # some cycles kept draft tokens, so the catch-up fed more than one entry


def test_a_one_token_prompt_is_refused(pair):
    with pytest.raises(SettingsError, match="at least two tokens"):
        pair.drafter.start([3])


# ---------------------------------------------------------------- the head against a hand-written reference

def rms_norm(x, weight, eps):
    return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rope(x, positions, theta):
    """x (heads, T, d): rotate pairs (i, i + d/2) by position x inverse frequency (Llama's layout)."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2).double() / d)
    angles = positions[:, None].double() * inv_freq[None]  # (T, d/2)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * sin


def reference_outputs(w: dict, cfg: dict, embeds: torch.Tensor, fused: torch.Tensor) -> torch.Tensor:
    """The speculators/vLLM layer from the definitions, in float64, over T entries at positions 0..T-1:
    (T, H) embeddings of x_{t+1} and (T, H) fused hiddens g_t -> (T, H) pre-norm outputs."""
    T, H = embeds.shape
    nh, nkv, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["rms_norm_eps"]
    hd = cfg["head_dim"]
    pre = "layers.0."
    x = torch.cat([rms_norm(embeds, w[pre + "input_layernorm.weight"], eps),
                   rms_norm(fused, w[pre + "hidden_norm.weight"], eps)], -1)  # (T, 2H)
    q = (x @ w[pre + "self_attn.q_proj.weight"].T).view(T, nh, hd).transpose(0, 1)
    k = (x @ w[pre + "self_attn.k_proj.weight"].T).view(T, nkv, hd).transpose(0, 1)
    v = (x @ w[pre + "self_attn.v_proj.weight"].T).view(T, nkv, hd).transpose(0, 1)
    pos = torch.arange(T)
    q, k = rope(q, pos, cfg["rope_theta"]), rope(k, pos, cfg["rope_theta"])
    k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(hd)).masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1),
                                                                   float("-inf"))
    h = fused + (torch.softmax(scores, -1) @ v).transpose(0, 1).reshape(T, nh * hd) @ w[pre + "self_attn.o_proj.weight"].T
    m = rms_norm(h, w[pre + "post_attention_layernorm.weight"], eps)
    silu = torch.nn.functional.silu(m @ w[pre + "mlp.gate_proj.weight"].T)
    return h + (silu * (m @ w[pre + "mlp.up_proj.weight"].T)) @ w[pre + "mlp.down_proj.weight"].T


def reference_q(w: dict, cfg: dict, hidden: torch.Tensor, temperature: float) -> torch.Tensor:
    """(H,) output hidden -> (V_target,) q: norm, lm_head over the draft vocabulary, d2t to target ids."""
    logits = rms_norm(hidden, w["norm.weight"], cfg["rms_norm_eps"]) @ w["lm_head.weight"].T / temperature
    q = torch.zeros(cfg["vocab_size"], dtype=torch.double)
    q[torch.arange(len(w["d2t"])) + w["d2t"]] = torch.softmax(logits, -1)
    return q


def test_two_draft_steps_match_a_hand_written_reference(target, tmp_path):
    """Target hidden states in, q out, from the folder's own weights: step 1 reads the entries built from the
    target's fused layers 2, 3, 5; step 2 reads the head's own output hidden in place of fc(...)."""
    folder = random_head_folder(target, tmp_path / "h", seed=7, scale=0.2)
    # the target's hidden states reach |100|: fc scaled down so its output does not swamp the layer's updates
    edit_weights(folder, lambda w: w.update({"fc.weight": w["fc.weight"] * 0.01}))
    drafter = load_eagle3(folder, target)
    w = {k: (v.double() if v.dtype.is_floating_point else v) for k, v in load_file(str(folder / "model.safetensors")).items()}
    cfg = json.loads((folder / "config.json").read_text())["transformer_layer_config"]
    committed = [1, 2, 4, 6, 7, 3]
    s = SpecSettings(k=2, temperature=0.2)  # sharp enough that the two steps' q differ visibly
    proposal = drafter.propose(drafter.start(committed), committed, 2, s, torch.Generator().manual_seed(0))
    with torch.inference_mode():
        hs = target.model(torch.tensor([committed]), output_hidden_states=True).hidden_states
    aux = torch.cat([hs[2][0], hs[3][0], hs[5][0]], -1).double()[:-1]  # (5, 3H): positions 0..4
    emb = target.model.model.embed_tokens.weight.double()
    fused = aux @ w["fc.weight"].T  # g_0..g_4
    tokens = committed[1:]  # entry t reads x_{t+1}
    out = reference_outputs(w, cfg, emb[tokens], fused)
    q1 = reference_q(w, cfg, out[-1], 0.2)
    d1 = proposal.token_ids[0]
    out2 = reference_outputs(w, cfg, emb[tokens + [d1]], torch.cat([fused, out[-1:]]))  # step 2: (d_1, own hidden)
    q2 = reference_q(w, cfg, out2[-1], 0.2)
    # float32 engine against float64 definitions over a 64-wide layer: equal to ~1e-6
    assert torch.allclose(proposal.p_draft[0].double(), q1, atol=1e-5)
    assert torch.allclose(proposal.p_draft[1].double(), q2, atol=1e-5)
    assert (q1 - q2).abs().max() > 0.01  # step 2 really read something else
    assert q1[LEFT_OUT].sum() == 0 and q1.max() < 0.9  # d2t placed q on the draft vocabulary, not one-hot


def test_training_time_test_steps_are_the_engines_draft_steps(target, tmp_path):
    """scripts/train_eagle3_head.py's unrolled steps 1..3 at chain t are what a cycle's draft steps compute
    from a cache of true entries 0..t: otherwise the training-time test trains for a situation that never occurs."""
    ts = importlib.import_module("scripts.train_eagle3_head")
    folder = random_head_folder(target, tmp_path / "h", seed=7, scale=0.2)
    edit_weights(folder, lambda w: w.update({"fc.weight": w["fc.weight"] * 0.01}))
    drafter = load_eagle3(folder, target)
    seq = [1, 2, 4, 6, 7, 3, 9, 12, 5]
    with torch.inference_mode():
        _, aux = target.forward_with_features(seq[:-1], target.new_cache(), drafter.feature_layers)  # (N-1, 3H)
    with torch.no_grad():
        outs = ts.unrolled(drafter.head, drafter.embed, torch.tensor([seq]), aux[None], 3)
    n = 5  # committed seq[:5]: the head holds entries 0..3, chain t = 3 drafts next
    state = drafter.start(seq[:n])
    h1 = state.last_hidden  # step 1: the output of entry n - 2
    h2 = drafter.feed(state, n - 1, [seq[n]], h1)  # step 2 fed x_n (teacher forced) with its own hidden
    h3 = drafter.feed(state, n, [seq[n + 1]], h2)
    for j, engine in enumerate((h1, h2, h3)):
        assert close_to_scale(outs[j][0, n - 2], engine[0]), f"step {j + 1}"
    assert (outs[1][0, n - 2] - outs[0][0, n - 1]).abs().max() > 1e-2  # step 2 differs from step 1 at the same slot


# ---------------------------------------------------------------- trace, layouts and the CLI

def test_trace_records_the_kind_and_loads(pair, tmp_path):
    s = SpecSettings(k=3, temperature=1.0, max_new_tokens=20, seed=2)
    run_to_trace(pair, "the cat sat on a mat", s, tmp_path / "t.jsonl", chat_template=False)
    trace = load_trace(tmp_path / "t.jsonl")
    assert trace.drafter_kind == "eagle3" and trace.header["draft"]["architecture"].startswith("Eagle3Head")
    assert trace.header["drafter"]["aux_layer_ids"] == [2, 3, 5]
    assert_self_consistent(trace)


@pytest.mark.parametrize("field, value, message", [
    ("draft_catch_up", False, "draft_catch_up"),
    ("draft_cache_len.after_append", 99, "after_append"),
    ("drafter_state.feature_sources", ["target", "target", "head"], "feature_sources"),
    ("drafter_state", None, "drafter_state"),
])
def test_the_loader_refuses_an_eagle3_trace_that_breaks_the_head_s_rules(pair, tmp_path, field, value, message):
    s = SpecSettings(k=3, temperature=0, max_new_tokens=12)
    run_to_trace(pair, "the cat sat on a mat", s, tmp_path / "t.jsonl", chat_template=False)
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    record = json.loads(lines[2])  # the header, then cycle 0, then cycle 1
    *path, last = field.split(".")
    target_dict = record
    for part in path:
        target_dict = target_dict[part]
    if value is None:
        del target_dict[last]
    else:
        target_dict[last] = value
    lines[2] = json.dumps(record)
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=message):
        load_trace(tmp_path / "bad.jsonl")


@pytest.mark.parametrize("layout", ["static", "paged"])
def test_head_cache_in_other_layouts_greedy_equal_and_trace_loads(pair, layout, tmp_path):
    s = SpecSettings(k=4, temperature=0, max_new_tokens=30, cache_layout=layout, block_size=4)
    tokens = [t for r in speculative_generate(pair, PROMPT, s) for t in r["committed_token_ids"]]
    assert tokens == target_generate(pair.target, PROMPT, s, set())
    run_to_trace(pair, "the cat sat on a mat", s, tmp_path / "t.jsonl", chat_template=False)
    trace = load_trace(tmp_path / "t.jsonl")
    assert trace.header["cache_layout"]["name"] == layout
    assert_self_consistent(trace)


def test_cli_runs_the_eagle3_drafter(target, head_dir, tmp_path):
    target.model.save_pretrained(tmp_path / "target")
    target.tokenizer.save_pretrained(tmp_path / "target")
    out = tmp_path / "cli.jsonl"
    rc = main(["run", "--target", str(tmp_path / "target"), "--drafter", "eagle3", "--draft", str(head_dir),
               "--prompt", "the cat sat", "--k", "3", "--max-new-tokens", "12", "--temperature", "0",
               "--out", str(out), "--device", "cpu"])
    assert rc in (0, None)
    trace = load_trace(out)
    assert trace.drafter_kind == "eagle3" and trace.header["draft"]["name"] == "head"
    spec = [t for c in trace.cycles for t in c["committed_token_ids"]]
    s = SpecSettings(k=3, temperature=0, max_new_tokens=12)
    assert spec == target_generate(target, trace.header["prompt_token_ids"], s, set())[: len(spec)]


def test_tree_mode_refuses_the_eagle3_head(pair):
    from engine.tree.cycle import tree_proposer
    with pytest.raises(SettingsError, match="eagle3 drafter proposes chains only"):
        tree_proposer(pair)


def test_calibration_times_a_head_pass_not_the_read_out(pair):
    """engine/stats/calibrate.py times the head's second step (a head pass); its first only reads out the
    catch-up's output, so timing it would make the head look almost free."""
    from engine.stats.calibrate import time_drafter_step

    calls = []

    class Counting(Eagle3Drafter):
        def propose(self, state, committed, k, s, gen):
            calls.append(k)
            return super().propose(state, committed, k, s, gen)

    d = pair.drafter
    counting = Pair(pair.target, None, set(), Counting(d.target, d.head, d.draft_to_target, d.aux_layer_ids, d.embed))
    assert time_drafter_step(counting, PROMPT + [3, 9], SpecSettings(k=3, temperature=0), 2) > 0
    assert set(calls) == {2}


# ---------------------------------------------------------------- the app

@pytest.mark.parametrize("view", ["views/stepper.py", "views/walkthrough.py", "views/statistics.py"])
def test_the_app_pages_draw_an_eagle3_trace(pair, tmp_path, monkeypatch, view):
    from streamlit.testing.v1 import AppTest

    (tmp_path / "traces").mkdir()
    s = SpecSettings(k=3, temperature=1.0, max_new_tokens=16, seed=2)
    run_to_trace(pair, "the cat sat on a mat", s, tmp_path / "traces" / "eagle3.jsonl", chat_template=False)
    monkeypatch.setenv("SPECLAB_TRACES_DIR", str(tmp_path / "traces"))
    monkeypatch.setenv("SPECLAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("SPECLAB_TRACE", raising=False)
    for stage in (1, 3, 5):
        at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app" / "main.py"), default_timeout=120)
        at.query_params.update({"trace": "bundled:eagle3.jsonl", "cycle": "1", "stage": str(stage)})
        at.run()
        if view != "views/stepper.py":
            at.switch_page(view).run()
        assert not at.exception, [e.value for e in at.exception]
        assert not at.error, [e.value for e in at.error]


# ---------------------------------------------------------------- the shipped chat head

def test_the_chat_preset_ships_a_small_half_precision_speculators_head_with_the_eagle1_vocabulary():
    from safetensors import safe_open

    from engine.drafters import speculators_format as fmt
    from engine.drafters.registry import DrafterOptions, with_shipped_draft
    from engine.models.presets import PRESETS

    root = Path(__file__).resolve().parent.parent / "assets" / "models"
    folder = root / "chat-eagle3"
    options, shipped = with_shipped_draft(PRESETS["chat"], DrafterOptions("eagle3"))
    assert shipped.name == "assets/models/chat-eagle3" and Path(options.draft_model) == folder
    assert (folder / "model.safetensors").stat().st_size <= 32 * 2**20  # float16; the 17,812-row lm_head is 20 MB
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys() if k not in ("d2t", "t2d")} == {torch.float16}
    spec = fmt.read_spec(folder)
    assert (spec.target_hidden_size, spec.target_vocab_size, spec.aux_layer_ids) == (576, 49152, [2, 15, 27])
    weights = fmt.read_weights(folder, spec)
    kept = json.loads((root / "chat-eagle" / "draft_vocab.json").read_text())["kept_token_ids"]
    assert fmt.check_vocab_maps(folder, weights["d2t"], weights["t2d"], 49152).tolist() == sorted(kept)
    info = json.loads((folder / "training.json").read_text())
    m = info["measurements"]
    assert 0 < m["greedy_agreement"] < 1 and 0 < m["alpha_temperature_1"] < 1
    assert info["data"]["train_answer_tokens"] > 0 and info["training"]["curve"] and info["training"]["ttt_steps"] == 3


def test_the_warm_start_makes_step_one_the_target_s_next_layer(tmp_path):
    """scripts/train_eagle3_head.py's warm start: fc picks the deepest aux state and the head's layer is the
    target's following layer, so step 1's output is the target's hidden state one layer deeper, position by
    position (same RoPE positions, same causal attention over the head's own entries)."""
    ts = importlib.import_module("scripts.train_eagle3_head")
    target = tiny_target()
    aux = [1, 2, 3]  # the next layer's output is hidden state 4, still before the final norm in HF's list
    spec = spec_for(target, list(range(16)), aux)
    head = new_head(spec)
    ts.warm_start(head, target.model, torch.arange(16), aux)
    save_eagle3(tmp_path / "h", head, spec, list(range(16)), dtype=torch.float32)
    drafter = load_eagle3(tmp_path / "h", target)
    seq = [1, 2, 4, 6, 7, 3, 9]
    state = drafter.start(seq)  # entries 0..5 from the target's hidden states after layers 1, 2, 3
    with torch.inference_mode():
        hs = target.model(torch.tensor([seq]), output_hidden_states=True).hidden_states
    assert close_to_scale(state.last_hidden[0], hs[4][0, len(seq) - 2])
