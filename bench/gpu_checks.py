"""Correctness on a GPU: what the CPU tests prove, checked once on CUDA for the shipped presets.

    python bench/gpu_checks.py --preset tiny-shakespeare --preset chat

For each preset, in bfloat16 and in float32 (the engine's default):
  - greedy speculative output (K = 1, 4, 8) against plain greedy target decoding, token for token,
    reporting the first position where they part if they do;
  - after the run, both caches hold committed length - 1 positions (the engine's convention),
    and their keys/values against a fresh prefill of the committed sequence (max abs difference).
In half precision a verify pass over K+1 positions and a one-token step use different kernels, so
their logits differ in the last bits and a near tie can flip an argmax: that is a property of the
arithmetic, not of the algorithm, and this script measures how often it happens.
Writes bench/results/gpu-checks.json and prints a Markdown table.
"""
import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402

from engine.config import SpecSettings  # noqa: E402
from engine.presets import PRESETS  # noqa: E402
from engine.run import encode_prompt, load_preset  # noqa: E402
from engine.speculative import RunState, cache_len, prefill, run_cycle, start_run, target_generate, TokenTexts  # noqa: E402

PROMPTS = {"chat": ["Explain why the sky is blue in two sentences.", "Give me three tips for a job interview."],
           "tiny-shakespeare": ["Romeo.\n", "Enter a Messenger.\n"]}


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


def check(preset: str, dtype_name: str, max_new: int, device: str) -> list[dict]:
    pair = load_preset(preset, device, dtype_name)
    chat = PRESETS[preset].use_chat_template
    rows = []
    for prompt in PROMPTS[preset]:
        ids = encode_prompt(pair.target.tokenizer, prompt, chat)
        plain = target_generate(pair.target, ids, SpecSettings(k=1, temperature=0.0, max_new_tokens=max_new),
                                pair.eos_ids)
        for k in (1, 4, 8):
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", action="append", choices=sorted(PRESETS))
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--out", default=str(HERE / "results" / "gpu-checks.json"))
    p.add_argument("--device", default="cuda", help="cuda; cpu only to try the script itself")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 1
    rows = []
    for preset in args.preset or ["tiny-shakespeare"]:
        for dtype_name in ("bfloat16", "float32") if args.device == "cuda" else ("float32",):
            rows += check(preset, dtype_name, args.max_new_tokens, args.device)
    out = Path(args.out)
    old = json.loads(out.read_text())["rows"] if out.exists() else []
    done = {(r["preset"], r["dtype"]) for r in rows}
    rows = [r for r in old if (r["preset"], r["dtype"]) not in done] + rows
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"gpu": torch.cuda.get_device_name() if args.device == "cuda" else args.device, "torch": torch.__version__,
                               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}, indent=1))
    print("| preset | dtype | prompt | K | tokens | equal to plain greedy | first difference | cache lengths | "
          "max K/V gap target | draft |\n|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['preset']} | {r['dtype']} | {r['prompt']!r} | {r['k']} | {r['tokens']} | {r['equal_to_plain_greedy']} "
              f"| {r['first_difference']} | {r['cache_lengths_ok']} | {r['target_kv_gap']:.2e} | {r['draft_kv_gap']:.2e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
