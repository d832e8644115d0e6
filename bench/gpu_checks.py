"""Correctness on a GPU: what the CPU tests prove, checked once on CUDA for the shipped presets.

    python -m bench.gpu_checks --preset tiny-shakespeare --preset chat
    python -m bench.gpu_checks --preset tiny-shakespeare --device cpu --dry-run --out /tmp/x.json   # try it

For each preset, in bfloat16 and in float32 (the engine's default):
  - greedy speculative output (K = 1, 4, 8) against plain greedy target decoding, token for token,
    reporting the first position where they part if they do;
  - after the run, both caches hold committed length - 1 positions (the engine's convention),
    and their keys/values against a fresh prefill of the committed sequence (max abs difference).
In half precision a verify pass over K+1 positions and a one-token step use different kernels, so
their logits differ in the last bits and a near tie can flip an argmax: that is a property of the
arithmetic, not of the algorithm, and this script measures how often it happens.

The fast path (engine/cycle/fast.py), for each capture mode (CUDA graph, torch.compile, none), at
T = 0 and 1 and K = 1, 4, 8: its tokens against the reference path run on the CPU in float32 with
the same seed (the claim: equal apart from near ties), the first difference and how near a tie it
was there (the CPU target's top-2 logit gap at that position; at T > 0 also the smallest
|u - acceptance probability| of that cycle), both caches' lengths and K/V against a fresh prefill,
and our plain decoding on the fast path against the reference plain decoding.
--dry-run (with --device cpu) runs every step with tiny sizes, to catch a typo before GPU time is spent.
Writes bench/results/gpu-checks.json and prints Markdown tables.
"""
import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from bench.common import PROMPTS, RESULTS
from engine.config import SpecSettings
from engine.cycle import fast as fast_path
from engine.cycle.pair import TokenTexts
from engine.cycle.plain import target_generate
from engine.cycle.reference import RunState, run_cycle, speculative_generate, start_run
from engine.kv.layouts import attended_kv, check_invariants, layout_for_run, new_cache
from engine.kv.ops import cache_len, prefill
from engine.models.presets import PRESETS
from engine.run import encode_prompt, load_preset

# Two of the speed benchmarks' prompts per preset, the first and the last.
CHECK_PROMPTS = {preset: PROMPTS[preset][0::2] for preset in ("chat", "tiny-shakespeare")}


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def greedy_run(pair, ids: list[int], k: int, max_new: int) -> RunState:
    s = SpecSettings(k=k, temperature=0.0, max_new_tokens=max_new, seed=0)
    gen = torch.Generator().manual_seed(0)
    state = start_run(pair, ids)
    texts = TokenTexts(pair.target.tokenizer)
    cycle = 0
    while not state.finished:
        run_cycle(pair, state, s, gen, cycle, texts, record=False)
        cycle += 1
    return state


def cache_gap(model, cache, committed: list[int]) -> float:
    """Largest |K/V difference| between a run's cache and a fresh prefill of the committed sequence
    (which, like the run's, holds every committed token but the last)."""
    fresh = prefill(model, committed)
    gap = 0.0
    for layer_run, layer_fresh in zip(cache.layers, fresh.layers):
        for run_t, fresh_t in ((layer_run.keys, layer_fresh.keys), (layer_run.values, layer_fresh.values)):
            gap = max(gap, float((run_t.float() - fresh_t.float()).abs().max()))
    return gap


def check(preset: str, dtype_name: str, max_new: int, device: str, prompts: list[str],
          ks: tuple[int, ...] = (1, 4, 8)) -> list[dict]:
    pair = load_preset(preset, device, dtype_name)
    chat = PRESETS[preset].use_chat_template
    rows = []
    for prompt in prompts:
        ids = encode_prompt(pair.target.tokenizer, prompt, chat)
        plain = target_generate(pair.target, ids, SpecSettings(k=1, temperature=0.0, max_new_tokens=max_new),
                                pair.eos_ids)
        for k in ks:
            state = greedy_run(pair, ids, k, max_new)
            keep = len(state.committed) - 1
            rows.append({"preset": preset, "dtype": str(pair.target.dtype).removeprefix("torch."), "prompt": prompt,
                         "k": k, "tokens": len(state.generated), "equal_to_plain_greedy": state.generated == plain,
                         "first_difference": first_difference(state.generated, plain),
                         "cache_lengths_ok": cache_len(state.target_cache) == keep == cache_len(state.draft_cache),
                         "target_kv_gap": cache_gap(pair.target, state.target_cache, state.committed),
                         "draft_kv_gap": cache_gap(pair.draft, state.draft_cache, state.committed)})
            print(rows[-1], flush=True)
    return rows


# ---------------------------------------------------------------- the fast path

NEAR_TIE_LOGIT_GAP = 1e-3
NEAR_TIE_U = 1e-4


def logit_gap(model, ids: list[int]) -> float:
    """Top-1 minus top-2 logit of the model's next token after `ids` (a fresh dynamic-cache forward)."""
    logits = model.forward(ids, model.new_cache())[-1]
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def cycle_of(records: list[dict], position: int) -> dict:
    """The record whose committed tokens hold generated position `position`."""
    seen = 0
    for rec in records:
        seen += len(rec["committed_token_ids"])
        if seen > position:
            return rec
    return records[-1]


def near_tie(cpu_pair, ids: list[int], ref: list[dict], generated: list[int], position: int) -> dict:
    """How close to a tie the reference was where the fast path parted from it."""
    gap = logit_gap(cpu_pair.target, ids + generated[:position])
    rec = cycle_of(ref, position)
    u_gap = min((abs(u - a) for u, a in zip(rec.get("u", []), rec.get("accept_prob", []))), default=None)
    tie = gap < NEAR_TIE_LOGIT_GAP or (u_gap is not None and u_gap < NEAR_TIE_U)
    return {"target_logit_gap": gap, "min_u_minus_accept_prob": u_gap, "near_tie": tie}


def kv_gap(model, cache, committed: list[int], s: SpecSettings, prompt_len: int) -> float:
    fresh = prefill(model, committed, new_cache(layout_for_run(s, prompt_len), model.model.config))
    gap = 0.0
    for (k_run, v_run), (k_new, v_new) in zip(attended_kv(cache), attended_kv(fresh)):
        gap = max(gap, float((k_run.float() - k_new.float()).abs().max()), float((v_run.float() - v_new.float()).abs().max()))
    return gap


def fast_run(pair, ids: list[int], s: SpecSettings, capture: str) -> tuple[list[dict], object]:
    state = fast_path.start_fast_run(pair, ids, s, capture)
    texts = TokenTexts(pair.target.tokenizer)
    records = []
    while not state.finished:
        records.append(fast_path.run_fast_cycle(pair, state, s, len(records), texts))
        for cache in (state.target_cache, state.draft_cache):
            check_invariants(cache)
    return records, state


def fast_rows(preset: str, dtype_name: str, device: str, captures: list[str], ks: list[int], max_new: int,
              prompts: list[str], cpu_pair, references: dict) -> list[dict]:
    """`references` caches the CPU reference runs across dtypes and capture modes."""
    pair = load_preset(preset, device, dtype_name)
    chat = PRESETS[preset].use_chat_template
    rows = []
    for prompt in prompts:
        ids = encode_prompt(pair.target.tokenizer, prompt, chat)
        for temperature in (0.0, 1.0):
            s = SpecSettings(k=1, temperature=temperature, max_new_tokens=max_new, seed=0, cache_layout="static")
            for k in [None, *ks]:
                if (prompt, temperature, k) not in references:
                    references[prompt, temperature, k] = (target_generate(cpu_pair.target, ids, s, set()) if k is None
                                                          else list(speculative_generate(cpu_pair, ids, replace(s, k=k))))
            for capture in captures:
                base = {"preset": preset, "dtype": dtype_name, "prompt": prompt, "temperature": temperature,
                        "capture": capture}
                try:
                    plain = fast_path.fast_plain_decode(pair.target, ids, s, set(), capture)
                    plain_ref = references[prompt, temperature, None]
                    diff = first_difference(plain, plain_ref)
                    rows.append({**base, "method": "plain", "k": None, "tokens": len(plain),
                                 "equal_to_cpu_reference": plain == plain_ref, "first_difference": diff,
                                 **(near_tie(cpu_pair, ids, [], plain_ref, diff) if diff is not None else {})})
                    print(rows[-1], flush=True)
                    for k in ks:
                        sk, ref = replace(s, k=k), references[prompt, temperature, k]
                        ref_tokens = [t for r in ref for t in r["committed_token_ids"]]
                        records, state = fast_run(pair, ids, sk, capture)
                        got = [t for r in records for t in r["committed_token_ids"]]
                        diff = first_difference(got, ref_tokens)
                        keep = len(state.committed) - 1
                        rows.append({**base, "method": "speculative", "k": k, "tokens": len(got), "cycles": len(records),
                                     "equal_to_cpu_reference": got == ref_tokens, "first_difference": diff,
                                     **(near_tie(cpu_pair, ids, ref, ref_tokens, diff) if diff is not None else {}),
                                     "cache_lengths_ok": int(state.target_cache.get_seq_length()) == keep
                                     == int(state.draft_cache.get_seq_length()),
                                     "target_kv_gap": kv_gap(pair.target, state.target_cache, state.committed, sk, len(ids)),
                                     "draft_kv_gap": kv_gap(pair.draft, state.draft_cache, state.committed, sk, len(ids))})
                        print(rows[-1], flush=True)
                except Exception as err:  # one failing capture mode must not cost the others
                    rows.append({**base, "method": "error", "error": f"{type(err).__name__}: {err}"[:300]})
                    print(rows[-1], flush=True)
    return rows


def fast_table(rows: list[dict]) -> str:
    lines = ["| preset | dtype | capture | T | method | K | tokens | equal to CPU reference | first difference "
             "| near tie there (logit gap, |u - accept prob|) | cache lengths | K/V gap target / draft |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["method"] == "error":
            lines.append(f"| {r['preset']} | {r['dtype']} | {r['capture']} | {r['temperature']:g} | ERROR: {r['error']} |")
            continue
        tie = "-" if r.get("first_difference") is None else (
            f"{r['near_tie']} ({r['target_logit_gap']:.2e}, {r['min_u_minus_accept_prob']})")
        kv = f"{r['target_kv_gap']:.1e} / {r['draft_kv_gap']:.1e}" if "target_kv_gap" in r else "-"
        lines.append(f"| {r['preset']} | {r['dtype']} | {r['capture']} | {r['temperature']:g} | {r['method']} "
                     f"| {r['k'] or '-'} | {r['tokens']} | {r['equal_to_cpu_reference']} | {r['first_difference']} "
                     f"| {tie} | {r.get('cache_lengths_ok', '-')} | {kv} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", action="append", choices=sorted(PRESETS))
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--out", default=str(RESULTS / "gpu-checks.json"))
    p.add_argument("--device", default="cuda", help="cuda; cpu only to try the script itself")
    p.add_argument("--dry-run", action="store_true", help="tiny sizes (8 tokens, 1 prompt, K 1 and 4): tries the script")
    p.add_argument("--captures", default="graph,none", help="fast-path capture modes to check on CUDA")
    p.add_argument("--skip-reference-checks", action="store_true", help="only the fast-path checks")
    args = p.parse_args()
    if args.dry_run:
        args.max_new_tokens = min(args.max_new_tokens, 8)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 1
    rows, fast = [], []
    captures = args.captures.split(",") if args.device == "cuda" else ["none"]
    ks = [1, 4] if args.dry_run else [1, 4, 8]
    for preset in args.preset or ["tiny-shakespeare"]:
        prompts = CHECK_PROMPTS[preset][:1] if args.dry_run else CHECK_PROMPTS[preset]
        cpu_pair, references = load_preset(preset, "cpu", None), {}  # the reference: the CPU path in float32
        for dtype_name in ("bfloat16", "float32") if args.device == "cuda" else ("float32",):
            if not args.skip_reference_checks:
                rows += check(preset, dtype_name, args.max_new_tokens, args.device, prompts, tuple(ks))
            fast += fast_rows(preset, dtype_name, args.device, captures, ks, args.max_new_tokens, prompts, cpu_pair,
                              references)
    out = Path(args.out)
    previous = json.loads(out.read_text()) if out.exists() else {}
    done = {(r["preset"], r["dtype"]) for r in rows + fast}
    rows = [r for r in previous.get("rows", []) if (r["preset"], r["dtype"]) not in done] + rows
    fast = [r for r in previous.get("fast_path_rows", []) if (r["preset"], r["dtype"]) not in done] + fast
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"gpu": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
                               "torch": torch.__version__,
                               "dry_run": args.dry_run,
                               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows,
                               "fast_path_rows": fast}, indent=1))
    print(fast_table(fast))
    print("| preset | dtype | prompt | K | tokens | equal to plain greedy | first difference | cache lengths | "
          "max K/V gap target | draft |\n|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['preset']} | {r['dtype']} | {r['prompt']!r} | {r['k']} | {r['tokens']} | {r['equal_to_plain_greedy']} "
              f"| {r['first_difference']} | {r['cache_lengths_ok']} | {r['target_kv_gap']:.2e} | {r['draft_kv_gap']:.2e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
