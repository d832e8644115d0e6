"""A small server-workload folder, written from a live server with the standard library, in the format
`python -m engine client` writes (manifest.json and answers.jsonl): what the replica's tests read."""
import json
import time
import urllib.request
from pathlib import Path

from engine.servers.launch import LiveServer

# Greedy chat requests whose answers repeat their prompts, so that n-gram lookup drafts often.
PROMPTS = [
    ("count-twice", "lists", "Count from one to ten in words, twice."),
    ("repeat-fox", "rewrite", "Repeat this sentence three times: The quick brown fox jumps over the lazy dog."),
    ("days-twice", "lists", "List the days of the week, then list them again in the same order."),
    ("hello-five", "rewrite", "Write the word hello five times, separated by commas."),
    ("colours", "qa", "Name three primary colours and say each one again in a sentence."),
]
MAX_TOKENS = 40


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as answer:
        return json.loads(answer.read())


def write_server_workload(server: LiveServer, folder: Path, prompts=PROMPTS, max_tokens: int = MAX_TOKENS) -> Path:
    """Send each prompt once, in order, and write the folder as the client does."""
    folder.mkdir(parents=True, exist_ok=True)
    lines, requests = [], []
    for rid, category, text in prompts:
        body = {"model": server.model_name, "messages": [{"role": "user", "content": text}],
                "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True}
        started = time.perf_counter()
        answer = post(f"{server.url}/v1/chat/completions", body)
        lines.append({"id": rid, "category": category, "request": body, "answer": answer,
                      "elapsed_s": time.perf_counter() - started})
        requests.append({"id": rid, "category": category, "status": "done", "error": None})
    (folder / "answers.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    manifest = {"format": "speclab-server-workload", "version": 1, "url": server.url, "endpoint": "chat",
                "server": {"kind": "vLLM", "version": None, "model": server.model_name,
                           "model_root": server.args[server.args.index("--model") + 1]},
                "speculative_config": server.speculative_config, "speculative_config_source": "launch",
                "settings": {"max_tokens": max_tokens, "temperature": 0, "top_p": 1.0, "seed": None,
                             "concurrency": 1, "timeout_s": 300, "retries": 0},
                "prompts": "tests", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "requests": requests, "scrapes": {"before": "metrics-before.prom", "after": "metrics-after.prom"}}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return folder
