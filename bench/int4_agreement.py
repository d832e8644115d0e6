"""How far the int4 target path is from the float32 one: the largest |delta p| and greedy agreement.

    python -m bench.int4_agreement --threads 2
    python -m bench.int4_agreement --weights int4-a8   # the same blocks with 8-bit activations

For each chat prompt (bench/common.py's, and the preset's example prompt):
- greedy plain decoding of --max-new-tokens tokens on each weights path; the tokens they share
  before the first difference, and whether all agree;
- along the float32 path's greedy sequence (prompt and its tokens, teacher-forced), every
  position's distribution at temperature 1 on both paths: the largest |p_float32(x) - p_int4(x)|
  over positions and tokens, and the largest logit difference.
Writes RESULTS/int4-agreement.json and .md (int4-a8-agreement for --weights int4-a8).
"""
import argparse
from pathlib import Path

import torch

from bench import common
from engine.config import SpecSettings
from engine.cycle.plain import target_generate
from engine.models.presets import PRESETS
from engine.run import encode_prompt, load_preset
from engine.trace.schema import GGUF_WEIGHTS, WEIGHTS_FLOAT32, WEIGHTS_INT4


def shared_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def prompt_row(pair, prompt: str, max_new_tokens: int, other: str) -> dict:
    target = pair.target
    ids = encode_prompt(target.tokenizer, prompt, True)
    s = SpecSettings(k=1, temperature=0.0, max_new_tokens=max_new_tokens)
    greedy, logits = {}, {}
    for w in (WEIGHTS_FLOAT32, other):
        target.use_weights(w)
        greedy[w] = target_generate(target, ids, s, set())
    sequence = ids + greedy[WEIGHTS_FLOAT32][:-1]
    for w in (WEIGHTS_FLOAT32, other):
        target.use_weights(w)
        logits[w] = target.forward(sequence, target.new_cache())[len(ids) - 1:]  # (new tokens, V)
    probs = {w: torch.softmax(v.double(), dim=-1) for w, v in logits.items()}
    return {"prompt": prompt, "tokens": len(greedy[WEIGHTS_FLOAT32]),
            "shared_prefix": shared_prefix(greedy[WEIGHTS_FLOAT32], greedy[other]),
            "all_agree": greedy[WEIGHTS_FLOAT32] == greedy[other],
            "max_abs_dp": (probs[WEIGHTS_FLOAT32] - probs[other]).abs().max().item(),
            "mean_abs_dp": (probs[WEIGHTS_FLOAT32] - probs[other]).abs().max(-1).values.mean().item(),
            "max_abs_dlogit": (logits[WEIGHTS_FLOAT32] - logits[other]).abs().max().item()}


def markdown(result: dict) -> str:
    lines = [f"## The {result['weights']} target path against float32 (bench/int4_agreement.py)", "",
             f"Machine: {common.machine_words(result['machine'])}. Greedy plain decoding, "
             f"{result['max_new_tokens']} new tokens per prompt, no EOS stop; |delta p| at temperature 1 along "
             "the float32 path's greedy sequence.", "",
             "| prompt | tokens agreeing before the first difference | all agree | max abs delta p "
             "| mean over positions of the largest abs delta p | max abs delta logit |",
             "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['prompt']} | {r['shared_prefix']} of {r['tokens']} | {'yes' if r['all_agree'] else 'no'} "
                     f"| {r['max_abs_dp']:.2e} | {r.get('mean_abs_dp', float('nan')):.2e} | {r['max_abs_dlogit']:.2e} |")
    lines += ["", f"Over all prompts: largest |delta p| {result['max_abs_dp']:.2e}; greedy outputs equal on "
              f"{result['prompts_agreeing']} of {len(result['rows'])} prompts."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--weights", choices=GGUF_WEIGHTS, default=WEIGHTS_INT4, help="the path compared with float32")
    p.add_argument("--out", default=str(common.RESULTS))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    pair = load_preset("chat", "cpu", target_weights=args.weights)
    prompts = [*common.PROMPTS["chat"], PRESETS["chat"].example_prompt]
    rows = [prompt_row(pair, prompt, args.max_new_tokens, args.weights) for prompt in dict.fromkeys(prompts)]
    result = {"machine": common.machine_info(args.threads), "weights": args.weights,
              "max_new_tokens": args.max_new_tokens, "rows": rows,
              "max_abs_dp": max(r["max_abs_dp"] for r in rows), "prompts_agreeing": sum(r["all_agree"] for r in rows)}
    common.write_results(Path(args.out), f"{args.weights}-agreement", result, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
