"""Where plain int4 decoding's time goes, ours and llama.cpp's: the prompt's evaluation, then each new token.

    python -m bench.prompt_split --llama-python VENV/bin/python --threads 2

For each chat prompt (chat template on) and each way, interleaved round by round: the time to evaluate the prompt,
and the whole run of --max-new-tokens greedy tokens; a token's cost is (whole - prompt) / tokens. Our ways are the
compiled fast path on the own decoder (bench/fast_bench.py's e) over --target-weights int4 and int4-a8, whose
prompt runs eager (engine/kv/ops.py prefill); llama.cpp's is bench/llama_anchor.py on the same GGUF file.
Results: RESULTS/prompt-split-CPU.json and .md.
"""
import argparse
import statistics
import time
from pathlib import Path

import torch

from bench import common
from bench.speed import LlamaAnchor
from engine.config import SpecSettings
from engine.cycle.fast import FastPlainModel, fast_plain_decode
from engine.kv.ops import prefill
from engine.run import encode_prompt, load_preset
from engine.trace.schema import DECODER_OWN, GGUF_WEIGHTS


def ours(target, weights: str, ids: list[int], s: SpecSettings, model: FastPlainModel) -> tuple[float, float]:
    """(prompt seconds, whole-run seconds) on one weights path, the same static cache for both."""
    target.use_weights(weights)
    for layer in model.cache.layers:
        layer.cumulative_length.zero_()
    start = time.perf_counter()
    prefill(target, ids, model.cache)
    prompt_s = time.perf_counter() - start
    start = time.perf_counter()
    fast_plain_decode(target, ids, s, set(), model=model)
    return prompt_s, time.perf_counter() - start


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-python", required=True, help="a Python with llama-cpp-python (bench/build_llama_cpp.sh)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--out", type=Path, default=common.RESULTS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    machine = common.machine_info(args.threads)
    target = load_preset("chat", device="cpu", target_weights=GGUF_WEIGHTS[0]).target
    target.use_decoder(DECODER_OWN)
    s = SpecSettings(k=1, temperature=0.0, max_new_tokens=args.max_new_tokens, cache_layout="static")
    prompts = [encode_prompt(target.tokenizer, text, True) for text in common.prompts_for("chat", args.prompts)]
    model = FastPlainModel.empty(target, max(len(i) for i in prompts) + args.max_new_tokens + 1, "compile")
    llama = LlamaAnchor(args.llama_python, target.gguf_file, args.threads)
    ways = [*GGUF_WEIGHTS, "llama.cpp"]
    times = {w: {"prompt_ms": [], "token_ms": []} for w in ways}
    with torch.inference_mode():
        for w in GGUF_WEIGHTS:  # compile each path's graph before timing
            ours(target, w, prompts[0], s, model)
        for _ in range(args.repeats):
            for ids in prompts:
                for w in ways:
                    if w == "llama.cpp":
                        prompt_s = llama.prompt_seconds(ids)
                        whole_s = llama.run(ids, s)[1]
                    else:
                        prompt_s, whole_s = ours(target, w, ids, s, model)
                    times[w]["prompt_ms"].append(prompt_s * 1e3)
                    times[w]["token_ms"].append((whole_s - prompt_s) / args.max_new_tokens * 1e3)
    llama.close()
    lengths = [len(i) for i in prompts]
    lines = ["## Plain int4 decoding: the prompt and each token, ours and llama.cpp's (bench/prompt_split.py)", "",
             f"Machine: {common.machine_words(machine)}; {machine['date']}. Chat prompts of {min(lengths)}-{max(lengths)} "
             f"tokens, {args.max_new_tokens} greedy tokens, {args.repeats} rounds, the ways interleaved; medians "
             "(range in brackets). Ours: compiled fast path, own decoder, the prompt eager.", "",
             "| way | prompt (ms) | a new token (ms) | tokens/s over the run |", "|---|---|---|---|"]
    for w in ways:
        pr, tk = times[w]["prompt_ms"], times[w]["token_ms"]
        rate = args.max_new_tokens / (statistics.median(pr) + args.max_new_tokens * statistics.median(tk)) * 1e3
        lines.append(f"| {w} | {statistics.median(pr):.1f} ({min(pr):.1f}-{max(pr):.1f}) | {statistics.median(tk):.2f} "
                     f"({min(tk):.2f}-{max(tk):.2f}) | {rate:.0f} |")
    text = "\n".join(lines) + "\n"
    common.write_results(args.out, f"prompt-split-{common.cpu_tag(machine)}",
                         {"machine": machine, "prompt_lengths": lengths, "times": times}, text)
    print(text)


if __name__ == "__main__":
    main()
