"""A small server-workload folder, written by `python -m engine client` itself against a live server:
what the replica's tests read."""
import json
from pathlib import Path

from engine.cli import main
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


def write_server_workload(server: LiveServer, folder: Path, prompts=PROMPTS, max_tokens: int = MAX_TOKENS,
                          sampling: tuple[float, float, int] = (0.0, 1.0, 0)) -> Path:
    """Send each prompt once, one at a time, as a user would with the client: greedy, or at
    `sampling`'s (temperature, top_p, seed)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    prompt_file = folder.parent / f"{folder.name}-prompts.jsonl"
    prompt_file.write_text("".join(json.dumps({"id": rid, "category": category, "prompt": text}) + "\n"
                                   for rid, category, text in prompts), encoding="utf-8")
    code = main(["client", "--url", server.url, "--prompts", str(prompt_file), "--out", str(folder),
                 "--max-tokens", str(max_tokens), "--temperature", str(sampling[0]), "--top-p", str(sampling[1]),
                 "--seed", str(sampling[2]), "--concurrency", "1",
                 "--speculative-config", json.dumps(server.speculative_config)])
    assert code == 0, f"engine client exited with {code}"
    return folder
