"""Loading pairs from folders, refusing bad pairs and bad settings, and the CLI end to end."""
import json

import pytest
import torch

from engine.cli import main
from engine.config import SettingsError, SpecSettings
from engine.cycle.plain import target_generate
from engine.cycle.reference import speculative_generate
from engine.models.device import pick_dtype
from engine.models.loading import DRAFT_VOCAB_FILE, ModelLoadError, TokenizerMismatchError, load_model
from engine.run import load_pair
from engine.stats.report import format_stats
from engine.trace import load_trace
from tests.tiny import WORDS, noisy_pair, save_tiny, tiny_llama, tiny_tokenizer


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return save_tiny(noisy_pair(0), tmp_path_factory.mktemp("models"))


def test_pair_loads_from_folders_and_decodes_greedily_like_target(folders):
    pair = load_pair(*folders, device="cpu")
    s = SpecSettings(k=3, temperature=0, max_new_tokens=20)
    spec = [t for r in speculative_generate(pair, [1, 2, 3], s) for t in r["committed_token_ids"]]
    assert spec == target_generate(pair.target, [1, 2, 3], s, pair.eos_ids)


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="model folder not found"):
        load_pair(str(tmp_path / "missing"), str(tmp_path / "missing2"), device="cpu")


def test_unreachable_hub_id_is_a_clear_error():
    with pytest.raises(ModelLoadError, match="could not load model"):
        load_model("no-such-org/no-such-model", torch.device("cpu"), torch.float32)


def test_mismatched_tokenizers_are_refused(folders, tmp_path):
    other_words = WORDS[:-1] + ["elsewhere"]
    other = tmp_path / "other"
    tiny_llama(3, 1, 16).save_pretrained(other)
    tiny_tokenizer(other_words).save_pretrained(other)
    with pytest.raises(TokenizerMismatchError, match="same token id"):
        load_pair(folders[0], str(other), device="cpu")


def test_pruned_vocabulary_draft_is_scattered_into_full_vocabulary(folders, tmp_path):
    kept = [0, 1, 2, 3, 5, 8, 13]
    draft = tmp_path / "pruned"
    tiny_llama(4, 1, 16, vocab=len(kept) + 1).save_pretrained(draft)
    tiny_tokenizer().save_pretrained(draft)
    (draft / DRAFT_VOCAB_FILE).write_text(json.dumps(
        {"format": "speclab-draft-vocab", "version": 1, "full_vocab_size": len(WORDS), "kept_token_ids": kept}))
    pair = load_pair(folders[0], str(draft), device="cpu")
    s = SpecSettings(k=4, temperature=1.0, max_new_tokens=30, seed=3)
    records = list(speculative_generate(pair, [4, 6, 9], s))  # 4, 6, 9 are not kept: the unknown bucket
    drafted = {t for r in records for t in r["draft_token_ids"]}
    assert drafted <= set(kept)
    probs = pair.draft.forward([4, 6, 9], pair.draft.new_cache()).softmax(-1)
    assert probs[:, [4, 6, 7, 9]].sum() == 0 and torch.allclose(probs.sum(-1), torch.ones(3))


@pytest.mark.parametrize("kwargs, message", [
    ({"k": 0}, "k must be between 1 and 32"), ({"k": 1000}, "k must be between 1 and 32"),
    ({"temperature": -0.5}, "temperature must be between 0"), ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"top_p": 1.5}, "top_p"), ({"max_new_tokens": 0}, "max_new_tokens"), ({"top_k": -1}, "top_k"),
    ({"k": 2.5}, "k must be an integer"), ({"seed": -1}, "seed"),
])
def test_out_of_range_settings_are_refused(kwargs, message):
    with pytest.raises(SettingsError, match=message):
        SpecSettings(**kwargs)


def test_cli_writes_a_complete_trace_and_prints_metrics(folders, tmp_path, capsys):
    out = tmp_path / "cli.jsonl"
    code = main(["run", "--prompt", "the cat sat", "--target", folders[0], "--draft", folders[1],
                 "--k", "3", "--max-new-tokens", "12", "--seed", "4", "--out", str(out)])
    assert code == 0
    trace = load_trace(out)
    generated = trace.summary["generated_token_ids"]
    assert trace.complete and 1 <= len(generated) <= 12
    assert len(generated) == 12 or (trace.summary["stop_reason"] == "eos" and generated[-1] == 0)
    printed = capsys.readouterr().out
    assert f"draft acceptance rate: {trace.summary['acceptance_rate']:.3f}" in printed
    assert main(["stats", str(out)]) == 0
    assert "mean acceptance length" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--k", "0"], "k must be between"), (["--temperature", "-1"], "temperature"),
    (["--top-p", "2"], "top_p"), (["--target", "./nowhere"], "name both --target and --draft"),
])
def test_cli_reports_bad_input_and_writes_nothing(tmp_path, capsys, args, message):
    out = tmp_path / "bad.jsonl"
    assert main(["run", "--prompt", "x", "--out", str(out), *args]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_float32_is_the_default_dtype_on_every_device():
    # Half precision can flip a near-tie argmax between a verify pass and a one-token step.
    assert pick_dtype(torch.device("cpu")) == torch.float32
    assert pick_dtype(torch.device("cuda")) == torch.float32
    assert pick_dtype(torch.device("cuda"), "bfloat16") == torch.bfloat16
    with pytest.raises(ValueError, match="choose one of"):
        pick_dtype(torch.device("cuda"), "int8")


def test_bfloat16_on_the_cpu_with_bfloat16_in_hardware_or_the_rows_kernel(monkeypatch):
    from engine.models import f32_rows_kernel
    cpu = torch.device("cpu")
    monkeypatch.setattr(f32_rows_kernel, "unavailable", lambda: "the float32 rows path needs a C compiler")
    assert pick_dtype(cpu, "bfloat16", cpu_flags=["avx2", "avx512f", "amx_bf16"]) == torch.bfloat16
    assert pick_dtype(cpu, "bfloat16", cpu_flags=["avx512_bf16"]) == torch.bfloat16
    with pytest.raises(ValueError, match="no bfloat16 instructions.*needs a C compiler"):
        pick_dtype(cpu, "bfloat16", cpu_flags=["avx2", "avx512f"])
    with pytest.raises(ValueError, match="use float32 there"):
        pick_dtype(cpu, "float16", cpu_flags=["amx_bf16"])
    monkeypatch.setattr(f32_rows_kernel, "unavailable", lambda: None)  # the kernel widens bfloat16 weights
    assert pick_dtype(cpu, "bfloat16", cpu_flags=["avx2"]) == torch.bfloat16


def test_cli_refuses_half_precision_on_the_cpu(folders, tmp_path, capsys):
    out = tmp_path / "half.jsonl"
    code = main(["run", "--prompt", "the cat", "--target", folders[0], "--draft", folders[1],
                 "--device", "cpu", "--dtype", "float16", "--out", str(out)])
    assert code == 2
    assert "use float32 there" in capsys.readouterr().err
    assert not out.exists()


def test_cli_bfloat16_run_on_a_cpu_with_bfloat16_in_hardware(folders, tmp_path, monkeypatch):
    """Any x86 CPU computes in bfloat16 (converting where it lacks the instructions), so the run is
    checked everywhere by telling pick_dtype the flags of a CPU that has them."""
    from engine.models import device
    monkeypatch.setattr(device, "cpu_features", lambda: ["avx512f", "amx_bf16"])
    out = tmp_path / "bf16.jsonl"
    assert main(["run", "--prompt", "the cat", "--target", folders[0], "--draft", folders[1], "--k", "3",
                 "--max-new-tokens", "12", "--device", "cpu", "--dtype", "bfloat16", "--out", str(out)]) == 0
    trace = load_trace(out)
    assert trace.header["dtype"] == "bfloat16" and trace.header["device"] == "cpu"
    assert len(trace.summary["generated_token_ids"]) == 12
    assert "TARGET WEIGHTS: the model as loaded, in bfloat16" in format_stats(trace)
