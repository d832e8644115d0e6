"""--decoder own on the run path: the engine's own Llama-family decoder (engine/models/llama.py)
computes the target's and the draft model's distributions, and the trace header says so per model.

Every comparison is a run of `python -m engine run` (engine.cli.main, in this process) with --decoder own
against the same command with --decoder hf, on tiny random Llama folders (tests/tiny.py save_tiny).

TOL: the two decoders sum the same float32 products in other blockings (fused q/k/v and gate/up
matrices, another attention kernel), so their probabilities differ by float32 rounding, about 1e-7
on these models (tests/test_llama_decoder.py prints the largest it sees); rounding differs in the
6th-7th significant digit between CPUs too (design.md, "CPU facts"). 1e-5 on a probability is far
above that and far below any real mistake (a wrong position, a missed mask slot or a skipped norm
moves these models' probabilities by 1e-2 or more).
"""
import json
import re

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine.cli import main
from engine.drafters.registry import DRAFTERS
from engine.mode import RunMode
from engine.models import llama
from engine.models.errors import OWN_DECODER_TP, ModelLoadError
from engine.models.loading import wrap_model
from engine.trace.format import TraceError, load_trace
from engine.trace.header_checks import DRAFTERS_WITH_MODEL
from engine.trace.schema import DECODER_OWN, WEIGHTS_INT4
from tests.tiny import WORDS, noisy_pair, save_tiny, tiny_llama, tiny_tokenizer

TOL = 1e-5  # max |dp| between the two decoders' p_target / p_draft of a drafted token (why: the module docstring)
PROMPT = "the cat sat on the"  # greedy: 24 tokens (12 distinct) in 14 cycles, 13 with a rejection
RUN = ["--k", "3", "--max-new-tokens", "24", "--device", "cpu", "--no-chat-template"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[str, str]:
    """Target and draft (the target plus weight noise: some drafts accepted, some rejected)."""
    return save_tiny(noisy_pair(3), tmp_path_factory.mktemp("models"))


@pytest.fixture
def own_calls(monkeypatch) -> list[int]:
    """Counts the own decoder's forwards (its packed twin is a LlamaDecoder too): proof that it ran."""
    calls: list[int] = []
    forward = llama.LlamaDecoder.forward

    def counted(self, *args, **kwargs):
        calls.append(1)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(llama.LlamaDecoder, "forward", counted)
    return calls


def run(target: str, draft: str | None, out, decoder: str, *extra: str) -> object:
    models = ["--target", target] + (["--draft", draft] if draft else [])
    code = main(["run", "--prompt", PROMPT, *models, *RUN, "--decoder", decoder, "--out", str(out), *extra])
    assert code == 0
    return load_trace(out)


def drafted_probs(trace, name: str) -> list[float]:
    return [p for c in trace.cycles for p in c[name]]


def committed(trace) -> list[int]:
    return [t for c in trace.cycles for t in c["committed_token_ids"]]


def assert_same_run(own, hf) -> None:
    """The same committed tokens, drafts and draws; p_target and p_draft of every draft within TOL."""
    assert committed(own) == committed(hf)
    assert [c["draft_token_ids"] for c in own.cycles] == [c["draft_token_ids"] for c in hf.cycles]
    assert [c["num_accepted"] for c in own.cycles] == [c["num_accepted"] for c in hf.cycles]
    for name in ("p_target", "p_draft"):
        ours, theirs = drafted_probs(own, name), drafted_probs(hf, name)
        assert len(ours) == len(theirs) > 0
        dp = max(abs(a - b) for a, b in zip(ours, theirs))
        assert dp <= TOL, f"{name}: max |dp| {dp:.2e}"


# ---------------------------------------------------------------- (a) greedy, (b) sampled

def test_greedy_own_decoder_run_equals_hf(folders, tmp_path, own_calls, capsys):
    hf = run(*folders, tmp_path / "hf.jsonl", "hf", "--temperature", "0")
    assert own_calls == []  # --decoder hf never runs the own decoder
    own = run(*folders, tmp_path / "own.jsonl", "own", "--temperature", "0")
    assert len(own_calls) > len(own.cycles)  # every cycle's draft steps and verify ran on it
    assert_same_run(own, hf)
    rejected = [c for c in hf.cycles if c["rejected_position"] is not None]
    assert rejected and len(rejected) < len(hf.cycles)  # both accepts and rejections were compared
    assert len(set(committed(hf))) > 3  # a real continuation, not one token repeated
    assert "decoder" not in hf.header  # a run that did not ask for the own decoder: unchanged header
    err = capsys.readouterr().err
    assert "decoder: target on the engine's own decoder" in err and "decoder: draft on the engine's own decoder" in err


def test_sampled_own_decoder_run_equals_hf_with_the_same_seed(folders, tmp_path, own_calls):
    """Same seed, same draws: the uniform draws come from the seeded generator whatever the probabilities
    are, so the two runs consume it alike. A draw can differ only where a ratio min(1, p_target/p_draft) or a
    cumulative probability falls within float32 rounding (~1e-7) of its uniform draw: about one chance in a
    million per draw, and these seeds are fixed, so a difference here is a real one."""
    sampled = ["--temperature", "1.0", "--top-k", "12", "--seed", "7"]
    own = run(*folders, tmp_path / "own.jsonl", "own", *sampled)
    assert own_calls
    hf = run(*folders, tmp_path / "hf.jsonl", "hf", *sampled)
    assert_same_run(own, hf)
    assert [c["u"] for c in own.cycles] == [c["u"] for c in hf.cycles]
    assert any(c["resampled_token_id"] is not None for c in hf.cycles)  # a residual draw was compared too


def test_own_decoder_on_static_and_paged_caches_and_the_fast_path(folders, tmp_path, own_calls):
    """The decoder writes K/V through each layout's own `update`; --fast hands it a 4-D bool mask."""
    hf = run(*folders, tmp_path / "hf.jsonl", "hf", "--temperature", "0")
    for extra in (["--cache", "static"], ["--cache", "paged", "--block-size", "4"], ["--fast"]):
        own = run(*folders, tmp_path / "own.jsonl", "own", "--temperature", "0", *extra)
        assert own.header["decoder"]["target"] == {"ran": "own"}
        assert_same_run(own, hf)
    assert own_calls


def test_own_decoder_verifies_a_draft_tree(folders, tmp_path, own_calls):
    """A tree's verify hands the decoder positions by depth and a 4-D additive mask (engine/tree/attention.py)."""
    tree = ["--tree", "static:2,2,1", "--temperature", "1.0", "--seed", "3"]
    own = run(*folders, tmp_path / "own.jsonl", "own", *tree)
    assert own_calls
    hf = run(*folders, tmp_path / "hf.jsonl", "hf", *tree)
    assert committed(own) == committed(hf)
    nodes = [(n, m) for a, b in zip(own.cycles, hf.cycles) for n, m in zip(a["tree"]["nodes"], b["tree"]["nodes"],
                                                                            strict=True)]
    assert len(nodes) > len(own.cycles) and all(n["token_id"] == m["token_id"] for n, m in nodes)
    for name in ("p", "q"):
        dp = max(abs(n[name] - m[name]) for n, m in nodes)
        assert dp <= TOL, f"tree node {name}: max |dp| {dp:.2e}"


# ---------------------------------------------------------------- (c) the header field

def rewrite(trace_path, out, header: dict) -> None:
    lines = trace_path.read_text().splitlines()
    out.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")


def test_header_records_the_decoder_per_model_and_load_trace_checks_it(folders, tmp_path):
    path = tmp_path / "own.jsonl"
    trace = run(*folders, path, "own", "--temperature", "0")
    assert trace.header["decoder"] == {"target": {"ran": "own"}, "draft": {"ran": "own"}}
    older = {k: v for k, v in trace.header.items() if k != "decoder"}  # traces before the field: hf
    rewrite(path, tmp_path / "older.jsonl", older)
    assert "decoder" not in load_trace(tmp_path / "older.jsonl").header
    h = trace.header
    bad = [
        ({**h, "decoder": "own"}, "decoder"),
        ({**h, "decoder": {"target": {"ran": "own"}}}, "decoder"),  # the draft model is not named
        ({**h, "decoder": {**h["decoder"], "eagle": {"ran": "hf"}}}, "decoder"),
        ({**h, "decoder": {**h["decoder"], "target": {"ran": "mine"}}}, "decoder.target.ran"),
        ({**h, "decoder": {**h["decoder"], "draft": "own"}}, "decoder.draft.ran"),
        ({**h, "decoder": {**h["decoder"], "target": {"ran": "own", "why": "x"}}}, "decoder.target"),
        ({**h, "decoder": {**h["decoder"], "target": {"ran": "own", "fallback": "x"}}}, "decoder.target.fallback"),
        ({**h, "decoder": {**h["decoder"], "draft": {"ran": "hf", "fallback": "two\nlines"}}}, "decoder.draft.fallback"),
        ({**h, "decoder": {**h["decoder"], "draft": {"ran": "hf", "fallback": ""}}}, "decoder.draft.fallback"),
        ({**h, "decoder": {**h["decoder"], "draft": {"ran": "hf", "fallback": 3}}}, "decoder.draft.fallback"),
        ({**h, "decoder": {**h["decoder"], "draft": {"ran": "hf", "fallback": "x" * 301}}}, "decoder.draft.fallback"),
    ]
    for header, field in bad:
        rewrite(path, tmp_path / "bad.jsonl", header)
        with pytest.raises(TraceError, match=f"field '{re.escape(field)}'") as err:
            load_trace(tmp_path / "bad.jsonl")
        assert "\n" not in str(err.value)
    rewrite(path, tmp_path / "fine.jsonl", {**h, "decoder": {**h["decoder"], "draft": {"ran": "hf"}}})
    load_trace(tmp_path / "fine.jsonl")  # hf without a reason: a model asked to run on hf


def test_a_drafter_without_a_model_names_the_target_only(folders, tmp_path):
    path = tmp_path / "pl.jsonl"
    trace = run(folders[0], None, path, "own", "--drafter", "prompt-lookup", "--temperature", "0")
    assert trace.header["decoder"] == {"target": {"ran": "own"}}
    rewrite(path, tmp_path / "bad.jsonl", {**trace.header, "decoder": {"target": {"ran": "own"},
                                                                        "draft": {"ran": "own"}}})
    with pytest.raises(TraceError, match=r"field 'decoder': .*no draft model"):
        load_trace(tmp_path / "bad.jsonl")


def test_a_draft_with_its_own_tokenizer_runs_on_the_own_decoder(tmp_path):
    """The other-tokenizer drafter's model is a draft model too: --decoder own applies to it."""
    from tests.test_other_tokenizer import DRAFT_WORDS, PROMPT_TEXT, relabelled_draft
    target = tiny_llama(0, 2, 32)
    folders = []
    for name, model, words in (("target", target, WORDS), ("draft", relabelled_draft(target, 0.08, 3), DRAFT_WORDS)):
        model.save_pretrained(tmp_path / name)
        tiny_tokenizer(words).save_pretrained(tmp_path / name)
        folders.append(str(tmp_path / name))
    traces = {}
    for decoder in ("own", "hf"):
        out = tmp_path / f"{decoder}.jsonl"
        assert main(["run", "--prompt", PROMPT_TEXT, "--target", folders[0], "--draft", folders[1], *RUN,
                     "--drafter", "other-tokenizer", "--temperature", "0", "--decoder", decoder, "--out", str(out)]) == 0
        traces[decoder] = load_trace(out)
    assert traces["own"].header["decoder"] == {"target": {"ran": "own"}, "draft": {"ran": "own"}}
    assert sum(c["num_accepted"] for c in traces["hf"].cycles) > 0
    assert_same_run(traces["own"], traces["hf"])
    assert [c["drafter_state"] for c in traces["own"].cycles] == [c["drafter_state"] for c in traces["hf"].cycles]


def test_an_eagle_head_drafts_from_the_own_decoders_features(tmp_path):
    """The target runs on the own decoder and hands its last block's features to the EAGLE head, which
    keeps its own module (the header names the target only)."""
    from tests.eagle_tiny import EAGLE_PROMPT, save_eagle_folders
    paths = save_eagle_folders(tmp_path)
    traces = {}
    for decoder in ("own", "hf"):
        out = tmp_path / f"{decoder}.jsonl"
        assert main(["run", "--prompt", EAGLE_PROMPT, "--target", str(paths["target"]), "--draft", str(paths["head"]),
                     *RUN, "--drafter", "eagle", "--temperature", "2", "--seed", "1", "--decoder", decoder,
                     "--out", str(out)]) == 0
        traces[decoder] = load_trace(out)
    assert traces["own"].header["decoder"] == {"target": {"ran": "own"}}
    assert sum(c["num_accepted"] for c in traces["hf"].cycles) > 0
    assert_same_run(traces["own"], traces["hf"])


def test_the_checks_drafters_with_a_model_are_the_registrys():
    assert sorted(DRAFTERS_WITH_MODEL) == sorted(k for k, spec in DRAFTERS.items() if spec.needs.model)


# ---------------------------------------------------------------- (d) an architecture the decoder refuses

def linear_rope_draft(folder) -> str:
    """A 1-layer Llama draft with linear rope scaling, which the own decoder does not implement."""
    torch.manual_seed(5)
    config = LlamaConfig(vocab_size=len(WORDS), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         initializer_range=0.3, eos_token_id=0, bos_token_id=None, pad_token_id=None,
                         rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    model = LlamaForCausalLM(config).eval()
    path = folder / "linear-rope-draft"
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return str(path)


def test_a_draft_the_decoder_refuses_runs_on_hf_and_the_header_says_why(folders, tmp_path, capsys):
    draft = linear_rope_draft(tmp_path)
    path = tmp_path / "own.jsonl"
    own = run(folders[0], draft, path, "own", "--temperature", "0")
    fallback = own.header["decoder"]["draft"]["fallback"]
    assert own.header["decoder"] == {"target": {"ran": "own"}, "draft": {"ran": "hf", "fallback": fallback}}
    assert "rope type 'linear'" in fallback
    assert f"decoder: draft on Hugging Face's modules (the own decoder does not apply: {fallback})" \
        in capsys.readouterr().err
    hf = run(folders[0], draft, tmp_path / "hf.jsonl", "hf", "--temperature", "0")
    assert_same_run(own, hf)
    assert main(["stats", str(path)]) == 0 and main(["stats", str(tmp_path / "hf.jsonl")]) == 0
    own_stats, hf_stats = capsys.readouterr().out.split("TARGET WEIGHTS")[1:]
    assert f"DECODER: target on the engine's own decoder; draft on Hugging Face's modules ({fallback})" in own_stats
    assert "DECODER" not in hf_stats  # a trace without the field: nothing to say
    rewrite(path, tmp_path / "bad.jsonl", {**own.header, "decoder": {**own.header["decoder"],
                                                                     "draft": {"ran": "own", "fallback": fallback}}})
    with pytest.raises(TraceError, match=r"field 'decoder[.]draft[.]fallback'"):
        load_trace(tmp_path / "bad.jsonl")


def test_loaded_model_falls_back_per_model():
    m = wrap_model("gelu", tiny_llama(0, 1, 16), tiny_tokenizer())
    m.model.config.hidden_act = "gelu_pytorch_tanh"  # what the decoder's MLP does not compute
    m.use_decoder(DECODER_OWN)
    assert (m.decoder, m.decoder_asked, m.base) == ("hf", "own", m.model)
    assert m.describe_decoder() == {"ran": "hf", "fallback": "activation 'gelu_pytorch_tanh' (the decoder's MLP is "
                                                             "SwiGLU with silu)"}
    long = wrap_model("qk-norms", tiny_llama(0, 1, 16), tiny_tokenizer())
    for i in range(40):  # weights the decoder does not compute, with long names: the reason is cut to fit the header
        long.model.register_parameter(f"norm_the_decoder_does_not_compute_number_{i:02d}" + "x" * 60,
                                      torch.nn.Parameter(torch.ones(1)))
    long.use_decoder(DECODER_OWN)
    assert long.decoder == "hf" and long.decoder_fallback.startswith("weights the decoder does not use: norm_the")
    assert len(long.decoder_fallback) <= 300 and long.decoder_fallback.endswith("...")
    ok = wrap_model("silu", tiny_llama(0, 1, 16), tiny_tokenizer())
    ok.use_decoder(DECODER_OWN)
    assert isinstance(ok.base, llama.LlamaDecoder) and ok.describe_decoder() == {"ran": "own"}
    ok.use_decoder("hf")
    assert ok.base is ok.model and ok.describe_decoder() == {"ran": "hf"}
    with pytest.raises(ValueError, match="unknown decoder 'mine'"):
        ok.use_decoder("mine")


# ---------------------------------------------------------------- (e) where the own decoder cannot apply

def test_own_decoder_refusals_in_the_run_mode_and_the_loaded_model():
    with pytest.raises(Exception, match="--decoder own runs unsharded models") as err:
        RunMode(tp_size=2).check_drafter("model", decoder=DECODER_OWN)
    assert str(err.value) == OWN_DECODER_TP
    RunMode(tp_size=2).check_drafter("model", decoder="hf")
    m = wrap_model("t", tiny_llama(0, 1, 16), tiny_tokenizer())
    m.use_decoder(DECODER_OWN)
    with pytest.raises(ModelLoadError, match="was not loaded from one"):  # int4 needs a GGUF file, own or not
        m.use_weights(WEIGHTS_INT4)
