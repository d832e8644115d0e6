"""Which of the lab's drafters reproduces a server's speculative configuration, and the settings the
replica runs with: the server's K, its n-gram range, its temperature (greedy requests are compared
step by step, sampled ones in aggregate: sampled.py) and each request's max_tokens.

vLLM's `ngram` method and the lab's prompt lookup (engine/drafters/prompt_lookup.py) search the same
sequence (prompt and output) for the longest n-gram from prompt_lookup_max down to prompt_lookup_min
and copy up to K tokens after an earlier occurrence of it. vLLM V1 copies after the earliest one
(vllm/v1/spec_decode/ngram_proposer.py), the lab by default after the latest: the replica asks for the
earliest (ngram_match), so at temperature 0 the two draft the same tokens; sampled, each drafts from
its own text, which parts from the other's at the first draw. Other methods (a draft
model, EAGLE, MTP, suffix decoding) are refused in one line: the lab cannot run the server's draft
weights or its suffix trees as the server does.
"""
from dataclasses import dataclass

from engine.drafters.registry import DrafterOptions
from engine.replica.server_workload import ServerWorkloadError
from engine.trace.schema import MAX_K, MAX_NGRAM, NGRAM_EARLIEST, PROMPT_LOOKUP

REPLICABLE = "ngram"  # vLLM's name for prompt lookup
CAN_REPLICATE = ("the lab replicates vLLM's \"ngram\" method (as its prompt lookup): greedy requests step by step, "
                 "sampled ones in aggregate")


@dataclass(frozen=True)
class ReplicaPlan:
    """What the replica runs: its drafter and K; each request's budget comes with its answer."""

    drafter: DrafterOptions
    k: int


def whole(config: dict, key: str, low: int, high: int) -> int:
    value = config.get(key)
    if type(value) is not int or not low <= value <= high:
        raise ServerWorkloadError(f"speculative_config.{key} must be an integer from {low} to {high}; {CAN_REPLICATE}")
    return value


def replica_plan(speculative_config: dict | None, temperature: float) -> ReplicaPlan:
    """The drafter and K that reproduce the server's configuration, or a one-line refusal. Any temperature
    the client's reader let through is replicated (run.py runs the server's temperature and top_p)."""
    if speculative_config is None:
        raise ServerWorkloadError(f"the server ran without speculative decoding: nothing to replicate ({CAN_REPLICATE})")
    method = speculative_config.get("method")
    if method != REPLICABLE:
        shown = method if isinstance(method, str) and len(method) <= 40 and method.isprintable() else "another method"
        raise ServerWorkloadError(f"the server speculated with {shown!r}; {CAN_REPLICATE}")
    k = whole(speculative_config, "num_speculative_tokens", 1, MAX_K)
    low = whole(speculative_config, "prompt_lookup_min", 1, MAX_NGRAM)
    high = whole(speculative_config, "prompt_lookup_max", low, MAX_NGRAM)
    return ReplicaPlan(DrafterOptions(kind=PROMPT_LOOKUP, max_ngram=high, min_ngram=low, ngram_match=NGRAM_EARLIEST,
                                      after_first_token=True), k)
