"""Checks shared by the tests that read traces."""
import pytest

from engine.trace import Trace


def assert_self_consistent(trace: Trace) -> None:
    """Every recorded number agrees with the others and with the rules of a cycle.

    A draft model proposes K tokens every cycle and keeps a cache over the target's
    positions; prompt lookup and the other-tokenizer draft propose n <= K tokens.
    """
    assert trace.complete
    model = trace.drafter_kind == "model"
    committed = list(trace.header["prompt_token_ids"])
    for c in trace.cycles:
        proposed = len(c["draft_token_ids"])
        assert proposed == trace.k if model else proposed <= trace.k
        assert c["committed_len_before"] == len(committed)
        for p_t, p_d, a in zip(c["p_target"], c["p_draft"], c["accept_prob"]):
            assert a == pytest.approx(min(1.0, p_t / p_d), rel=1e-5)
        n = c["num_accepted"]
        assert all(u < a for u, a in zip(c["u"][:n], c["accept_prob"]))  # accepted draws passed
        if n < proposed:
            assert c["u"][n] >= c["accept_prob"][n] and c["rejected_position"] == n + 1
            assert c["resampled_token_id"] in c["committed_token_ids"][-1:] or c["finished"]
        else:
            assert c["bonus_token_id"] in c["committed_token_ids"][-1:] or c["finished"]
        assert c["committed_token_ids"][:n] == c["draft_token_ids"][:len(c["committed_token_ids"][:n])]
        t, d = c["target_cache_len"], c["draft_cache_len"]
        assert t["before"] == len(committed) - 1
        assert t["after_append"] == t["before"] + proposed + 1
        assert c["verify_positions"] == proposed + 1
        committed += c["committed_token_ids"]
        assert t["after_rollback"] == len(committed) - 1
        if model:
            assert d["before"] == len(committed) - len(c["committed_token_ids"]) - 1
            assert d["after_append"] == d["before"] + trace.k
            assert d["after_rollback"] == len(committed) - 1
            assert c["draft_catch_up"] == (d["after_append"] < len(committed) - 1)
        else:
            assert d is None and c["drafter_state"]["kind"] == trace.drafter_kind
        if trace.drafter_kind != "model":  # deterministic proposals: one-hot rows
            assert all(p == 1.0 for p in c["p_draft"])
        assert all(0.0 <= b <= 1.0 + 1e-5 for b in c["beta"])
    generated = committed[len(trace.header["prompt_token_ids"]):]
    assert generated == trace.summary["generated_token_ids"]
    assert len(generated) <= trace.header["settings"]["max_new_tokens"]
