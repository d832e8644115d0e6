"""The capture under memory pressure: a live vLLM with a tiny paged cache (five 128-token blocks, the fewest a
512-token context starts with) and a 32-token step budget, so long prompts are prefilled in chunks and
concurrent requests get preempted.

A chunked prefill is still one cycle, from where its first chunk started to the prompt's end (the convention
says so); a preempted request's trace keeps its cycles before the preemption and its manifest entry says why it
stops, because vLLM's recompute of prompt and output in one prefill is no lab cycle. Every trace loads."""
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from bench.vllm_draft_model import MODEL_NAME, post
from engine.models.presets import smollm2_folder
from engine.servers.launch import NGRAM_K3, start_vllm
from engine.trace import load_trace
from tests.live_vllm import require_vllm_env
from vllm_capture.speclab_vllm_capture import recorder as rec

PROMPTS = ["List the days of the week, then list them again in the same order, then once more.",
           "Write the numbers from one to forty in words, separated by commas.",
           "Explain how a bicycle works, step by step, in detail.",
           "Describe the water cycle in detail, step by step.",
           "Write a long story about a dragon who learns to bake bread."]
BUDGET = 32  # tokens per step: every prompt here (over 40 tokens with the chat template) needs two chunks


@pytest.fixture(scope="module")
def pressed(tmp_path_factory):
    """The answers to PROMPTS sent at once, and the manifest's entries with their traces (loaded, so checked)."""
    require_vllm_env()
    folder = tmp_path_factory.mktemp("pressure")
    server = start_vllm(smollm2_folder(), NGRAM_K3, model_name=MODEL_NAME, max_model_len=512, log=folder / "server.log",
                        extra_args=["--num-gpu-blocks-override", "5", "--max-num-batched-tokens", str(BUDGET)],
                        env={"SPECLAB_CAPTURE_DIR": str(folder / "traces")})
    try:
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            answers = list(pool.map(lambda p: post(f"{server.url}/v1/chat/completions", {
                "model": MODEL_NAME, "max_tokens": 160, "temperature": 0, "return_token_ids": True,
                "messages": [{"role": "user", "content": p}]}), PROMPTS))
    finally:
        server.stop()
    entries = json.loads((folder / "traces" / rec.MANIFEST).read_text())["traces"]
    return answers, [(e, load_trace(folder / "traces" / e["file"], allow_incomplete=True)) for e in entries]


def test_a_chunked_prefill_is_one_cycle_from_the_first_chunk(pressed):
    _, traces = pressed
    assert len(traces) == len(PROMPTS)
    for _, trace in traces:
        prompt = len(trace.header["prompt_token_ids"])
        assert prompt > BUDGET  # so vLLM prefilled it in chunks
        first = trace.cycles[0]
        assert first["target_cache_len"]["after_append"] == prompt
        assert first["verify_positions"] == prompt - first["target_cache_len"]["before"]
        assert first["target_cache_len"]["before"] < prompt - BUDGET  # not just the last chunk


def test_a_preempted_request_keeps_its_cycles_and_says_why_it_stops(pressed):
    answers, traces = pressed
    preempted = [(e, t) for e, t in traces if not e["complete"]]
    assert preempted, "640 cached tokens for five requests of about 200 must preempt one"
    by_prompt = {tuple(a["prompt_token_ids"]): a["choices"][0]["token_ids"] for a in answers}
    for entry, trace in preempted:
        assert entry["ended"].startswith("preempted") and not trace.complete
        generated = [t for c in trace.cycles for t in c["committed_token_ids"]]
        assert generated and by_prompt[tuple(trace.header["prompt_token_ids"])][:len(generated)] == generated
    for entry, trace in traces:
        if entry["complete"]:
            assert trace.summary["generated_token_ids"] == by_prompt[tuple(trace.header["prompt_token_ids"])]
