"""The chat draft over the target's whole vocabulary (engine/models/presets.py chat_draft_full_vocab_folder):
the same draft wherever it can win, a token it never kept never winning, a folder the lab loads as a draft."""
import torch

from engine.models.loading import check_same_token_space, load_model
from engine.models.presets import PRESETS, chat_draft_full_vocab_folder, full_vocab_config, full_vocab_rows


def test_dropped_ids_read_the_bucket_and_never_win_greedy():
    gen = torch.Generator().manual_seed(0)
    pruned = torch.randn(6, 8, generator=gen)  # row 0 the bucket, rows 1..5 the kept ids
    kept = torch.tensor([0, 2, 3, 7, 9])
    embed, out = full_vocab_rows(pruned, kept, 12)
    dropped = [1, 4, 5, 6, 8, 10, 11]
    assert torch.equal(embed[kept], pruned[1:]) and torch.equal(out[kept], pruned[1:])
    assert all(torch.equal(embed[i], pruned[0]) for i in dropped)
    hidden = torch.randn(10_000, 8, generator=gen)  # every direction a final norm's output may take
    logits = hidden @ out.T
    assert torch.isin(logits.argmax(-1), kept).all()
    assert (logits[:, kept].max(-1).values > logits[:, dropped].max(-1).values).all()


def test_special_ids_move_from_rows_to_token_ids():
    config = full_vocab_config({"vocab_size": 4, "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 3},
                               [1, 5, 9], 12)
    assert config["vocab_size"] == 12 and config["tie_word_embeddings"] is False
    assert (config["bos_token_id"], config["eos_token_id"]) == (5, 9)


def test_the_chat_draft_keeps_its_greedy_choices_over_the_full_vocabulary():
    cpu = torch.device("cpu")
    pruned = load_model(str(PRESETS["chat"].draft_folder()), cpu, torch.float32)
    full = load_model(str(chat_draft_full_vocab_folder()), cpu, torch.float32)
    target = load_model(str(PRESETS["chat"].target_folder()), cpu, torch.float32)
    check_same_token_space(target, full)  # the lab takes it as a draft for the chat target
    assert full.kept_token_ids is None and full.model.config.vocab_size == target.full_vocab_size
    text = "The sky looks blue because air scatters short wavelengths. zxqv Übermäßig 你好"
    ids = target.tokenizer(text, add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        a, b = pruned.forward(ids, pruned.new_cache()), full.forward(ids, full.new_cache())
    assert torch.equal(a.argmax(-1), b.argmax(-1))
    assert torch.equal(a[:, pruned.kept_token_ids], b[:, pruned.kept_token_ids])
