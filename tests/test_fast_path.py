"""The fast path (engine/cycle/fast.py) on the CPU: same tokens and records as the reference path,
caches consistent after every cycle, and no host read inside a cycle."""
import collections

import pytest
import torch

from engine.cli import main
from engine.config import SpecSettings
from engine.cycle import fast as fp
from engine.cycle import fast_sampling as fs
from engine.cycle.plain import target_generate
from engine.cycle.ratio_test import accept_reject
from engine.cycle.reference import speculative_generate
from engine.kv.layouts import attended_kv, check_invariants, layout_for_run, new_cache
from engine.kv.ops import prefill
from engine.mode import RunMode
from engine.models.sampling import sample
from engine.teaching.faults import Faults
from engine.trace import load_trace
from tests.tiny import noisy_pair, save_tiny, tiny_pair

TIMING = {"draft_time_s", "draft_step_times_s", "verify_time_s", "catch_up_time_s", "cycle_time_s"}
PROMPT = [1, 2, 3]


def tokens(records: list[dict]) -> list[int]:
    return [t for r in records for t in r["committed_token_ids"]]


def comparable(rec: dict) -> dict:
    """A record without its timings. The draft's stale-slot counts stay in: both paths feed the draft
    d_K only after a full accept, so its static cache is written slot for slot alike."""
    return {k: v for k, v in rec.items() if k not in TIMING}


@pytest.fixture(scope="module")
def pair():
    return noisy_pair(0, noise=0.3)  # acceptance neither 0 nor 1: rejections and bonus tokens both occur


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_fast_path_records_equal_the_reference_path(pair, k, temperature):
    s = SpecSettings(k=k, temperature=temperature, max_new_tokens=40, seed=3, cache_layout="static")
    ref = list(speculative_generate(pair, PROMPT, s))
    fast = list(fp.fast_generate(pair, PROMPT, s))
    assert [comparable(r) for r in fast] == [comparable(r) for r in ref]
    accepted = [r["num_accepted"] for r in ref]
    assert 0 in accepted or temperature == 0  # the comparison covered rejections ...
    assert any(0 < a for a in accepted)  # ... and acceptances
    dynamic = list(speculative_generate(pair, PROMPT, SpecSettings(k=k, temperature=temperature, max_new_tokens=40, seed=3)))
    assert tokens(fast) == tokens(dynamic)


def test_the_draft_is_fed_d_k_only_after_a_full_accept(pair):
    """A cycle runs K draft steps; the d_K step, and its time, come only where the draft needs d_K."""
    s = SpecSettings(k=2, temperature=0.0, max_new_tokens=60, seed=4, cache_layout="static")
    records = list(fp.fast_generate(pair, PROMPT, s))
    assert {len(r["draft_step_times_s"]) for r in records} == {2}
    caught_up = [r["draft_catch_up"] for r in records]
    assert any(caught_up) and not all(caught_up)
    assert all((r["catch_up_time_s"] > 0) == r["draft_catch_up"] for r in records)
    assert all(r["draft_catch_up"] == (r["num_accepted"] == 2 and len(r["committed_token_ids"]) == 3) for r in records)


def test_greedy_fast_path_is_plain_greedy_decoding(pair):
    s = SpecSettings(k=4, temperature=0.0, max_new_tokens=30, seed=0)
    assert tokens(list(fp.fast_generate(pair, PROMPT, s))) == target_generate(pair.target, PROMPT, s, set())


def test_top_k_top_p_and_eos_match_the_reference():
    pair = noisy_pair(1, noise=0.3, eos=True)
    for seed in range(4):
        s = SpecSettings(k=3, temperature=0.8, top_k=6, top_p=0.9, max_new_tokens=30, seed=seed, cache_layout="static")
        ref, fast = list(speculative_generate(pair, PROMPT, s)), list(fp.fast_generate(pair, PROMPT, s))
        assert [comparable(r) for r in fast] == [comparable(r) for r in ref]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_caches_hold_the_committed_sequence_after_every_cycle(pair, temperature):
    s = SpecSettings(k=4, temperature=temperature, max_new_tokens=30, seed=5, cache_layout="static")
    state = fp.start_fast_run(pair, PROMPT, s)
    texts = fp.TokenTexts(pair.target.tokenizer)
    cycle = 0
    while not state.finished:
        rec = fp.run_fast_cycle(pair, state, s, cycle, texts)
        keep = len(state.committed) - 1
        for name, cache in (("target", state.target_cache), ("draft", state.draft_cache)):
            check_invariants(cache)
            assert int(cache.get_seq_length()) == keep == rec[f"{name}_cache_len"]["after_rollback"]
            assert cache.stale_slots() == rec[f"{name}_cache_layout_state"]["after_rollback"]["stale_slots"]
        cycle += 1
    for model, cache in ((pair.target, state.target_cache), (pair.draft, state.draft_cache)):
        fresh = prefill(model, state.committed, new_cache(layout_for_run(s, len(PROMPT)), model.model.config))
        for (k_run, v_run), (k_new, v_new) in zip(attended_kv(cache), attended_kv(fresh)):
            assert torch.allclose(k_run, k_new, atol=1e-5) and torch.allclose(v_run, v_new, atol=1e-5)


HOST_READS = ("item", "tolist", "__int__", "__float__", "__bool__", "__index__", "cpu", "numpy")


def test_a_cycle_reads_nothing_back_to_the_host(pair, monkeypatch):
    """From the start of a cycle's device work to its one copy (draft, verify, test, rollback,
    trace tensors) no tensor is read by the host; the host work after the copy is not counted."""
    calls, counting, cycles = collections.Counter(), [False], []
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def spy(self, *a, _n=name, _o=original, **kw):
            if counting[0]:
                calls.update([_n])
            return _o(self, *a, **kw)
        monkeypatch.setattr(torch.Tensor, name, spy)
    device_cycle, copy_to_host = fp.device_cycle, fp.copy_to_host
    monkeypatch.setattr(fp, "device_cycle", lambda *a: (counting.__setitem__(0, True), device_cycle(*a))[1])
    monkeypatch.setattr(fp, "copy_to_host", lambda t: (counting.__setitem__(0, False), cycles.append(1), copy_to_host(t))[2])
    recs = list(fp.fast_generate(pair, PROMPT, SpecSettings(k=4, temperature=1.0, max_new_tokens=20, seed=3)))
    assert len(cycles) == len(recs) > 1 and calls == {}
    counting[0] = True
    torch.zeros(2).tolist()  # the spies do count a read when one happens
    assert calls == {"tolist": 1}


def test_the_one_copy_is_the_only_sync_per_cycle(pair, monkeypatch):
    copies = []
    original = fp.copy_to_host
    monkeypatch.setattr(fp, "copy_to_host", lambda t: (copies.append(1), original(t))[1])
    for record in (True, False):
        copies.clear()
        recs = list(fp.fast_generate(pair, PROMPT, SpecSettings(k=3, temperature=1.0, max_new_tokens=25), record=record))
        assert len(copies) == len(recs) > 1


def test_sample_on_device_is_the_reference_inverse_cdf(monkeypatch):
    import engine.models.sampling
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        probs = torch.rand(12, generator=gen) * (torch.rand(12, generator=gen) > 0.4)
        probs[3] += 0.01  # at least one possible token
        probs = probs / probs.sum()
        for u in (0.0, 0.3, 0.99999994, float(torch.rand((), generator=gen))):
            monkeypatch.setattr(engine.models.sampling, "uniform", lambda g, _u=u: _u)
            ref = sample(probs, gen)
            assert int(fs.sample_on_device(probs, torch.tensor(u, dtype=torch.float32))) == ref
            assert probs[ref] > 0


def test_decision_on_hand_built_distributions_matches_accept_reject():
    gen = torch.Generator().manual_seed(1)
    for trial in range(40):
        k, v = 4, 7
        p_draft = torch.softmax(torch.randn(k, v, generator=gen) * 2, -1)
        p_target = torch.softmax(torch.randn(k + 1, v, generator=gen) * 2, -1)
        draft_tokens = [int(torch.multinomial(p_draft[i], 1, generator=gen)) for i in range(k)]
        ref = accept_reject(draft_tokens, p_draft, p_target, torch.Generator().manual_seed(trial))
        u = torch.rand(2 * k + 1, generator=torch.Generator().manual_seed(trial))
        d = fp.decide_on_device(torch.tensor(draft_tokens), p_draft, p_target, u, 0)
        assert int(d.num_accepted) == ref.num_accepted and int(d.next_token) == ref.next_token_id
        assert d.accept_prob.tolist() == ref.accept_prob
        assert int(d.draws_used) == len(ref.u) + 1


def test_fast_plain_decoding_equals_target_generate(pair):
    for temperature in (0.0, 1.0):
        s = SpecSettings(k=1, temperature=temperature, max_new_tokens=25, seed=7)
        assert fp.fast_plain_decode(pair.target, PROMPT, s, set()) == target_generate(pair.target, PROMPT, s, set())
    eos_pair = tiny_pair(2, eos=True)
    s = SpecSettings(k=1, temperature=1.0, max_new_tokens=60, seed=1)
    assert fp.fast_plain_decode(eos_pair.target, PROMPT, s, {0}) == target_generate(eos_pair.target, PROMPT, s, {0})


def test_plan_on_the_cpu_falls_back_to_eager_and_says_why():
    plan = fp.plan_fast_path(torch.device("cpu"))
    assert plan.capture == "none" and "no CUDA device" in plan.message
    with pytest.raises(ValueError, match="needs a CUDA device"):
        fp.plan_fast_path(torch.device("cpu"), "graph")
    assert fp.plan_fast_path(torch.device("cuda")).capture == "graph"


def test_fast_path_refuses_teaching_faults(pair, tmp_path):
    from engine.run import run_to_trace
    with pytest.raises(ValueError, match="teaching faults"):
        run_to_trace(pair, "the cat", SpecSettings(k=2), tmp_path / "t.jsonl",
                     RunMode(fast="none", faults=Faults(keep_rejected_kv=True)))


def test_cli_fast_on_the_cpu_prints_the_fallback_and_writes_a_valid_trace(tmp_path, capsys):
    folders = save_tiny(noisy_pair(0, noise=0.3), tmp_path)
    out = tmp_path / "fast.jsonl"
    code = main(["run", "--prompt", "the cat sat", "--target", folders[0], "--draft", folders[1], "--k", "3",
                 "--max-new-tokens", "20", "--seed", "2", "--device", "cpu", "--fast", "--out", str(out)])
    assert code == 0
    assert "no CUDA device (cpu), so no CUDA graphs" in capsys.readouterr().err
    fast = load_trace(out)
    assert fast.header["fast_path"] == {"capture": "none"} and fast.header["cache_layout"]["name"] == "static"
    ref_out = tmp_path / "ref.jsonl"
    main(["run", "--prompt", "the cat sat", "--target", folders[0], "--draft", folders[1], "--k", "3",
          "--max-new-tokens", "20", "--seed", "2", "--device", "cpu", "--cache", "static", "--out", str(ref_out)])
    ref = load_trace(ref_out)
    assert [comparable(c) for c in fast.cycles] == [comparable(c) for c in ref.cycles]
    assert fast.summary["generated_token_ids"] == ref.summary["generated_token_ids"]
    capsys.readouterr()
    assert main(["stats", str(out)]) == 0 and "draft acceptance rate" in capsys.readouterr().out


def test_models_built_once_serve_later_runs(pair):
    s = SpecSettings(k=3, temperature=1.0, max_new_tokens=20, seed=4)
    models = fp.FastModels.empty(pair, 3, 64)
    for prompt in ([1, 2, 3], [5], [7, 8, 9, 10, 11]):
        reused = list(fp.fast_generate(pair, prompt, s, models=models))
        assert tokens(reused) == tokens(list(speculative_generate(pair, prompt, s)))
    with pytest.raises(ValueError, match="K=3"):
        list(fp.fast_generate(pair, PROMPT, SpecSettings(k=4), models=models))
    plain = fp.FastPlainModel.empty(pair.target, 64)
    for prompt in ([1, 2, 3], [5]):
        assert fp.fast_plain_decode(pair.target, prompt, s, set(), model=plain) == target_generate(pair.target, prompt, s, set())


def test_pruned_vocabulary_draft_gives_the_reference_records(tmp_path):
    """The chat preset's draft knows only part of the vocabulary; the fast path maps ids and
    scatters logits on the device the way engine/models/loading.py does."""
    import json

    from engine.models.loading import DRAFT_VOCAB_FILE
    from engine.run import load_pair
    from tests.tiny import WORDS, tiny_llama, tiny_tokenizer
    folders = save_tiny(tiny_pair(0), tmp_path)
    kept = [0, 1, 2, 3, 5, 8, 13]
    draft = tmp_path / "pruned"
    tiny_llama(4, 1, 16, vocab=len(kept) + 1).save_pretrained(draft)
    tiny_tokenizer().save_pretrained(draft)
    (draft / DRAFT_VOCAB_FILE).write_text(json.dumps(
        {"format": "speclab-draft-vocab", "version": 1, "full_vocab_size": len(WORDS), "kept_token_ids": kept}))
    pruned = load_pair(folders[0], str(draft), device="cpu")
    for temperature in (0.0, 1.0):
        s = SpecSettings(k=4, temperature=temperature, max_new_tokens=30, seed=3, cache_layout="static")
        ref, fast = list(speculative_generate(pruned, [4, 6, 9], s)), list(fp.fast_generate(pruned, [4, 6, 9], s))
        assert [comparable(r) for r in fast] == [comparable(r) for r in ref]
        assert {t for r in fast for t in r["draft_token_ids"]} <= set(kept)


def test_fast_path_refuses_a_drafter_without_a_draft_model(pair, tmp_path):
    from engine.cycle.pair import Pair
    from engine.drafters.prompt_lookup import PromptLookupDrafter
    from engine.run import run_to_trace
    lookup = Pair(pair.target, None, set(), PromptLookupDrafter(pair.target.full_vocab_size))
    with pytest.raises(ValueError, match="drafts with a draft model only"):
        run_to_trace(lookup, "the cat", SpecSettings(k=2), tmp_path / "t.jsonl", RunMode(fast="none"))
    assert not (tmp_path / "t.jsonl").exists()  # refused before anything was written
