"""Greedy speculation on the compiled CPU fast path against greedy plain decoding, eager, token for token.

    python -m bench.compile_agreement                       # chat and tiny-shakespeare, float32, own decoder
    python -m bench.compile_agreement --dtypes float32,bfloat16 --decoder hf

Compiled, inductor fuses and orders the arithmetic its own way, and the verify (K+1 positions) and
a one-token step are different graphs, so a near tie in the target's argmax could flip between
them. This counts, per prompt, the tokens before the first difference between `run --fast --capture
compile` at temperature 0 and the engine's eager plain decoding of the same target (reference
path): a number, not a test, because the answer depends on the CPU's kernels.

Writes RESULTS/compile-agreement-CPU.json and .md.
"""
import argparse
from pathlib import Path

import torch

from bench import common
from engine.config import SpecSettings
from engine.cycle import fast as fp
from engine.cycle.plain import target_generate
from engine.kv.layouts import layout_for_run
from engine.models.presets import PRESETS
from engine.run import encode_prompt, load_preset
from engine.trace.schema import DECODER_OWN, DECODERS

KS = {"chat": 2, "tiny-shakespeare": 4}


def first_difference(a: list[int], b: list[int]) -> int:
    """How many leading tokens agree (where one sequence ends before the other, they differ there)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def agreement(preset: str, dtype: str, decoder: str, prompts: int, tokens: int) -> dict:
    pair = load_preset(preset, device="cpu", dtype_name=dtype, decoder=decoder)
    s = SpecSettings(k=KS[preset], temperature=0, max_new_tokens=tokens, cache_layout="static")
    ids = [encode_prompt(pair.target.tokenizer, p, PRESETS[preset].use_chat_template)
           for p in common.prompts_for(preset, prompts)]
    models = fp.FastModels.empty(pair, s.k, max(layout_for_run(s, len(i)).capacity for i in ids), "compile")
    agreed, lengths = [], []
    for prompt_ids in ids:  # both stop at the preset's EOS, so a run's length is part of what must agree
        spec = [t for r in fp.fast_generate(pair, prompt_ids, s, models=models) for t in r["committed_token_ids"]]
        plain = target_generate(pair.target, prompt_ids, s, pair.eos_ids)
        agreed.append(first_difference(spec, plain))  # a run that ended before the other differs there
        lengths.append(len(plain))
    return {"preset": preset, "dtype": dtype, "decoder": decoder, "k": s.k, "agreed": agreed, "plain_tokens": lengths}


def markdown(r: dict) -> str:
    lines = ["## Greedy speculation, compiled on the CPU, against eager greedy plain decoding (bench/compile_agreement.py)",
             "", f"Machine: {common.machine_words(r['machine'])}; torch {r['machine']['torch']}; {r['machine']['date']}.",
             "", "| preset | dtype | decoder | K | tokens agreeing before the first difference, per prompt |",
             "|---|---|---|---|---|"]
    for row in r["rows"]:
        lines.append(f"| {row['preset']} | {row['dtype']} | {row['decoder']} | {row['k']} | "
                     + ", ".join(f"{a} of {n}" for a, n in zip(row["agreed"], row["plain_tokens"])) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", default="chat,tiny-shakespeare")
    p.add_argument("--dtypes", default="float32,bfloat16", help="bfloat16 needs avx512_bf16, AMX or the rows kernel")
    p.add_argument("--decoder", choices=DECODERS, default=DECODER_OWN)
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(common.RESULTS))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = [agreement(preset, dtype, args.decoder, args.prompts, args.max_new_tokens)
            for preset in args.presets.split(",") for dtype in args.dtypes.split(",")]
    result = {"machine": common.machine_info(args.threads), "rows": rows}
    text = markdown(result)
    common.write_results(Path(args.out), f"compile-agreement-{common.cpu_tag(result['machine'])}", result, text)
    print(text)


if __name__ == "__main__":
    main()
