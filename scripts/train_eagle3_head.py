"""Train the chat preset's EAGLE-3 head (engine/drafters/eagle3.py) on the CPU, with the training-time test.

Data: the target's own answers to chat prompts with the hidden states after its layers 2, 15 and 27, kept
from the sampling passes (scripts/make_chat_distill_data.py --aux-layers), e.g.
    python -m scripts.make_chat_distill_data --heldout --prompts 24 --aux-layers 2,15,27 --out data/eagle3_heldout
    python -m scripts.make_chat_distill_data --tokens 150000 --aux-layers 2,15,27 --out data/eagle3_train
    python -m scripts.train_eagle3_head --end-utc 21:15

Draft vocabulary: the EAGLE-1 head's kept tokens (assets/models/chat-eagle/draft_vocab.json), so d2t and
t2d come from it. Warm start (warm_start): the head begins as the target's own layer after the deepest aux
layer, fed that layer's input, so its first step starts as a logit lens two layers short of the top; lm_head
and norm are the target's output rows and final norm, frozen unless --train-lm-head (on two shared cores the
17,812 x 576 output layer's gradient is the largest cost).

Training-time test (Li et al. 2025, EAGLE-3, arXiv 2503.01840): each batch unrolls --steps draft steps. Step 1
reads the entries (x_{t+1}, fc(a_t)) built from the target's hidden states; step j > 1 feeds (x_{t+j}, the
head's own step j-1 output at chain t) at position t+j-1, attending to the true entries 0..t and to its own
earlier steps of chain t only (the cache a cycle really has: test_eagle3_training.py checks it against the
engine). Loss at step j: soft cross-entropy against the target's top-32 distribution of token t+j+1
renormalised over the draft vocabulary, weighted by --decay^(j-1).

Evaluation on the held-out answers, teacher forced, against the target's full distribution recomputed here:
alpha at T=1 = mean over answer positions of sum_x min(p_target, q_head), and greedy agreement (the T=0
first-position acceptance), for draft steps 1..steps. Progress: <out>/progress.log.
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from engine.drafters.eagle3 import Eagle3Head, new_head, save_eagle3, spec_for

ROOT = Path(__file__).resolve().parent.parent
AUX = [2, 15, 27]  # vLLM's default for a 30-layer target: 2, L // 2, L - 3


# ---------------------------------------------------------------- examples

def new_records(folder: Path, seen: set[str]) -> list[dict]:
    """Records of the shards in `folder` not read yet (the sampler may still be writing more: training starts on
    the first shards and takes the others as they come); `seen` gains their names."""
    recs = []
    for shard in sorted(folder.glob("shard_*.pt")):
        if shard.name in seen:
            continue
        try:
            recs.extend(torch.load(shard))  # our own sampler's files (tensors, lists, strings)
        except Exception:  # a shard still being written: taken at the next look
            continue
        seen.add(shard.name)
    return recs


def make_example(rec: dict, to_draft: torch.Tensor) -> dict | None:
    """Entries t = 0..N-2 (N = P + T) read x_{t+1} and a_t; entry t's step-j output is scored on answer
    token t + j + 1 - P against the target's top-k there, renormalised over the draft vocabulary."""
    P, T = len(rec["prompt_ids"]), len(rec["answer_ids"])
    if T < 2:
        return None
    seq = torch.tensor(rec["prompt_ids"] + rec["answer_ids"])  # (N,)
    rows = to_draft[rec["topk_ids"].long()]  # (T, k) draft index, -1 outside the draft vocabulary
    p = rec["topk_lp"].float().exp() * (rows >= 0)
    mass = p.sum(-1, keepdim=True)
    return {"seq": seq, "aux": rec["feats"], "P": P, "T": T, "rows": rows.clamp(min=0),
            "p": (p / mass.clamp(min=1e-9)).half(), "has": (mass[:, 0] > 0)}


def collate(batch: list[dict]) -> dict:
    """Right-padded: tokens (B, N), aux (B, N-1, 3H); per (row, chain t) the answer index each step scores."""
    N = max(len(e["seq"]) for e in batch)
    B, D = len(batch), batch[0]["aux"].shape[-1]
    seq = torch.zeros((B, N), dtype=torch.long)
    aux = torch.zeros((B, N - 1, D))
    for i, e in enumerate(batch):
        seq[i, :len(e["seq"])] = e["seq"]
        aux[i, :len(e["aux"])] = e["aux"].float()
    return {"seq": seq, "aux": aux, "examples": batch}


def labels_for_step(batch: dict, j: int):
    """(rows, chains, draft rows (M, k), p (M, k)) for step j: chain t scores answer index t + j + 1 - P."""
    bi, ti, rows, ps = [], [], [], []
    for i, e in enumerate(batch["examples"]):
        idx = torch.arange(e["T"])
        idx = idx[e["has"]]
        t = idx + e["P"] - j - 1  # chain whose step j predicts answer token idx
        ok = (t >= 0) & (t <= len(e["seq"]) - 1 - j)  # the step's fed token x_{t+j} exists
        bi.append(torch.full((int(ok.sum()),), i))
        ti.append(t[ok])
        rows.append(e["rows"][idx[ok]])
        ps.append(e["p"][idx[ok]].float())
    return torch.cat(bi), torch.cat(ti), torch.cat(rows), torch.cat(ps)


# ---------------------------------------------------------------- the unrolled head

def step_inputs(head: Eagle3Head, embeds: torch.Tensor, fused: torch.Tensor, positions: torch.Tensor):
    """The layer up to attention: q (B, nh, T, d), k, v (B, nkv, T, d) roped at `positions` (B, T), residual (B, T, H)."""
    layer = head.body.layers[0]
    attn = layer.self_attn
    normed = layer.hidden_norm(fused)
    residual = normed if layer.norm_before_residual else fused
    x = torch.cat([layer.input_layernorm(embeds), normed], dim=-1)  # (B, T, 2H)
    B, T, _ = x.shape
    hd = head.config.head_dim
    q = attn.q_proj(x).view(B, T, -1, hd).transpose(1, 2)
    k = attn.k_proj(x).view(B, T, -1, hd).transpose(1, 2)
    v = attn.v_proj(x).view(B, T, -1, hd).transpose(1, 2)
    cos, sin = head.body.rotary_emb(x, positions)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    return q, k, v, residual


def step_output(head: Eagle3Head, attn_out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """(B, T, nh*d) attention output -> (B, T, H) the layer's output hidden (pre-norm)."""
    layer = head.body.layers[0]
    h = residual + layer.self_attn.o_proj(attn_out)
    return h + layer.mlp(layer.post_attention_layernorm(h))


def unrolled(head: Eagle3Head, embed: torch.nn.Module, seq: torch.Tensor, aux: torch.Tensor,
             steps: int) -> list[torch.Tensor]:
    """Output hiddens (B, T, H) of draft steps 1..steps for every chain t = 0..T-1 (T = N - 1).

    Step j's query at chain t attends to step 1's keys at 0..t (causal: the true entries) and to chain t's
    own keys of steps 2..j (the entries a cycle's later draft steps append), nothing else."""
    B, T = aux.shape[:2]
    nh, nkv = head.config.num_attention_heads, head.config.num_key_value_heads
    scale = head.config.head_dim ** -0.5
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    base = torch.arange(T).expand(B, T)
    padded = torch.cat([seq, seq.new_zeros(B, steps)], dim=1)  # tokens past the end feed id 0 (never scored)
    hidden = head.fc(aux)  # (B, T, H) g_t
    keys, values, outs = [], [], []
    for j in range(1, steps + 1):
        q, k, v, residual = step_inputs(head, embed(padded[:, j:j + T]), hidden, base + j - 1)
        k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)  # (B, nh, T, d)
        if j == 1:
            keys, values = [k], [v]
        else:
            keys.append(k)
            values.append(v)
        scores = (q @ keys[0].transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))  # (B, nh, T, T)
        own = [(q * kk).sum(-1, keepdim=True) * scale for kk in keys[1:]]  # (B, nh, T, 1) each
        w = torch.softmax(torch.cat([scores, *own], dim=-1), dim=-1)
        out = w[..., :T] @ values[0]
        for s, vv in enumerate(values[1:]):
            out = out + w[..., T + s:T + s + 1] * vv
        hidden = step_output(head, out.transpose(1, 2).reshape(B, T, -1), residual)
        outs.append(hidden)
    return outs


def loss_of(head: Eagle3Head, embed, batch: dict, steps: int, decay: float) -> tuple[torch.Tensor, list[float]]:
    outs = unrolled(head, embed, batch["seq"], batch["aux"], steps)
    total, parts = 0.0, []
    for j, h in enumerate(outs, start=1):
        bi, ti, rows, p = labels_for_step(batch, j)
        if not len(bi):
            parts.append(0.0)
            continue
        logq = F.log_softmax(head.draft_logits(h[bi, ti]).float(), dim=-1)  # (M, V_d)
        ce = -(p * logq.gather(1, rows)).sum(-1).mean()
        total = total + decay ** (j - 1) * ce
        parts.append(float(ce.detach()))
    return total, parts


# ---------------------------------------------------------------- evaluation

@torch.no_grad()
def evaluate(head: Eagle3Head, embed, target_model, examples: list[dict], draft_to_target: torch.Tensor,
             steps: int) -> dict:
    """alpha (T=1) and greedy agreement per draft step against the target's full distribution (teacher forced)."""
    sums = {f"{m}_step{j}": 0.0 for j in range(1, steps + 1) for m in ("alpha", "greedy")}
    counts = dict.fromkeys(range(1, steps + 1), 0)
    for e in examples:
        batch = collate([e])
        p_full = torch.softmax(target_model(batch["seq"]).logits[0].float(), -1)  # (N, V): distribution of token n+1
        outs = unrolled(head, embed, batch["seq"], batch["aux"], steps)
        P, N = e["P"], len(e["seq"])
        for j, h in enumerate(outs, start=1):
            t = torch.arange(max(P - j - 1, 0), N - j - 1)  # chains scored on answer tokens t + j + 1 >= P
            if not len(t):
                continue
            q = torch.zeros(len(t), p_full.shape[-1])
            q[:, draft_to_target] = torch.softmax(head.draft_logits(h[0, t]).float(), -1)
            p = p_full[t + j]  # the distribution of token t + j + 1
            sums[f"alpha_step{j}"] += float(torch.minimum(p, q).sum())
            sums[f"greedy_step{j}"] += float((q.argmax(-1) == p.argmax(-1)).sum())
            counts[j] += len(t)
    return {k: round(v / max(counts[int(k[-1])], 1), 4) for k, v in sums.items()} | {"positions": counts[1]}


# ---------------------------------------------------------------- warm start

def warm_start(head: Eagle3Head, target_model, draft_to_target: torch.Tensor, aux_layer_ids: list[int]) -> list[str]:
    """Start the head as the target's own next layer: fc selects the deepest aux hidden state a (after layer l),
    the head's layer is a copy of target layer l + 1 (its q/k/v reading the hidden half of the 2H input, the
    embedding half at zero), hidden_norm its input norm, and norm/lm_head the target's final norm and output
    rows. Step 1 then computes exactly the target's layer l + 1 over the same positions, so q starts as a
    'logit lens' two layers short of the top; training moves it from there. Returns what was copied."""
    H = head.config.hidden_size
    deepest = max(aux_layer_ids)
    block = sorted(aux_layer_ids).index(deepest)  # the aux states are side by side in layer order
    source = target_model.model.layers[deepest]  # 0-based: the layer that runs right after aux id `deepest`
    layer = head.body.layers[0]
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, block * H:(block + 1) * H] = torch.eye(H)
        for name in ("q_proj", "k_proj", "v_proj"):
            w = getattr(layer.self_attn, name).weight
            w.zero_()
            w[:, H:] = getattr(source.self_attn, name).weight
        layer.self_attn.o_proj.weight.copy_(source.self_attn.o_proj.weight)
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(layer.mlp, name).weight.copy_(getattr(source.mlp, name).weight)
        layer.hidden_norm.weight.copy_(source.input_layernorm.weight)
        layer.post_attention_layernorm.weight.copy_(source.post_attention_layernorm.weight)
        head.norm.weight.copy_(target_model.model.norm.weight)
        head.lm_head.weight.copy_(target_model.get_output_embeddings().weight[draft_to_target])
    return [f"fc selects aux id {deepest}", f"layer <- target layer {deepest} (0-based; q/k/v on the hidden half)",
            "norm <- target final norm", "lm_head <- target output rows of the draft vocabulary"]


# ---------------------------------------------------------------- main

def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", default=str(ROOT / "data" / "eagle3_train"))
    ap.add_argument("--heldout", default=str(ROOT / "data" / "eagle3_heldout"))
    ap.add_argument("--out", default=str(ROOT / "assets" / "models" / "chat-eagle3"))
    ap.add_argument("--eagle1", default=str(ROOT / "assets" / "models" / "chat-eagle"))
    ap.add_argument("--steps", type=int, default=3, help="draft steps unrolled (the training-time test)")
    ap.add_argument("--decay", type=float, default=0.8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--max-updates", type=int, default=100_000)
    ap.add_argument("--end-utc", default="", help="stop training at this UTC time, HH:MM")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--reload-every", type=int, default=20, help="look for new training shards this often (updates)")
    ap.add_argument("--train-lm-head", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "progress.log", "a")

    def say(msg: str) -> None:
        line = f"{time.strftime('%H:%M:%S', time.gmtime())} {msg}"
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.models.presets import smollm2_folder

    folder = smollm2_folder()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    tok = AutoTokenizer.from_pretrained(folder)
    vocab = json.loads((Path(args.eagle1) / "draft_vocab.json").read_text())
    kept = sorted(vocab["kept_token_ids"])
    draft_to_target = torch.tensor(kept)
    to_draft = torch.full((model.config.vocab_size,), -1, dtype=torch.long)
    to_draft[draft_to_target] = torch.arange(len(kept))

    from engine.models.loading import wrap_model
    target = wrap_model("SmolLM2-135M-Instruct", model, tok)
    spec = spec_for(target, kept, AUX, k=3, verifier_name="HuggingFaceTB/SmolLM2-135M-Instruct")
    head = new_head(spec)
    copied = warm_start(head, model, draft_to_target, AUX)
    head.lm_head.weight.requires_grad_(args.train_lm_head)
    head.norm.weight.requires_grad_(args.train_lm_head)
    embed = model.get_input_embeddings()

    seen: set[str] = set()
    train: list[dict] = []
    while not train:  # the sampler may not have written its first shard yet
        train = [e for e in (make_example(r, to_draft) for r in new_records(Path(args.train), seen)) if e is not None]
        if not train:
            say(f"waiting for training shards in {args.train}")
            time.sleep(60)
    held = [e for e in (make_example(r, to_draft) for r in new_records(Path(args.heldout), set())) if e is not None]
    say(f"train {len(train)} answers, {sum(e['T'] for e in train)} answer tokens; held-out {len(held)}; "
        f"warm start: {copied}")
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    end = None
    if args.end_utc:
        hh, mm = map(int, args.end_utc.split(":"))
        now = time.gmtime()
        end = time.time() + ((hh * 60 + mm) - (now.tm_hour * 60 + now.tm_min)) * 60 - now.tm_sec
    ev0 = evaluate(head.eval(), embed, model, held, draft_to_target, args.steps)
    say(f"before training: {ev0}")
    curve, update, t0 = [{"update": 0, **ev0}], 0, time.time()
    order: list[int] = []
    while update < args.max_updates and (end is None or time.time() < end):
        if update % args.reload_every == 0 and update:
            more = [e for e in (make_example(r, to_draft) for r in new_records(Path(args.train), seen)) if e is not None]
            if more:
                train += more
                order += random.sample(range(len(train) - len(more), len(train)), len(more))
                say(f"update {update}: {len(more)} more answers, {len(train)} in all")
        if len(order) < args.batch:
            order = list(range(len(train)))
            random.shuffle(order)
        idx, order = order[:args.batch], order[args.batch:]
        head.train()
        loss, parts = loss_of(head, embed, collate([train[i] for i in idx]), args.steps, args.decay)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        update += 1
        if update % 10 == 0:
            say(f"update {update}: loss {float(loss):.3f} per step {[round(x, 3) for x in parts]} "
                f"({(time.time() - t0) / update:.1f} s/update)")
        if update % args.eval_every == 0:
            ev = evaluate(head.eval(), embed, model, held, draft_to_target, args.steps)
            curve.append({"update": update, **ev})
            say(f"eval at {update}: {ev}")
    ev = evaluate(head.eval(), embed, model, held, draft_to_target, args.steps)
    curve.append({"update": update, **ev})
    say(f"final eval at {update}: {ev}")
    save_eagle3(out, head, spec, kept, dtype=torch.float16)
    info = {
        "head": "EAGLE-3 (Li et al. 2025, arXiv 2503.01840), speculators format, float16",
        "target": "SmolLM2-135M-Instruct (30 layers, hidden 576, vocab 49152)",
        "trained_positions": max(len(e["seq"]) for e in train),  # prompt + answer (speculators_format.py)
        "aux_layer_ids": AUX, "draft_vocab": {"size": len(kept), "from": "assets/models/chat-eagle/draft_vocab.json"},
        "data": {"train_answers": len(train), "train_answer_tokens": sum(e["T"] for e in train), "heldout_answers": len(held),
                 "heldout_positions": ev["positions"], "source": "the target's own sampled answers (T=1) to chat "
                 "prompts, scripts/make_chat_distill_data.py --aux-layers 2,15,27"},
        "training": {"updates": update, "batch": args.batch, "lr": args.lr, "ttt_steps": args.steps,
                     "decay": args.decay, "lm_head_trained": args.train_lm_head, "warm_start": copied,
                     "seconds": round(time.time() - t0), "threads": args.threads, "curve": curve},
        "measurements": {"greedy_agreement": ev["greedy_step1"], "alpha_temperature_1": ev["alpha_step1"],
                         "per_step": ev, "how": "held-out answers, teacher forced, against the target's full "
                         "distribution: greedy agreement is the T=0 first-position acceptance, alpha = sum_x "
                         "min(p, q) the T=1 one; step j > 1 reads the head's own hiddens"},
    }
    (out / "training.json").write_text(json.dumps(info, indent=1))
    say("saved")


if __name__ == "__main__":
    main()
