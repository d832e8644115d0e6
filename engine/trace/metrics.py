"""Acceptance metrics as production engines define them (vLLM V1 names; see design notes)."""
import statistics


def drafts(num_drafted: list[int]) -> int:
    """vLLM's "drafts": the cycles that proposed at least one token. A prompt-lookup cycle whose
    lookup found nothing is a plain decoding step, and a live vLLM n-gram server does not count it
    (recorded in tests/server_samples/vllm_live_answers.jsonl), so no rate below counts it either."""
    return sum(d > 0 for d in num_drafted)


def mean_acceptance_length(accepted: int, num_drafts: int) -> float | None:
    """1 + accepted / drafts (counts the resampled or bonus token); None when nothing was drafted."""
    return 1 + accepted / num_drafts if num_drafts else None


def acceptance_metrics(num_accepted: list[int], k: int, num_drafted: list[int] | None = None) -> dict:
    """From each cycle's number of accepted draft tokens (and of drafted ones, if a drafter
    may propose fewer than K; a draft model always drafts K). Every denominator but the rate's is
    the number of drafts (cycles that drafted at least one token), as vLLM V1 counts them.

    acceptance_rate: accepted / drafted.
    mean_acceptance_length: 1 + accepted / drafts (counts the resampled or bonus token); 0 when
    nothing was drafted.
    per_position_acceptance[i]: drafts whose draft token i+1 was accepted / drafts; a token can
    only be accepted if all before it were, so the curve never rises.
    num_cycles: every cycle, drafting or not.
    """
    cycles = len(num_accepted)
    drafted_counts = [k] * cycles if num_drafted is None else num_drafted
    num_drafts = drafts(drafted_counts)
    if num_drafts == 0:
        return {"acceptance_rate": 0.0, "mean_acceptance_length": 0.0,
                "per_position_acceptance": [0.0] * k, "num_cycles": cycles}
    accepted = sum(num_accepted)
    return {
        "acceptance_rate": accepted / sum(drafted_counts),
        "mean_acceptance_length": mean_acceptance_length(accepted, num_drafts),
        "per_position_acceptance": [sum(n > i for n in num_accepted) / num_drafts for i in range(k)],
        "num_cycles": cycles,
    }


def legacy_acceptance(num_accepted: list[int], k: int) -> dict:
    """The lab's definition before it followed vLLM: every cycle in the denominators, drafting or
    not. Only to read traces written before then (their summaries keep these numbers)."""
    cycles = len(num_accepted)
    if cycles == 0:
        return {"mean_acceptance_length": 0.0, "per_position_acceptance": [0.0] * k}
    return {"mean_acceptance_length": 1 + sum(num_accepted) / cycles,
            "per_position_acceptance": [sum(n > i for n in num_accepted) / cycles for i in range(k)]}


def drafted(cycle: dict) -> int:
    """Tokens a cycle drafted: its chain's proposals, or every node of its tree."""
    return len(cycle["tree"]["nodes"]) if "tree" in cycle else len(cycle["draft_token_ids"])


def trace_acceptance(cycles: list[dict], k: int) -> dict:
    """acceptance_metrics of a trace's cycles, chain or tree. For a tree (k = its max depth,
    num_accepted = the accepted path's length):

    acceptance_rate: accepted path nodes / drafted nodes (every node counts as a drafted token),
    the share of the drafted tree that was used. Much lower than a chain's at the same depth,
    by design: a tree drafts siblings that cannot all be kept.
    mean_acceptance_length: 1 + mean path length = tokens a cycle makes before the EOS and
    budget cut, the figure to compare with a chain's (every tree cycle drafts, so drafts = cycles).
    per_position_acceptance[d]: cycles whose path reached depth d+1 / cycles.
    """
    return acceptance_metrics([c["num_accepted"] for c in cycles], k, [drafted(c) for c in cycles])


def expected_tokens_per_cycle(alpha: float, k: int) -> float:
    """(1 - alpha^(K+1)) / (1 - alpha) for i.i.d. acceptance (Leviathan et al. 2023)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def predicted_speedup(alpha: float, k: int, c: float) -> float:
    """Expected wall-time improvement (Leviathan et al. 2023), verify costing one target step."""
    return expected_tokens_per_cycle(alpha, k) / (k * c + 1)


TOKENS_PER_S = ("tokens/s: tokens committed per cycle divided by the median cycle's seconds (plain decoding: "
                "its tokens over its decoding seconds); prefill and writing the trace are not counted")


def decoding_tokens_per_s(cycles: list[dict]) -> float:
    """The project's one tokens/s (TOKENS_PER_S) from a run's cycle records. The median cycle,
    not the total, so that one cycle stalled by another process does not set the rate."""
    if not cycles:
        return 0.0
    seconds = statistics.median(c["cycle_time_s"] for c in cycles)
    tokens_per_cycle = sum(len(c["committed_token_ids"]) for c in cycles) / len(cycles)
    return tokens_per_cycle / seconds if seconds > 0 else 0.0
