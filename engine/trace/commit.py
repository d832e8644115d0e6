"""The commit rule, once: which tokens a cycle (or plain decoding) makes final.

Pure Python, so the cycle that commits (engine/cycle/) and the checks that verify a trace's
commits (checks.py) apply the same rule; the cycle imports it from here, never the reverse.
"""
from collections.abc import Collection


def final_tokens(tokens: list[int], budget: int, eos_ids: Collection[int]) -> tuple[list[int], bool]:
    """`tokens` cut after the first EOS and at the token budget, and whether the run ends with
    them (an EOS committed or the budget reached): nothing after an EOS is ever committed."""
    for i, t in enumerate(tokens):
        if t in eos_ids:
            tokens = tokens[: i + 1]
            break
    tokens = tokens[:budget]
    return tokens, (bool(tokens) and tokens[-1] in eos_ids) or len(tokens) == budget
