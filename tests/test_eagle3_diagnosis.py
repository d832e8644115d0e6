"""What the diagnosis knows about an EAGLE-3 head: the head run without its auxiliary states (mis-set on
purpose, --eagle3-features "top layer"), and the drafts it makes past the length it was trained on.

Same tiny 6-layer target and random speculators head as tests/test_eagle3.py.
"""
import json

import pytest
import torch

from engine.cli import main
from engine.config import SettingsError, SpecSettings, TreeSpec
from engine.cycle.pair import Pair
from engine.cycle.plain import target_generate
from engine.diagnose import experiments as ex
from engine.diagnose.diagnosis import trained_length_words
from engine.diagnose.trained_length import past_trained_length, trained_length_report
from engine.drafters import speculators_format as fmt
from engine.drafters.eagle3 import load_eagle3
from engine.drafters.registry import DrafterOptions, options_from_header
from engine.mode import RunMode
from engine.models.loading import ModelLoadError
from engine.run import run_to_trace
from engine.trace import TraceError, load_trace
from engine.trace.schema import DRAFT_MODEL, EAGLE3, EAGLE3_AUX, EAGLE3_TOP, PROMPT_LOOKUP
from engine.workload.requests import RequestRun
from tests.checks import assert_self_consistent
from tests.test_eagle3 import LAYERS, PROMPT, random_head_folder, tiny_target

GREEDY = SpecSettings(k=3, temperature=0, max_new_tokens=24)


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def head_dir(target, tmp_path_factory):
    return random_head_folder(target, tmp_path_factory.mktemp("eagle3-diagnosis") / "head")


@pytest.fixture(scope="module")
def top_pair(target, head_dir) -> Pair:
    return Pair(target, None, set(), load_eagle3(head_dir, target, EAGLE3_TOP))


# ---------------------------------------------------------------- the head without its auxiliary states

def test_a_top_layer_head_reads_the_last_layer_s_output_as_its_fused_state(target, top_pair, head_dir):
    drafter = top_pair.drafter
    state = drafter.start(PROMPT)
    top = target.fill_with_features(PROMPT[:-1], target.new_cache())  # (n-1, H) the last layer's output
    assert state.features.shape == top.shape == (len(PROMPT) - 1, target.model.config.hidden_size)
    assert torch.equal(state.features, top)
    assert drafter.feature_layers == (LAYERS,)
    # its first draft's q is the head run by hand over (x_{t+1}, top_t), with no fc between
    head = drafter.head
    with torch.inference_mode():
        out = head(drafter.embed(torch.tensor(PROMPT[1:]))[None], top[None], head.new_cache())[0]
        want = drafter.full_vocab_probs(out[-1:], GREEDY)
    got = drafter.propose(state, list(PROMPT), 1, GREEDY, torch.Generator()).p_draft[0]
    assert torch.allclose(got, want, atol=1e-6)  # the same ops on the same inputs, batched alike
    right = load_eagle3(head_dir, target)
    assert not torch.allclose(right.propose(right.start(PROMPT), list(PROMPT), 1, GREEDY, torch.Generator()).p_draft[0],
                              got, atol=1e-3)  # the correct head reads other states, so drafts from another q


def test_a_top_layer_head_stays_exact_and_its_trace_says_how_it_ran(target, top_pair, tmp_path):
    trace = run_to_trace(top_pair, "the cat sat on a mat", GREEDY, tmp_path / "t.jsonl", chat_template=False)
    committed = [t for c in trace.cycles for t in c["committed_token_ids"]]
    assert committed == target_generate(target, trace.header["prompt_token_ids"], GREEDY, set())
    loaded = load_trace(tmp_path / "t.jsonl")
    assert loaded.header["drafter"]["eagle3_features"] == EAGLE3_TOP
    assert options_from_header(loaded.header) == DrafterOptions(EAGLE3, eagle3_features=EAGLE3_TOP)
    assert_self_consistent(loaded)


@pytest.mark.parametrize("kind", [DRAFT_MODEL, PROMPT_LOOKUP])
def test_the_option_is_an_eagle3_head_s_only(kind):
    with pytest.raises(SettingsError, match="--drafter eagle3 only"):
        DrafterOptions(kind, eagle3_features=EAGLE3_TOP)
    with pytest.raises(SettingsError, match="eagle3_features"):
        DrafterOptions(EAGLE3, eagle3_features="middle layer")


def test_the_tree_and_the_fast_path_refuse_a_mis_set_head(top_pair, tmp_path):
    for mode in (RunMode(tree=TreeSpec("static", branching=(2, 1))), RunMode(fast="none")):
        with pytest.raises(SettingsError, match="reference chain only"):
            run_to_trace(top_pair, "the cat", GREEDY, tmp_path / "t.jsonl", mode)
    assert not (tmp_path / "t.jsonl").exists()


def test_a_head_narrower_than_the_target_cannot_read_its_top_state(target, tmp_path):
    folder = random_head_folder(target, tmp_path / "head")
    cfg = json.loads((folder / fmt.CONFIG_FILE).read_text())
    cfg["transformer_layer_config"]["hidden_size"] = 32  # a head half the target's width: fc maps 3 x 64 to 32
    (folder / fmt.CONFIG_FILE).write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="no engine could run this head that way"):
        load_eagle3(folder, target, EAGLE3_TOP)


@pytest.mark.parametrize("kind, value, message", [
    (EAGLE3, "middle layer", "must be one of"),
    (PROMPT_LOOKUP, EAGLE3_TOP, "only an EAGLE-3 head"),
])
def test_the_loader_refuses_a_header_with_a_wrong_eagle3_features(top_pair, tmp_path, kind, value, message):
    run_to_trace(top_pair, "the cat sat", GREEDY, tmp_path / "t.jsonl", chat_template=False)
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    header["drafter"] |= {"kind": kind, "eagle3_features": value, "min_ngram": 1, "max_ngram": 3}
    (tmp_path / "bad.jsonl").write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    with pytest.raises(TraceError, match=message):
        load_trace(tmp_path / "bad.jsonl")


def test_the_cli_runs_a_head_without_its_aux_states(target, head_dir, tmp_path):
    target.model.save_pretrained(tmp_path / "target")
    target.tokenizer.save_pretrained(tmp_path / "target")
    rc = main(["run", "--target", str(tmp_path / "target"), "--drafter", "eagle3", "--draft", str(head_dir),
               "--eagle3-features", "top layer", "--prompt", "the cat sat", "--k", "2", "--max-new-tokens", "8",
               "--temperature", "0", "--out", str(tmp_path / "cli.jsonl"), "--device", "cpu"])
    assert rc in (0, None)
    assert load_trace(tmp_path / "cli.jsonl").header["drafter"]["eagle3_features"] == EAGLE3_TOP


def test_the_diagnosis_plans_the_aux_states_experiment_for_an_eagle3_head_only():
    s = SpecSettings(k=3, temperature=0)
    for features, other in ((EAGLE3_AUX, EAGLE3_TOP), (EAGLE3_TOP, EAGLE3_AUX)):
        base = ex.Arm("baseline", DrafterOptions(EAGLE3, eagle3_features=features), s)
        e = ex.aux_states_experiment(base)
        assert e.kind == ex.CAUSE and e.arm.drafter == DrafterOptions(EAGLE3, eagle3_features=other)
        assert e.arm.settings == s and e.name in [p.name for p in ex.plan(base, has_template=True, has_eagle=False,
                                                                           prefix="", best_k=None)]
    skipped = ex.aux_states_experiment(ex.Arm("baseline", DrafterOptions(DRAFT_MODEL), s))
    assert skipped.arm is None and "EAGLE-3" in skipped.skipped


# ---------------------------------------------------------------- past the trained length

def test_the_trained_length_is_read_from_the_lab_s_record_or_refused(target, tmp_path):
    folder = random_head_folder(target, tmp_path / "head")
    assert fmt.read_trained_positions(folder) is None  # another tool's head: unknown
    (folder / fmt.TRAINING_FILE).write_text(json.dumps({"trained_positions": 9}))
    assert load_eagle3(folder, target).describe()["trained_positions"] == 9
    for bad in ("{not json", json.dumps({"trained_positions": "9"}), json.dumps({"trained_positions": 1})):
        (folder / fmt.TRAINING_FILE).write_text(bad)
        with pytest.raises(ModelLoadError, match=fmt.TRAINING_FILE):
            load_eagle3(folder, target)


def hand_count(trace, trained: int) -> dict:
    """Each draft token's 0-based position, counted token by token from the committed text."""
    counts = {"drafted_within": 0, "accepted_within": 0, "drafted_past": 0, "accepted_past": 0}
    text = list(trace.header["prompt_token_ids"])
    for c in trace.cycles:
        for i, _ in enumerate(c["draft_token_ids"]):
            position = len(text) + i  # draft i+1 would sit right after the text committed so far
            side = "past" if position >= trained else "within"
            counts[f"drafted_{side}"] += 1
            counts[f"accepted_{side}"] += i < c["num_accepted"]
        text += c["committed_token_ids"]
    return counts


def test_drafts_past_the_trained_length_are_counted_where_they_stand(target, head_dir, tmp_path):
    (head_dir / fmt.TRAINING_FILE).write_text(json.dumps({"trained_positions": 14}))
    try:
        pair = Pair(target, None, set(), load_eagle3(head_dir, target))
    finally:
        (head_dir / fmt.TRAINING_FILE).unlink()
    s = SpecSettings(k=3, temperature=2.0, max_new_tokens=30, seed=3)
    runs = [RequestRun(f"r{i}", "c", f"t{i}.jsonl", run_to_trace(pair, prompt, s, tmp_path / f"t{i}.jsonl",
                                                                    chat_template=False))
            for i, prompt in enumerate(["the cat sat on a mat", "a dog"])]
    assert runs[0].trace.header["draft"]["trained_positions"] == 14
    counts = past_trained_length(runs, 14)
    want = {k: sum(hand_count(r.trace, 14)[k] for r in runs) for k in hand_count(runs[0].trace, 14)}
    assert {k: counts[k] for k in want} == want
    assert counts["drafted_past"] > 0 and counts["drafted_within"] > 0  # both sides of 14 are drafted here
    assert counts["requests"] == 2 and counts["requests_past"] == 2
    report = trained_length_report({"baseline": runs, ex.CONTEXT: runs[:1]})
    assert report["trained_positions"] == 14 and set(report["arms"]) == {"baseline", ex.CONTEXT}
    words = trained_length_words(report)
    assert f"{counts['drafted_past']} of {counts['drafted_past'] + counts['drafted_within']} draft tokens past" in words
    # a head that does not say its length, or traces that disagree, give no report
    assert trained_length_report({"baseline": [RequestRun("x", "c", "x", run_to_trace(
        Pair(target, None, set(), load_eagle3(head_dir, target)), "a cat", s, tmp_path / "x.jsonl"))]}) is None


# ---------------------------------------------------------------- the stepper's words for an EAGLE-3 cycle

@pytest.mark.parametrize("features", [EAGLE3_AUX, EAGLE3_TOP])
def test_the_stage_captions_describe_the_eagle3_head_as_it_ran(target, head_dir, tmp_path, features):
    from app.figures.explain import stage_caption
    pair = Pair(target, None, set(), load_eagle3(head_dir, target, features))
    s = SpecSettings(k=3, temperature=2.0, max_new_tokens=30, seed=1)
    trace = run_to_trace(pair, "the cat sat on a mat", s, tmp_path / "t.jsonl", chat_template=False)
    from app.figures import caches
    from tests.test_figures import cache_positions
    head = trace.header["drafter"]
    committed = len(trace.header["prompt_token_ids"])
    assert {c["num_accepted"] for c in trace.cycles} >= {0, 3}  # rejections and full accepts both described
    for c in trace.cycles:
        k = len(c["draft_token_ids"])
        draft = stage_caption(c, k, 1, drafter=trace.drafter_kind, head=head)
        assert draft.startswith(f"The EAGLE-3 head proposes K={k} tokens") and "draft model" not in draft
        assert ("after layers 2, 3, 5" in draft) == (features == EAGLE3_AUX)
        assert ("last layer's output" in draft and "mis-set" in draft) == (features == EAGLE3_TOP)
        rollback = stage_caption(c, k, 5, drafter=trace.drafter_kind, head=head)
        committed += len(c["committed_token_ids"])
        d = c["draft_cache_len"]
        assert d["after_rollback"] == committed - 1  # the engine's head holds committed - 1 entries, as said
        assert f": {d['after_append']} → {d['after_rollback']}." in rollback
        # the catch-up feeds every newly committed token again: the accepted drafts and the resample or bonus
        # (fewer in a last cycle cut short by the token limit)
        assert f"takes the {len(c['committed_token_ids'])} newly committed token(s) again" in rollback
        # The KV strip draws the same: the head's own row, every newly committed position rebuilt (catch-up),
        # the rest of the appended entries rolled back, the committed prefix kept up to `before`
        seq = ["tok"] * max(d["after_append"], c["target_cache_len"]["after_append"])  # labels only
        cells = cache_positions(caches.cache_figure(c, 5, seq, trace.drafter_kind))
        assert cells.get((caches.HEAD3_CATCH_UP, "EAGLE-3 head"), []) == list(range(d["before"], d["after_rollback"]))
        assert cells.get(("rolled back", "EAGLE-3 head"), []) == list(range(d["after_rollback"], d["after_append"]))
        assert cells[("committed", "EAGLE-3 head")][-1] == d["before"] - 1
        assert "draft" not in {y for bar in caches.cache_figure(c, 1, seq, trace.drafter_kind).data
                               if bar.type == "bar" for y in bar.y}
