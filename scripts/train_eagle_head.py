"""Train the chat preset's EAGLE-style draft head (engine/drafters/eagle.py) on the CPU.

Data: the target's own answers to chat prompts, sampled by scripts/make_chat_distill_data.py
(training prompts into --train, held-out prompts on disjoint topics into --heldout), e.g.
    python -m scripts.make_chat_distill_data --tokens 200000 --batch 96 --out data/eagle_train
    python -m scripts.make_chat_distill_data --heldout --prompts 32 --out data/eagle_heldout
    python -m scripts.train_eagle_head --end-utc 19:10

Features: the target's top features (last decoder layer output, before the final norm).
Shards sampled with `make_chat_distill_data.py --features` carry them from the sampling
passes; otherwise they are recomputed by teacher-forced batched target passes over
prompt + answer (right padded, so no mask is needed for the positions that count).

Head entry p reads x_p with f_{p-1} (zeros at p = 0) and predicts f_p. Loss at every answer
position: smooth L1 between the predicted and true feature (both through the target's
frozen final norm) + cls_weight x soft cross-entropy against the target's top-32
distribution there (renormalised over the kept vocabulary), as in EAGLE (Li et al. 2024).
Inputs get Gaussian noise (EAGLE adds noise so the head tolerates its own errors at later
draft steps).

Evaluation on the held-out answers, teacher forced: alpha at T=1 = mean sum_x min(p_target,
q_head) over the full vocabulary and greedy agreement, for draft step 1 (the target's own
feature in) and step 2 (the head's predicted feature in); c from the engine's calibration
(median drafter step / target step, batch 1, 1 thread). Progress: <out>/progress.log.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.drafters.eagle import EagleDrafter, EagleHead, head_config, save_head
from engine.models.loading import wrap_model

ROOT = Path(__file__).resolve().parent.parent


def load_shards(folder: Path) -> list[dict]:
    recs = []
    for s in sorted(folder.glob("shard_*.pt")):
        try:
            recs.extend(torch.load(s))
        except Exception:  # a shard still being written
            pass
    return recs


@torch.inference_mode()
def teacher_forced_features(target, seqs: list[list[int]], batch: int = 16) -> list[torch.Tensor]:
    """Top features (L, H) of each sequence, from right-padded batched target passes."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out: list[torch.Tensor | None] = [None] * len(seqs)
    feats = {}  # the last decoder layer's output of the latest batch

    def record(module, args, output):
        feats["h"] = (output[0] if isinstance(output, tuple) else output).detach()

    for start in range(0, len(order), batch):
        idx = order[start:start + batch]
        L = max(len(seqs[i]) for i in idx)
        ids = torch.zeros((len(idx), L), dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, :len(seqs[i])] = torch.tensor(seqs[i])
        handle = target.model.layers[-1].register_forward_hook(record)
        try:
            target.model(input_ids=ids)  # the body only: the output layer is not needed here
        finally:
            handle.remove()
        for r, i in enumerate(idx):
            out[i] = feats["h"][r, :len(seqs[i])].half()
    return out


def features_of(target, recs: list[dict]) -> list[torch.Tensor]:
    """Each record's top features (P + T - 1, H): kept from sampling where the shard has them."""
    missing = [i for i, r in enumerate(recs) if "feats" not in r]
    computed = teacher_forced_features(target, [recs[i]["prompt_ids"] + recs[i]["answer_ids"][:-1] for i in missing])
    out = [r.get("feats") for r in recs]
    for i, f in zip(missing, computed):
        out[i] = f
    return out


def make_example(rec: dict, feats: torch.Tensor, to_row: torch.Tensor) -> dict:
    """Inputs over positions 0..P+T-2 (prompt + answer minus its last token); targets at answer positions."""
    P, T = len(rec["prompt_ids"]), len(rec["answer_ids"])
    ids = torch.tensor(rec["prompt_ids"] + rec["answer_ids"][:-1])
    rows = to_row[rec["topk_ids"].long()]  # (T, 32) kept row, -1 = not kept
    q = rec["topk_lp"].float().exp() * (rows >= 0)
    q = q / q.sum(-1, keepdim=True).clamp(min=1e-9)
    return {"ids": ids, "feats": feats, "P": P, "T": T, "rows": rows.clamp(min=0), "q": q.half()}


def collate(batch: list[dict], hidden: int):
    L = max(len(e["ids"]) for e in batch)
    B = len(batch)
    ids = torch.zeros((B, L), dtype=torch.long)
    feats = torch.zeros((B, L, hidden))
    pos_b, pos_t, rows, qs = [], [], [], []
    for i, e in enumerate(batch):
        n = len(e["ids"])
        ids[i, :n] = e["ids"]
        feats[i, :n] = e["feats"].float()
        pos_b.append(torch.full((e["T"],), i))
        pos_t.append(torch.arange(e["P"] - 1, e["P"] - 1 + e["T"]))
        rows.append(e["rows"])
        qs.append(e["q"].float())
    return ids, feats, torch.cat(pos_b), torch.cat(pos_t), torch.cat(rows), torch.cat(qs)


class Frozen:
    """The target's embedding, final norm and kept output rows (no gradients)."""

    def __init__(self, target, kept: torch.Tensor):
        self.embed = target.get_input_embeddings()
        self.norm = target.model.norm
        self.w_kept = target.get_output_embeddings().weight.detach()[kept]  # (Vk, H)
        self.w_full = target.get_output_embeddings().weight.detach()  # (V, H)
        self.kept = kept
        for p in target.parameters():
            p.requires_grad_(False)

    def prev_inputs(self, feats: torch.Tensor) -> torch.Tensor:
        """(B, L, H) features f_p -> normed f_{p-1} at each position p (zeros at p = 0)."""
        normed = self.norm(feats)
        return torch.cat([torch.zeros_like(normed[:, :1]), normed[:, :-1]], dim=1)


def head_forward(head, fr: Frozen, ids, prev_normed):
    return head(fr.embed(ids), prev_normed)  # (B, L, H)


def reads_prediction(ids: torch.Tensor, pb: torch.Tensor, pt: torch.Tensor) -> torch.Tensor:
    """(B, L) True at the entries that, from draft step 2 on, read the head's own prediction:
    every answer entry after the first (entry p reads f_{p-1}, and entry P-1 is the last
    prompt token, whose previous feature the verify pass always gives)."""
    is_answer = torch.zeros(ids.shape, dtype=torch.bool)
    is_answer[pb, pt] = True
    out = torch.zeros_like(is_answer)
    out[:, 1:] = is_answer[:, :-1]
    return out


def unrolled_predictions(head, fr: Frozen, ids, prev, own: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Draft steps 1..steps over whole sequences: step 1 reads the target's features; step s > 1
    reads, at the `own` entries, the normed features step s - 1 predicted one entry earlier.
    This is the training-time test of EAGLE-3 (Li et al. 2025) in a simpler form: one causal
    pass per step in which every answer entry reads predictions, so later answer entries'
    keys also rest on predictions (harsher than a cycle, where only the entries drafted in
    this cycle do). Gradients flow through the earlier steps' predictions."""
    preds = [head_forward(head, fr, ids, prev)]  # (B, L, H) each
    for _ in range(steps - 1):
        shifted = torch.cat([torch.zeros_like(preds[-1][:, :1]), fr.norm(preds[-1][:, :-1])], dim=1)
        preds.append(head_forward(head, fr, ids, torch.where(own[..., None], shifted, prev)))
    return preds


def losses(head, fr: Frozen, batch, noise: float, cls_weight: float, steps: int = 1, step_decay: float = 1.0):
    """Regression + cls_weight x soft CE at every answer position, summed over the unrolled
    draft steps with weights step_decay ** (s - 1), normalised to sum to one."""
    ids, feats, pb, pt, rows, q = batch
    prev = fr.prev_inputs(feats)
    if noise:
        prev = prev + noise * prev.std() * torch.randn_like(prev)
    preds = unrolled_predictions(head, fr, ids, prev, reads_prediction(ids, pb, pt), steps)
    true_normed = fr.norm(feats[pb, pt])  # (N, H)
    weights = [step_decay ** i for i in range(steps)]
    total, regs, clss = 0.0, [], []
    for w, pred_all in zip(weights, preds):
        pred = fr.norm(pred_all[pb, pt])  # (N, H) predicted f_p at answer positions, normed
        reg = F.smooth_l1_loss(pred, true_normed)
        logq = torch.log_softmax(pred @ fr.w_kept.T, dim=-1)  # (N, Vk)
        cls = -(q * logq.gather(1, rows)).sum(-1).mean()
        total = total + w * (reg + cls_weight * cls)
        regs.append(float(reg.detach()))
        clss.append(float(cls.detach()))
    return total / sum(weights), regs[0], clss[0], clss


@torch.inference_mode()
def target_references(fr: Frozen, examples: list[dict], hidden: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per held-out answer: the target's probabilities of the kept tokens (T, Vk), normalised over
    the full vocabulary, and its full-vocabulary argmax (T,). q is zero outside the kept tokens, so
    sum_x min(p, q) needs p on the kept tokens only."""
    refs = []
    for e in examples:
        _, feats, pb, pt, _, _ = collate([e], hidden)
        logits = fr.norm(feats[pb, pt]) @ fr.w_full.T  # (T, V)
        logp = torch.log_softmax(logits, -1)
        refs.append((logp[:, fr.kept].exp().half(), logits.argmax(-1)))
    return refs


@torch.inference_mode()
def evaluate(head, fr: Frozen, examples: list[dict], refs, hidden: int, step2: bool = True) -> dict:
    """alpha (T=1) and greedy agreement vs the full target distribution, teacher forced, for draft
    step 1 (true previous feature) and step 2 (the head's own predicted previous feature)."""
    head.eval()
    sums = {"alpha_step1": 0.0, "greedy_step1": 0.0, "alpha_step2": 0.0, "greedy_step2": 0.0}
    n = 0
    for e, (p_kept, p_argmax) in zip(examples, refs):
        ids, feats, pb, pt, _, _ = collate([e], hidden)
        prev = fr.prev_inputs(feats)
        pred1 = head_forward(head, fr, ids, prev)  # (1, L, H)
        preds = [("step1", pred1)]
        if step2:  # at answer entries the previous feature is the head's prediction, not the target's
            own = reads_prediction(ids, pb, pt)
            preds.append(("step2", unrolled_predictions(head, fr, ids, prev, own, 2)[1]))
        for name, pred in preds:
            qk = torch.softmax(fr.norm(pred[pb, pt]) @ fr.w_kept.T, -1)  # (T, Vk)
            sums[f"alpha_{name}"] += float(torch.minimum(p_kept.float(), qk).sum())
            sums[f"greedy_{name}"] += float((fr.kept[qk.argmax(-1)] == p_argmax).sum())
        n += len(pt)
    head.train()
    out = {k: round(v / n, 4) for k, v in sums.items() if step2 or k.endswith("step1")}
    return out | {"positions": n}


def measure_c(target, tok, head, kept, prompt_ids: list[int], repeats: int = 15) -> dict:
    """c with the engine's own calibration: median drafter step over median target step (1 thread)."""
    from engine.config import SpecSettings
    from engine.cycle.pair import Pair
    from engine.stats.calibrate import time_drafter_step, time_widths

    torch.set_num_threads(1)
    loaded = wrap_model("SmolLM2-135M-Instruct", target, tok)
    drafter = EagleDrafter.build(loaded, head, kept)
    pair = Pair(loaded, None, {2}, drafter)
    s = SpecSettings(k=1, temperature=1.0)
    ctx = (prompt_ids * 20)[:101]
    t_draft = time_drafter_step(pair, ctx, s, repeats)
    t_target = time_widths(loaded, ctx, [1], s, repeats, draw=True)[1]
    return {"head_step_ms": round(t_draft * 1e3, 3), "target_step_ms": round(t_target * 1e3, 3),
            "c": round(t_draft / t_target, 4),
            "c_method": "engine.stats.calibrate: median of 15 single-step timings, batch 1, fp32, 1 thread, 100 cached "
                        "positions; head step incl. the pruned output layer, softmax and scatter to the full vocabulary"}


def draft_model_scores(target, recs: list[dict]) -> dict | None:
    """Today's separate chat draft on the same held-out answers (scripts/train_chat_draft.evaluate)."""
    folder = ROOT / "assets" / "models" / "chat-draft"
    if not folder.is_dir():
        return None
    from transformers import LlamaForCausalLM

    from scripts.train_chat_draft import Mapper
    from scripts.train_chat_draft import evaluate as draft_evaluate

    spec = json.loads((folder / "draft_vocab.json").read_text())
    draft = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    al, ag, n = draft_evaluate(draft, target, recs, Mapper(spec["kept_token_ids"], spec["full_vocab_size"]),
                               spec["full_vocab_size"])
    return {"alpha_temperature_1": round(al, 4), "greedy_agreement": round(ag, 4), "positions": n}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", default=str(ROOT / "data" / "eagle_train"), help="shard folder(s), comma separated")
    ap.add_argument("--heldout", default=str(ROOT / "data" / "eagle_heldout"))
    ap.add_argument("--out", default=str(ROOT / "assets" / "models" / "chat-eagle"))
    ap.add_argument("--vocab", default=str(ROOT / "assets" / "models" / "chat-draft" / "draft_vocab.json"),
                    help="kept vocabulary (the chat draft's, so both prune the output layer alike)")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--intermediate", type=int, default=0, help="MLP width (0: the target's)")
    ap.add_argument("--init", choices=["last-layer", "random"], default="last-layer",
                    help="start the head's decoder layer(s) from the target's last layer, or at random")
    ap.add_argument("--batch-tokens", type=int, default=3072)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--cls-weight", type=float, default=0.1)
    ap.add_argument("--noise", type=float, default=0.1, help="input noise, as a fraction of the features' std")
    ap.add_argument("--end-utc", default="", help="stop training at this UTC time (HH:MM), then evaluate and save")
    ap.add_argument("--max-epochs", type=int, default=50)
    ap.add_argument("--skip-measure", action="store_true", help="no baseline draft and no c (quick trials)")
    ap.add_argument("--eval-every", type=int, default=60)
    ap.add_argument("--quick-eval", type=int, default=12, help="held-out answers for evaluations during training (0: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data-note", default="sampled on the 2-core CPU", help="how and where the data was sampled")
    ap.add_argument("--machine-note", default="2-core CPU", help="the machine c was measured on, and its load")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ttt-steps", type=int, default=1,
                    help="draft steps unrolled in training (1: step 1 only; 2+: the training-time test)")
    ap.add_argument("--step-decay", type=float, default=1.0, help="loss weight of step s is step_decay ** (s - 1)")
    ap.add_argument("--init-from", default="", help="start from a saved head folder (fine-tuning)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "progress.log", "a")
    t_start = time.time()

    def say(msg):
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()

    end_time = None
    if args.end_utc:
        hh, mm = map(int, args.end_utc.split(":"))
        now = time.gmtime()
        minutes_left = ((hh * 60 + mm) - (now.tm_hour * 60 + now.tm_min)) % (24 * 60)  # past midnight too
        end_time = t_start + minutes_left * 60 - now.tm_sec

    from scripts.smollm2_target import load_target
    target, tok = load_target()
    target.eval()
    H = target.config.hidden_size
    spec = json.loads(Path(args.vocab).read_text())
    kept = torch.tensor(spec["kept_token_ids"], dtype=torch.long)
    to_row = torch.full((target.config.vocab_size,), -1, dtype=torch.long)
    to_row[kept] = torch.arange(len(kept))
    fr = Frozen(target, kept)

    train_recs = [r for folder in args.train.split(",") for r in load_shards(Path(folder))]
    ho_recs = load_shards(Path(args.heldout))
    n_train_tok = sum(len(r["answer_ids"]) for r in train_recs)
    say(f"data: {len(train_recs)} train answers ({n_train_tok} tokens), {len(ho_recs)} held-out answers")
    t0 = time.time()
    tr_feats = features_of(target, train_recs)
    ho_feats = features_of(target, ho_recs)
    feat_minutes = (time.time() - t0) / 60
    stored = sum("feats" in r for r in train_recs)
    say(f"features: {stored} of {len(train_recs)} training answers kept from sampling; the rest and the "
        f"held-out ones recomputed teacher-forced in {feat_minutes:.1f} min")
    for r in train_recs:
        r.pop("feats", None)  # the examples hold them now
    train_ex = [make_example(r, f, to_row) for r, f in zip(train_recs, tr_feats)]
    ho_ex = [make_example(r, f, to_row) for r, f in zip(ho_recs, ho_feats)]
    ho_refs = target_references(fr, ho_ex, H)
    quick = args.quick_eval or len(ho_ex)  # held-out answers used by the evaluations during training

    head = EagleHead(head_config(target.config, args.layers, args.intermediate or None))
    if args.init == "last-layer":  # a target layer as the starting point (same shapes when widths match)
        src = target.model.layers[-1].state_dict()
        for layer in head.body.layers:
            own = layer.state_dict()
            layer.load_state_dict({k: src[k] if src[k].shape == own[k].shape else own[k] for k in own})
        with torch.no_grad():  # fuse starts as "embedding + previous feature"
            head.fuse.weight.zero_()
            head.fuse.weight[:, :H] = torch.eye(H)
            head.fuse.weight[:, H:] = torch.eye(H)
            head.fuse.bias.zero_()
    if args.init_from:
        from safetensors.torch import load_file
        head.load_state_dict({k: v.float() for k, v in load_file(str(Path(args.init_from) / "head.safetensors")).items()})
    head.train()
    n_params = sum(p.numel() for p in head.parameters())
    init = f"from {args.init_from}" if args.init_from else args.init
    say(f"head: {args.layers} layer(s), intermediate {head.config.intermediate_size}, {n_params} parameters, init {init}; "
        f"{args.ttt_steps} draft step(s) unrolled in training")
    both = args.ttt_steps > 1  # then the evaluations during training also score step 2, and pick on both

    batches_per_epoch = max(1, sum(len(e["ids"]) for e in train_ex) // args.batch_tokens)
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    curve, evals = [], []
    ev = evaluate(head, fr, ho_ex[:quick], ho_refs[:quick], H, step2=both)
    evals.append({"step": 0, "minutes": round((time.time() - t_start) / 60, 2), "heldout_answers": quick, **ev})
    say(f"EVAL step 0: {ev}")
    step, best, best_state = 0, -1.0, None
    est_total = args.max_epochs * batches_per_epoch
    t_train = time.time()  # with --end-utc the learning rate decays over the time left, not over epochs
    done = False
    for epoch in range(args.max_epochs):
        order = sorted(range(len(train_ex)), key=lambda i: len(train_ex[i]["ids"]) + random.random() * 40)
        groups, cur, cur_tok = [], [], 0
        for i in order:
            cur.append(train_ex[i])
            cur_tok += len(train_ex[i]["ids"])
            if cur_tok >= args.batch_tokens:
                groups.append(cur)
                cur, cur_tok = [], 0
        if cur:
            groups.append(cur)
        random.shuffle(groups)
        for g in groups:
            if end_time and time.time() > end_time:
                done = True
                break
            frac = (time.time() - t_train) / (end_time - t_train) if end_time else step / est_total
            lr = args.lr * min(1.0, (step + 1) / 30) * (0.5 * (1 + math.cos(math.pi * min(frac, 1.0))) * 0.9 + 0.1)
            for pg in opt.param_groups:
                pg["lr"] = lr
            loss, reg, cls, cls_steps = losses(head, fr, collate(g, H), args.noise, args.cls_weight,
                                               args.ttt_steps, args.step_decay)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            step += 1
            if step % 10 == 0:
                curve.append({"step": step, "epoch": epoch, "minutes": round((time.time() - t_start) / 60, 2),
                              "loss": round(float(loss.detach()), 4), "reg": round(reg, 4), "cls": round(cls, 4),
                              "cls_by_step": [round(c, 4) for c in cls_steps], "lr": lr})
                say(f"step {step} epoch {epoch}: loss {float(loss.detach()):.4f} reg {reg:.4f} cls {cls:.4f} "
                    f"cls by step {[round(c, 3) for c in cls_steps]} lr {lr:.2e}")
            if step % args.eval_every == 0:
                ev = evaluate(head, fr, ho_ex[:quick], ho_refs[:quick], H, step2=both)
                evals.append({"step": step, "minutes": round((time.time() - t_start) / 60, 2), "heldout_answers": quick, **ev})
                say(f"EVAL step {step}: {ev}")
                score = (ev["alpha_step1"] + ev["alpha_step2"]) / 2 if both else ev["alpha_step1"]
                if score > best:
                    best, best_state = score, {k: v.clone() for k, v in head.state_dict().items()}
        if done:
            break
    ev = evaluate(head, fr, ho_ex[:quick], ho_refs[:quick], H, step2=both)
    evals.append({"step": step, "minutes": round((time.time() - t_start) / 60, 2), "heldout_answers": quick, **ev})
    say(f"EVAL final step {step}: {ev}")
    final_score = (ev["alpha_step1"] + ev["alpha_step2"]) / 2 if both else ev["alpha_step1"]
    if best_state is not None and best > final_score:
        head.load_state_dict(best_state)
        say(f"kept the best evaluated head (score {best} on the quick evaluation)")
    head.eval()
    train_minutes = (time.time() - t_start) / 60
    # the shipped head is half precision: measure what ships
    head.load_state_dict({k: v.half().float() for k, v in head.state_dict().items()})
    ev_fp16 = evaluate(head, fr, ho_ex, ho_refs, H)
    say(f"EVAL fp16 head: {ev_fp16}")
    baseline = None if args.skip_measure else draft_model_scores(target, ho_recs)
    say(f"today's chat draft on the same held-out answers: {baseline}")
    c = {} if args.skip_measure else measure_c(target, tok, head, kept, ho_recs[0]["prompt_ids"])
    say(f"c: {c}")
    info = {
        "what": "chat preset EAGLE-style draft head for SmolLM2-135M-Instruct (engine/drafters/eagle.py)",
        "architecture": {"fuse": f"Linear(2x{H} -> {H}, bias)", "decoder_layers": args.layers,
                         "hidden": H, "intermediate": head.config.intermediate_size,
                         "heads": head.config.num_attention_heads, "kv_heads": head.config.num_key_value_heads,
                         "feature": "target's last decoder layer output (pre-norm); the target's frozen final norm "
                                    "and output layer (pruned to the chat draft's kept vocabulary) give q",
                         "kept_vocab": len(kept), "init": init},
        "parameters": n_params,
        "data": {"train_answers": len(train_recs), "train_answer_tokens": n_train_tok,
                 "heldout_answers": len(ho_recs), "heldout_positions": ev_fp16["positions"],
                 "sampling": "the target's own answers at temperature 1 (scripts/make_chat_distill_data.py), "
                             + args.data_note,
                 "features": f"{stored} training answers' features kept from the sampling passes; "
                             f"the rest and the held-out ones by teacher-forced batched passes ({feat_minutes:.1f} min)"},
        "training": {"loss": f"smooth L1 on normed features + {args.cls_weight} x soft CE vs target top-32",
                     "draft_steps_unrolled": args.ttt_steps, "step_decay": args.step_decay,
                     "selection": "alpha of steps 1 and 2, averaged" if both else "alpha of step 1",
                     "noise": args.noise, "lr": args.lr, "batch_tokens": args.batch_tokens, "steps": step,
                     "wall_minutes_total": round(train_minutes, 1), "threads": args.threads, "device": "cpu",
                     "curve": curve, "evals": evals},
        "measurements": {**{k: v for k, v in ev_fp16.items()},
                         "alpha_temperature_1": ev_fp16["alpha_step1"], "greedy_agreement": ev_fp16["greedy_step1"],
                         "method": "held-out answers teacher-forced; step1 = the target's feature in (the first draft "
                                   "step of a cycle), step2 = the head's predicted feature in",
                         **c, "machine": args.machine_note},
        "todays_chat_draft_same_heldout": baseline,
    }
    save_head(out, head, target.config, kept.tolist(), "chat-eagle", {"training": "training.json"})
    (out / "training.json").write_text(json.dumps(info, indent=1))
    say(f"saved to {out}")


if __name__ == "__main__":
    main()
