"""The requests a diagnosis runs: the bundled prompt set, the first N of each category, and the
unrelated text the context-length experiment puts before each request.

`python -m engine diagnose` (engine/cli/diagnose.py), the app's live diagnosis (app/runs/diagnose.py)
and bench/agreement_probe.py read their requests through here.

May import: engine.config, engine.workload (the prompt files). No torch: a tokenizer is passed in.
"""
import json
from pathlib import Path

from engine.config import SettingsError
from engine.diagnose.experiments import CONTEXT_TOKENS
from engine.workload.prompts import BUNDLED_PROMPT_SET, Request

ROOT = Path(__file__).resolve().parents[2]
PROMPT_SET = BUNDLED_PROMPT_SET
LONG_TEXT = ROOT / "assets" / "prompts" / "long-context.jsonl"


def per_category(requests: list[Request], n: int | None) -> list[Request]:
    if n is None:
        return requests
    if n < 1:
        raise SettingsError("--per-category must be at least 1")
    seen: dict[str, int] = {}
    kept = []
    for r in requests:
        seen[r.category] = seen.get(r.category, 0) + 1
        if seen[r.category] <= n:
            kept.append(r)
    return kept


def context_prefix(tokenizer, tokens: int = CONTEXT_TOKENS) -> str:
    """About `tokens` tokens of a public-domain passage the requests do not ask about."""
    text = json.loads(LONG_TEXT.read_text(encoding="utf-8").splitlines()[0])["prompt"]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:tokens]
    return f"(Unrelated text first.)\n\n{tokenizer.decode(ids)}\n\n(Now the request.)\n\n"
