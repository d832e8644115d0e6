"""How far the int4 target path is from the float32 one: the largest |delta p| and greedy agreement.

    python -m bench.int4_agreement --threads 2
    python -m bench.int4_agreement --weights int4-a8   # the same blocks with 8-bit activations
    python -m bench.int4_agreement --llama-python VENV/bin/python   # each path against llama.cpp's logits too

For each chat prompt (bench/common.py's, and the preset's example prompt):
- greedy plain decoding of --max-new-tokens tokens on each weights path; the tokens they share
  before the first difference, and whether all agree;
- along the float32 path's greedy sequence (prompt and its tokens, teacher-forced), every
  position's distribution at temperature 1 on both paths: the largest |p_float32(x) - p_int4(x)|
  over positions and tokens, and the largest logit difference.
With --llama-python (a Python with llama-cpp-python, bench/build_llama_cpp.sh), every path's distributions
along the same sequence are also set against llama.cpp's of the same GGUF file (bench/llama_logits.py).
Writes RESULTS/int4-agreement.json and .md (int4-a8-agreement for --weights int4-a8).
"""
import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch

from bench import common
from engine.config import SpecSettings
from engine.cycle.plain import target_generate
from engine.models.presets import PRESETS
from engine.run import encode_prompt, load_preset
from engine.trace.schema import GGUF_WEIGHTS, TARGET_WEIGHTS, WEIGHTS_FLOAT32, WEIGHTS_INT4


def shared_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def llama_logits(python: str, gguf: Path, ids: list[int], threads: int) -> torch.Tensor:
    """llama.cpp's logits after every position of `ids` (bench/llama_logits.py in llama-cpp-python's Python)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "logits.npy"
        subprocess.run([python, str(Path(__file__).with_name("llama_logits.py")), str(gguf), str(threads),
                        json.dumps(ids), str(out)], check=True, capture_output=True)
        return torch.from_numpy(np.load(out))


def against_llama(target, sequence: list[int], start: int, reference: torch.Tensor) -> dict:
    """Each weights path's distributions along `sequence` (from `start`) set against llama.cpp's."""
    q = torch.softmax(reference[start:].double(), dim=-1)
    rows, now = {}, target.weights
    for w in TARGET_WEIGHTS:
        target.use_weights(w)
        p = torch.softmax(target.forward(sequence, target.new_cache())[start:].double(), dim=-1)
        gap = (p - q).abs().max(-1).values  # per position
        rows[w] = {"max_abs_dp": gap.max().item(), "mean_abs_dp": gap.mean().item(),
                   "argmax_agree": (p.argmax(-1) == q.argmax(-1)).double().mean().item()}
    target.use_weights(now)
    return rows


def prompt_row(pair, prompt: str, max_new_tokens: int, other: str, llama: tuple | None = None) -> dict:
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
    versus = None if llama is None else against_llama(target, sequence, len(ids) - 1,
                                                      llama_logits(*llama[:2], sequence, llama[2]))
    return {"prompt": prompt, "against_llama_cpp": versus, "tokens": len(greedy[WEIGHTS_FLOAT32]),
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
    if any(r.get("against_llama_cpp") for r in result["rows"]):
        lines += ["", "Against llama.cpp's own distributions of the same GGUF file along the same sequences "
                  "(largest |delta p| per position: its mean and its largest; how often the argmax agrees):", "",
                  "| prompt | path | mean largest abs delta p | max abs delta p | argmax agrees |", "|---|---|---|---|---|"]
        for r in result["rows"]:
            for w, v in (r.get("against_llama_cpp") or {}).items():
                lines.append(f"| {r['prompt']} | {w} | {v['mean_abs_dp']:.2e} | {v['max_abs_dp']:.2e} "
                             f"| {v['argmax_agree']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--weights", choices=GGUF_WEIGHTS, default=WEIGHTS_INT4, help="the path compared with float32")
    p.add_argument("--llama-python", default=None, help="a Python with llama-cpp-python (bench/build_llama_cpp.sh)")
    p.add_argument("--out", default=str(common.RESULTS))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    pair = load_preset("chat", "cpu", target_weights=args.weights)
    prompts = [*common.PROMPTS["chat"], PRESETS["chat"].example_prompt]
    llama = (args.llama_python, pair.target.gguf_file, args.threads) if args.llama_python else None
    rows = [prompt_row(pair, prompt, args.max_new_tokens, args.weights, llama) for prompt in dict.fromkeys(prompts)]
    result = {"machine": common.machine_info(args.threads), "weights": args.weights,
              "max_new_tokens": args.max_new_tokens, "rows": rows,
              "max_abs_dp": max(r["max_abs_dp"] for r in rows), "prompts_agreeing": sum(r["all_agree"] for r in rows)}
    common.write_results(Path(args.out), f"{args.weights}-agreement", result, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
