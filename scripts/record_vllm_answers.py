"""Record greedy answers of a live vLLM n-gram server into tests/server_samples/vllm_live_answers.jsonl.

The tests pin the lab's definitions to these answers (tests/test_vllm_answers.py). Prompts are chosen
so that the n-gram lookup sometimes finds nothing: then the server runs steps that draft no token, and
the answers show how it counts them. Run it from the repository root with the lab's Python:
    .venv/bin/python scripts/record_vllm_answers.py
"""
import json
import sys
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.models.presets import smollm2_folder  # noqa: E402
from engine.servers.launch import NGRAM_K3, start_vllm  # noqa: E402

OUT = ROOT / "tests" / "server_samples" / "vllm_live_answers.jsonl"
MAX_TOKENS = 48
PROMPTS = [
    "Count from one to ten in words, twice.",
    "Write the alphabet, then write it again.",
    "What is the capital of France?",
    "Repeat after me: the cat sat on the mat. The cat sat on the mat.",
    "Name three colours.",
]


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as answer:
        return json.loads(answer.read())


def main() -> None:
    server = start_vllm(smollm2_folder(), NGRAM_K3, model_name="smollm2", log=Path("/tmp/speclab-record-vllm.log"))
    try:
        lines = []
        for prompt in PROMPTS:
            body = {"model": "smollm2", "max_tokens": MAX_TOKENS, "temperature": 0, "return_token_ids": True,
                    "messages": [{"role": "user", "content": prompt}]}
            answer = post(f"{server.url}/v1/chat/completions", body)
            lines.append(json.dumps({"prompt": prompt, "request": body, "answer": answer}))
            print(prompt, "->", json.dumps(answer["metrics"]["speculative_decoding"]), flush=True)
        OUT.write_text("\n".join(lines) + "\n")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
