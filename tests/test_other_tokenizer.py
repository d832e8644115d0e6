"""A draft with its own tokenizer: re-encoded proposals, greedy equal to the target, sampling refused."""
import copy

import pytest
import torch

from engine.cli import main
from engine.config import SettingsError, SpecSettings
from engine.cycle.pair import Pair, TokenTexts
from engine.cycle.plain import target_generate
from engine.cycle.reference import run_cycle, speculative_generate, start_run
from engine.drafters.other_tokenizer import OtherTokenizerDrafter
from engine.kv.ops import cache_len, prefill
from engine.models.loading import wrap_model
from engine.run import run_to_trace
from engine.trace import load_trace
from tests.checks import assert_self_consistent
from tests.test_engine import assert_cache_matches_fresh_prefill, layer_tensors
from tests.tiny import WORDS, tiny_llama, tiny_tokenizer

# The draft's words: the same strings under other ids, plus one the target does not know.
DRAFT_WORDS = ["<eos>"] + WORDS[1:][::-1] + ["bird"]
PROMPT_TEXT = "the cat sat on a mat and then it"


def relabelled_draft(target_model, noise: float, seed: int):
    """The target's weights moved to the draft's ids (plus noise): a draft that agrees often."""
    draft = tiny_llama(seed, 2, 32, vocab=len(DRAFT_WORDS))
    state = copy.deepcopy(target_model.state_dict())
    rows = torch.tensor([WORDS.index(w) if w in WORDS else 0 for w in DRAFT_WORDS])
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        state[name] = state[name][rows]
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for key in state:
            state[key] = state[key] + noise * torch.randn(state[key].shape, generator=gen)
    draft.load_state_dict(state)
    return draft.eval()


def other_tokenizer_pair(seed: int = 0, noise: float = 0.08, steps: int = 0) -> Pair:
    target_model = tiny_llama(seed, 2, 32)
    target = wrap_model("tiny-target", target_model, tiny_tokenizer())
    draft = wrap_model("tiny-other-draft", relabelled_draft(target_model, noise, seed + 3), tiny_tokenizer(DRAFT_WORDS))
    drafter = OtherTokenizerDrafter(draft, target.tokenizer, target.full_vocab_size, steps)
    return Pair(target, None, set(), drafter)


def prompt_ids(pair: Pair) -> list[int]:
    return pair.target.tokenizer(PROMPT_TEXT, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_equals_plain_target_decoding(k, seed):
    pair = other_tokenizer_pair(seed)
    ids = prompt_ids(pair)
    s = SpecSettings(k=k, temperature=0, max_new_tokens=30)
    records = list(speculative_generate(pair, ids, s))
    assert [t for r in records for t in r["committed_token_ids"]] == target_generate(pair.target, ids, s, pair.eos_ids)
    accepted = [r["num_accepted"] for r in records]
    assert max(accepted) >= 1  # the re-encoded proposals were kept, not only the target's own tokens
    if k > 1:
        assert min(a - len(r["draft_token_ids"]) for a, r in zip(accepted, records)) < 0  # and some rejected


def test_proposals_are_the_draft_text_re_encoded_with_the_target_tokenizer():
    pair = other_tokenizer_pair(0)
    ids = prompt_ids(pair)
    rec = next(speculative_generate(pair, ids, SpecSettings(k=4, temperature=0, max_new_tokens=5)))
    st = rec["drafter_state"]
    draft_tok, target_tok = pair.drafter.model.tokenizer, pair.target.tokenizer
    text = draft_tok.decode(st["draft_token_ids"])
    assert text.startswith(st["healed_fragment"])  # the re-predicted last committed token
    text = text[len(st["healed_fragment"]):]
    assert rec["draft_token_ids"] == target_tok(text, add_special_tokens=False)["input_ids"][:4]
    assert st["target_token_ids"] == rec["draft_token_ids"]
    # The same word has different ids in the two vocabularies: the mapping is real.
    assert draft_tok.convert_tokens_to_ids("cat") != target_tok.convert_tokens_to_ids("cat")
    assert st["draft_token_target_ends"] == sorted(st["draft_token_target_ends"])


def test_both_caches_hold_the_committed_text_after_every_cycle():
    pair = other_tokenizer_pair(1)
    ids = prompt_ids(pair)
    s = SpecSettings(k=4, temperature=0, max_new_tokens=30)
    gen = torch.Generator()
    state = start_run(pair, ids)
    texts = TokenTexts(pair.target.tokenizer)
    drafter = pair.drafter
    cycle = 0
    while not state.finished:
        rec = run_cycle(pair, state, s, gen, cycle, texts)
        assert_cache_matches_fresh_prefill(pair.target, state.target_cache, state.committed)
        draft_ids = drafter.draft_ids_of(drafter.text_of(state.committed))
        fresh = prefill(drafter.model, draft_ids[:-1])  # the draft's own convention: its tokens but the last two
        assert state.draft_state.cached == draft_ids[:-2]
        after_rollback = rec["drafter_state"]["draft_cache_len"]["after_rollback"]
        assert cache_len(state.draft_state.cache) == len(draft_ids) - 2 == after_rollback
        for (k, v), (fk, fv) in zip(layer_tensors(state.draft_state.cache), layer_tensors(fresh)):
            torch.testing.assert_close(k, fk, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(v, fv, rtol=1e-4, atol=1e-5)
        cycle += 1


def test_sampling_is_refused_with_the_reason():
    pair = other_tokenizer_pair(0)
    with pytest.raises(SettingsError, match="only greedy.*strings both vocabularies share"):
        next(speculative_generate(pair, prompt_ids(pair), SpecSettings(k=4, temperature=0.7)))


def test_trace_loads_and_checks(tmp_path):
    pair = other_tokenizer_pair(0)
    out = tmp_path / "ot.jsonl"
    run_to_trace(pair, PROMPT_TEXT, SpecSettings(k=4, temperature=0, max_new_tokens=20), out)
    trace = load_trace(out)
    assert trace.drafter_kind == "other-tokenizer" and trace.header["drafter"]["draft_vocab_size"] == len(DRAFT_WORDS)
    assert_self_consistent(trace)
    with pytest.raises(SettingsError, match="only greedy"):
        run_to_trace(pair, PROMPT_TEXT, SpecSettings(k=4, temperature=1.0), tmp_path / "refused.jsonl")
    assert not (tmp_path / "refused.jsonl").exists()  # refused before anything was written


# ---------------------------------------------------------------- the shipped pair

@pytest.fixture(scope="module")
def shakespeare_pair():
    from engine.drafters.registry import DrafterOptions
    from engine.run import load_preset
    return load_preset("tiny-shakespeare", "cpu", drafter=DrafterOptions("other-tokenizer"))


@pytest.mark.parametrize("k", [2, 6])
def test_shipped_bpe_draft_is_greedy_equal_to_the_byte_level_target(shakespeare_pair, k):
    pair = shakespeare_pair
    ids = list(pair.target.tokenizer("Romeo.\n", add_special_tokens=False)["input_ids"])
    s = SpecSettings(k=k, temperature=0, max_new_tokens=48)
    records = list(speculative_generate(pair, ids, s))
    assert [t for r in records for t in r["committed_token_ids"]] == target_generate(pair.target, ids, s, pair.eos_ids)
    assert any(r["num_accepted"] > 0 for r in records)
    # One BPE draft token stands for several target bytes somewhere in the run.
    assert any(e2 - e1 > 1 for r in records for e1, e2 in zip([0] + r["drafter_state"]["draft_token_target_ends"],
                                                               r["drafter_state"]["draft_token_target_ends"]))


def test_cli_runs_the_other_tokenizer_preset_and_refuses_sampling(tmp_path, capsys):
    rc = main(["run", "--preset", "tiny-shakespeare", "--drafter", "other-tokenizer", "--temperature", "1",
               "--prompt", "Romeo.", "--out", str(tmp_path / "x.jsonl")])
    assert rc == 2 and "only greedy" in capsys.readouterr().err
    rc = main(["run", "--preset", "chat", "--drafter", "other-tokenizer", "--temperature", "0",
               "--prompt", "hi", "--out", str(tmp_path / "y.jsonl")])
    assert rc == 2 and "ships no draft with another tokenizer" in capsys.readouterr().err
