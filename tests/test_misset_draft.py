"""A draft model run deliberately mis-set (engine/drafters/model.py): it reads the prompt without the
chat template the target reads (draft_prompt "raw"), or ignores the request's top-k/top-p (draft_filters
"temperature only"). Both must stay exact and only lower acceptance; their traces must say what the
draft did, record the draft's real cache lengths, and load; a tampered one must be refused."""
import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from engine.cli import main
from engine.config import SettingsError, SpecSettings
from engine.cycle import driver
from engine.cycle.pair import Pair, TokenTexts
from engine.cycle.plain import target_generate
from engine.cycle.reference import ChainCycle, run_cycle
from engine.drafters.model import ModelDrafter
from engine.drafters.registry import DrafterOptions, options_from_header
from engine.mode import DEFAULT_MODE, RunMode
from engine.run import encode_prompt, load_with_drafter, pair_for_prompt, run_to_trace
from engine.trace import load_trace
from engine.trace.errors import TraceError
from engine.trace.schema import EAGLE, OTHER_TOKENIZER, PROMPT_LOOKUP
from tests.test_engine import assert_cache_matches_fresh_prefill
from tests.test_exactness import chi_square_p_value, exact_two_token_distribution
from tests.tiny import noisy_pair, save_tiny

# Words of the tiny vocabulary (tests/tiny.py WORDS), so the templated prompt is 11 tokens longer than the raw one.
TEMPLATE = ("{% for m in messages %}a cat sat on the mat and then {{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %} it ran far away{% endif %}")
PROMPT = "the dog slept on a log"
RAW = {"draft_prompt": "raw"}
TEMPERATURE_ONLY = {"draft_filters": "temperature only"}
VARIANTS = {"raw prompt": RAW, "temperature only": TEMPERATURE_ONLY, "both": RAW | TEMPERATURE_ONLY}


def templated_pair(seed: int = 1, noise: float = 0.01, **variant) -> Pair:
    """A draft close to its target (high acceptance when set right), whose tokenizer has a chat template."""
    pair = noisy_pair(seed, noise=noise)
    pair.target.tokenizer.chat_template = TEMPLATE  # one tokenizer object: the draft's too
    return Pair(pair.target, pair.draft, set(), ModelDrafter(pair.draft, **variant))


def prompts(pair: Pair) -> tuple[list[int], list[int]]:
    """(the target's prompt ids with the template, the draft's without)."""
    tok = pair.target.tokenizer
    return encode_prompt(tok, PROMPT, True), encode_prompt(tok, PROMPT, False)


def run(pair: Pair, s: SpecSettings, out: Path, mode: RunMode = DEFAULT_MODE):
    run_to_trace(pair, PROMPT, s, out, mode)
    return load_trace(out)  # every check of the format, on the file as written


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[str, str]:
    """The pair as model folders (the tokenizer saves its chat template), for load_with_drafter."""
    return save_tiny(templated_pair(), tmp_path_factory.mktemp("models"))


# ---------------------------------------------------------------- the trace says what the draft did

@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_each_variant_writes_a_checked_trace_that_says_what_the_draft_did(variant, folders, tmp_path):
    target, draft = folders
    pair = load_with_drafter(target, DrafterOptions(draft_model=draft, **variant))
    s = SpecSettings(k=3, temperature=1.0, top_k=4, max_new_tokens=30, seed=2)
    trace = run(pair, s, tmp_path / "t.jsonl")
    templated, raw = prompts(pair)
    assert trace.header["chat_template"] and trace.header["prompt_token_ids"] == templated
    want = {"kind": "model"} | variant | ({"draft_prompt_token_ids": raw} if "draft_prompt" in variant else {})
    assert trace.header["drafter"] == want
    assert options_from_header(trace.header) == DrafterOptions(**variant)  # the app re-measures the same drafter
    offset = len(raw) - len(templated) if "draft_prompt" in variant else 0
    assert offset != 0 or "draft_prompt" not in variant  # the case shows an offset
    for c in trace.cycles:  # the draft's real lengths: its own prompt, then the tokens committed after it
        committed_after = c["committed_len_before"] + len(c["committed_token_ids"])
        d, t = c["draft_cache_len"], c["target_cache_len"]
        assert d["before"] == t["before"] + offset == c["committed_len_before"] - 1 + offset
        assert d["after_rollback"] == t["after_rollback"] + offset == committed_after - 1 + offset


def test_a_correct_run_s_header_stays_as_it_was(tmp_path):
    trace = run(templated_pair(), SpecSettings(k=2, temperature=0, max_new_tokens=8), tmp_path / "t.jsonl")
    assert trace.header["drafter"] == {"kind": "model"}


def test_without_a_chat_template_the_raw_prompt_is_the_target_s(tmp_path):
    pair = templated_pair(**RAW)
    trace = run_to_trace(pair, PROMPT, SpecSettings(k=2, temperature=0, max_new_tokens=8), tmp_path / "t.jsonl",
                         chat_template=False)
    assert trace.header["drafter"]["draft_prompt_token_ids"] == trace.header["prompt_token_ids"]
    for c in load_trace(tmp_path / "t.jsonl").cycles:  # no offset
        assert c["draft_cache_len"]["after_rollback"] == c["target_cache_len"]["after_rollback"]


def test_a_workload_binds_each_request_s_own_raw_prompt(tmp_path):
    """The diagnosis runs arms as workloads: each request's trace records its own raw rendering."""
    from engine.workload.prompts import Request
    from engine.workload.run import run_workload
    pair = templated_pair(**RAW)
    requests = [Request(1, "a", "c", prompt=PROMPT), Request(2, "b", "c", messages=(("user", "the cat ran"),))]
    workload = run_workload(pair, requests, SpecSettings(k=2, temperature=0, max_new_tokens=6), tmp_path / "w")
    assert workload.manifest["pair"]["drafter"] == {"kind": "model", "draft_prompt": "raw"}
    for r, run in zip(requests, workload.runs()):
        header = run.trace.header
        assert header["drafter"]["draft_prompt_token_ids"] == encode_prompt(pair.target.tokenizer, r.text, False)


# ---------------------------------------------------------------- the draft's cache, in its own coordinates

@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_draft_cache_holds_its_own_sequence_after_every_cycle(temperature):
    """Its own prompt, then every committed token after the target's prompt, but the last: K/V equal to a
    fresh prefill, through rejections and full accepts (the catch-up feeds d_K in its own coordinates)."""
    pair = templated_pair(**RAW)
    templated, raw = prompts(pair)
    pair = pair_for_prompt(pair, PROMPT, templated)
    s = SpecSettings(k=2, temperature=temperature, max_new_tokens=40, seed=5)
    state = driver.start(ChainCycle(pair, s), templated)
    assert state.draft_state.own_prompt == raw
    gen, texts = torch.Generator().manual_seed(s.seed), TokenTexts(pair.target.tokenizer)
    catch_ups = rejects = cycle = 0
    while not state.finished:
        rec = run_cycle(pair, state, s, gen, cycle, texts)
        catch_ups += rec["draft_catch_up"]
        rejects += rec["resampled_token_id"] is not None
        assert_cache_matches_fresh_prefill(pair.draft, state.draft_state.cache, raw + state.generated)
        cycle += 1
    assert catch_ups and rejects  # both rollbacks ran


@pytest.mark.parametrize("layout", ["static", "paged"])
def test_the_offset_draft_cache_in_static_and_paged_layouts(layout, tmp_path):
    """The layout states of the draft's cache agree with its own (shorter) lengths, as the loader checks."""
    s = SpecSettings(k=3, temperature=1.0, max_new_tokens=30, seed=4, cache_layout=layout, block_size=4)
    trace = run(templated_pair(**RAW), s, tmp_path / "t.jsonl")
    state = trace.cycles[-1]["draft_cache_layout_state"]["after_rollback"]
    length = trace.cycles[-1]["draft_cache_len"]["after_rollback"]
    assert state.get("write_position", state.get("num_tokens")) == length < trace.cycles[-1]["target_cache_len"]["after_rollback"]


def test_an_unbound_raw_drafter_is_refused_rather_than_reading_the_target_s_prompt():
    pair = templated_pair(**RAW)
    with pytest.raises(SettingsError, match="none is bound for this prompt"):
        driver.start(ChainCycle(pair, SpecSettings()), prompts(pair)[0])
    bound = pair_for_prompt(pair, PROMPT, prompts(pair)[0])
    with pytest.raises(SettingsError, match="none is bound for this prompt"):  # bound to another prompt
        driver.start(ChainCycle(bound, SpecSettings()), [1, 2, 3])


# ---------------------------------------------------------------- exact, and lower acceptance

@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_greedy_output_is_the_target_s_own_greedy_output(variant, tmp_path):
    pair = templated_pair(seed=2, noise=0.05, **variant)
    s = SpecSettings(k=3, temperature=0, max_new_tokens=40)
    trace = run(pair, s, tmp_path / "t.jsonl")
    assert trace.summary["generated_token_ids"] == target_generate(pair.target, prompts(pair)[0], s, set())


def acceptance(pair: Pair, s: SpecSettings, out: Path) -> tuple[float, list[int]]:
    trace = run(pair, s, out)
    return trace.summary["acceptance_rate"], trace.summary["generated_token_ids"]


def test_a_draft_ignoring_top_k_1_stays_exact_and_accepts_less(tmp_path):
    """top_k=1 makes the target one-hot at T=1, so an exact run must still emit the target's greedy tokens;
    a draft that samples its whole distribution proposes tokens outside the target's top-1 and is rejected."""
    s = SpecSettings(k=4, temperature=1.0, top_k=1, max_new_tokens=48, seed=3)
    pair = templated_pair()
    greedy = target_generate(pair.target, prompts(pair)[0], replace(s, temperature=0), set())
    right, tokens = acceptance(pair, s, tmp_path / "right.jsonl")
    wrong, wrong_tokens = acceptance(templated_pair(**TEMPERATURE_ONLY), s, tmp_path / "wrong.jsonl")
    both, both_tokens = acceptance(templated_pair(**RAW, **TEMPERATURE_ONLY), s, tmp_path / "both.jsonl")
    assert tokens == wrong_tokens == both_tokens == greedy
    assert right > 0.8 and wrong < right / 2 and both < right / 2, (right, wrong, both)  # measured 0.91, 0.17


def test_a_draft_reading_the_raw_prompt_accepts_less(tmp_path):
    """The draft agrees with the target when it reads the same templated prompt, much less without it."""
    s = SpecSettings(k=4, temperature=0, max_new_tokens=48)
    right, tokens = acceptance(templated_pair(), s, tmp_path / "right.jsonl")
    wrong, wrong_tokens = acceptance(templated_pair(**RAW), s, tmp_path / "wrong.jsonl")
    assert tokens == wrong_tokens
    assert right > 0.8 and wrong < right / 2, (right, wrong)  # measured 0.91 and 0.16


def test_both_variants_sample_the_target_s_two_token_law():
    """Chi-square on the first two tokens at T=1 with top-k 3: the draft reads the raw prompt and samples
    outside the top 3, yet the output follows the target's (warped) law."""
    pair = templated_pair(seed=0, noise=0.3, **RAW, **TEMPERATURE_ONLY)
    templated, _ = prompts(pair)
    pair = pair_for_prompt(pair, PROMPT, templated)
    s = SpecSettings(k=2, temperature=1.0, top_k=3, max_new_tokens=2, seed=11)
    counts = torch.zeros(pair.target.full_vocab_size, pair.target.full_vocab_size)
    base = driver.start(ChainCycle(pair, s), templated)
    gen, texts = torch.Generator().manual_seed(s.seed), TokenTexts(pair.target.tokenizer)
    outside = 0
    with torch.inference_mode():
        for i in range(2000):
            state = copy.deepcopy(base)
            while not state.finished:
                rec = run_cycle(pair, state, s, gen, 0, texts, record=i < 200)  # the first runs' records are read
                outside += sum(p == 0 for p in rec.get("p_target", []))
            counts[state.generated[0], state.generated[1]] += 1
        exact = exact_two_token_distribution(pair, s, templated)
    assert outside > 100  # the draft did propose tokens the request's top-k excludes
    p = chi_square_p_value(counts, exact)
    assert p > 0.01, f"a mis-set draft broke exactness, chi-square p={p:.2g}"


# ---------------------------------------------------------------- tampered traces are refused

@pytest.fixture(scope="module")
def raw_trace(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("raw") / "t.jsonl"
    run_to_trace(templated_pair(**RAW), PROMPT, SpecSettings(k=3, temperature=1.0, max_new_tokens=24, seed=1), out)
    return [json.loads(line) for line in out.read_text().splitlines()]


def refused(records: list[dict], tmp_path: Path, field: str) -> None:
    out = tmp_path / "tampered.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(TraceError, match=f"field '{field}'"):
        load_trace(out)


def test_the_untampered_trace_loads(raw_trace, tmp_path):
    out = tmp_path / "t.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in raw_trace))
    assert load_trace(out).header["drafter"]["draft_prompt"] == "raw"


def test_a_draft_prompt_inconsistent_with_the_cache_lengths_is_refused(raw_trace, tmp_path):
    records = copy.deepcopy(raw_trace)
    records[0]["drafter"]["draft_prompt_token_ids"].pop()  # an offset one off from the recorded caches
    refused(records, tmp_path, "draft_cache_len.before")


@pytest.mark.parametrize("moment", ["after_rollback", "before", "after_append"])
def test_a_changed_draft_cache_length_is_refused(raw_trace, tmp_path, moment):
    records = copy.deepcopy(raw_trace)
    records[3]["draft_cache_len"][moment] += 1
    refused(records, tmp_path, f"draft_cache_len.{moment}")


def test_a_header_hiding_the_offset_is_refused(raw_trace, tmp_path):
    """Without the draft's prompt the header claims a draft that read the target's: the caches disagree."""
    records = copy.deepcopy(raw_trace)
    del records[0]["drafter"]["draft_prompt"], records[0]["drafter"]["draft_prompt_token_ids"]
    refused(records, tmp_path, "draft_cache_len.before")


@pytest.mark.parametrize("change, field", [
    ({"draft_prompt_token_ids": None}, "drafter.draft_prompt_token_ids"),
    ({"draft_prompt_token_ids": []}, "drafter.draft_prompt_token_ids"),
    ({"draft_prompt_token_ids": [1, 99]}, r"drafter.draft_prompt_token_ids\[1\]"),
    ({"draft_prompt": "templated"}, "drafter.draft_prompt"),
    ({"draft_filters": "top-k only"}, "drafter.draft_filters"),
    ({"kind": PROMPT_LOOKUP, "min_ngram": 1, "max_ngram": 2}, "drafter.draft_prompt"),
])
def test_bad_header_entries_are_refused_by_name(raw_trace, tmp_path, change, field):
    records = copy.deepcopy(raw_trace)
    records[0]["drafter"] |= change
    refused(records, tmp_path, field)


def test_ids_that_differ_from_an_untemplated_target_prompt_are_refused(raw_trace, tmp_path):
    records = copy.deepcopy(raw_trace)
    records[0]["chat_template"] = False
    refused(records, tmp_path, "drafter.draft_prompt_token_ids")


def test_a_tree_or_fast_path_trace_cannot_claim_a_mis_set_draft(raw_trace, tmp_path):
    records = copy.deepcopy(raw_trace)
    records[0]["fast_path"] = {"capture": "none"}
    refused(records, tmp_path, "drafter.draft_prompt")


# ---------------------------------------------------------------- the options

@pytest.mark.parametrize("kind", [PROMPT_LOOKUP, OTHER_TOKENIZER, EAGLE])
@pytest.mark.parametrize("variant", [RAW, TEMPERATURE_ONLY])
def test_the_options_are_refused_for_other_drafters(kind, variant):
    with pytest.raises(SettingsError, match="--drafter model only"):
        DrafterOptions(kind, **variant)


@pytest.mark.parametrize("field, value", [("draft_prompt", "templated"), ("draft_prompt", None),
                                          ("draft_filters", "top-k only"), ("draft_filters", 1)])
def test_bad_values_are_refused(field, value):
    with pytest.raises(SettingsError, match=field):
        DrafterOptions(**{field: value})


def test_the_tree_and_the_fast_path_refuse_a_mis_set_draft(tmp_path):
    from engine.config import TreeSpec
    for mode in (RunMode(tree=TreeSpec("static", branching=(2, 1))), RunMode(fast="none")):
        with pytest.raises(SettingsError, match="reference chain only"):
            run_to_trace(templated_pair(**TEMPERATURE_ONLY), PROMPT, SpecSettings(), tmp_path / "t.jsonl", mode)
    assert not (tmp_path / "t.jsonl").exists()


def test_the_cli_runs_a_mis_set_draft(folders, tmp_path, capsys):
    target, draft = folders
    out = tmp_path / "cli.jsonl"
    rc = main(["run", "--target", target, "--draft", draft, "--draft-prompt", "raw", "--draft-filters",
               "temperature only", "--k", "2", "--prompt", PROMPT, "--temperature", "1", "--top-k", "2",
               "--max-new-tokens", "10", "--out", str(out)])
    assert rc == 0
    assert load_trace(out).header["drafter"]["draft_filters"] == "temperature only"
    with pytest.raises(SystemExit):
        main(["run", "--target", target, "--draft", draft, "--draft-prompt", "templated", "--prompt", PROMPT,
              "--out", str(tmp_path / "x.jsonl")])
    assert "invalid choice" in capsys.readouterr().err
