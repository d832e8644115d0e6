"""What one chain cycle must mean: the probabilities and the ratio test's draws, the commit,
the top lists and the residual, the greedy rule, and both caches by the convention (or by the
fault the header declares). `check_cycle` checks one cycle and advances the replayed run.
"""
from engine.trace.check_basics import ABS_TOL, CacheChain, Progress, RunFacts, close, fail, is_int, is_num
from engine.trace.drafter_checks import check_drafter_state
from engine.trace.schema import EAGLE, EAGLE3
from engine.trace.shared_checks import (
    check_commit,
    check_lengths,
    check_text_map,
    check_texts,
    check_times,
    check_token_ids,
    check_top,
)

# ---------------------------------------------------------------- the draft tokens and the test

def check_probabilities(c: dict, n_prop: int, where: str) -> None:
    for name in ("p_draft", "p_target", "accept_prob", "beta"):
        values = c[name]
        if len(values) != n_prop:
            fail(where, name, f"needs one entry per draft token ({n_prop}), has {len(values)}")
        for i, p in enumerate(values):
            if not is_num(p) or not 0.0 <= p <= 1.0 + ABS_TOL:
                fail(where, f"{name}[{i}]", f"a probability must lie in [0, 1], got {p!r:.40}")
    for i, (p_t, p_d, a, b) in enumerate(zip(c["p_target"], c["p_draft"], c["accept_prob"], c["beta"])):
        if p_d <= 0:
            fail(where, f"p_draft[{i}]", "the draft proposed a token it gives probability 0")
        if not close(a, min(1.0, p_t / p_d)):
            fail(where, f"accept_prob[{i}]", f"must equal min(1, p_target/p_draft) = {min(1.0, p_t / p_d):.6g}, got {a:.6g}")
        if b < min(p_t, p_d) - ABS_TOL:
            fail(where, f"beta[{i}]",
                 "beta = sum_x min(p_target, p_draft) cannot be below min(p_target, p_draft) of the draft token")


def passes(rule: str, u: float, accept_prob: float, p_target: float) -> bool | None:
    """What the declared acceptance rule decides for a draw; None when the draw does not decide."""
    if rule in ("ratio", "no_residual"):
        return u < accept_prob
    if rule == "p_target_only":
        return u < p_target
    return None  # token_match compares a fresh target sample, which the trace does not record


def check_vllm_greedy_decision(c: dict, n: int, n_prop: int, where: str) -> None:
    """A captured vLLM's greedy step draws nothing: the one-hot p_target decides, 1 for each accepted draft
    (the target's argmax) and 0 at the rejected one."""
    if c["u"]:
        fail(where, "u", "vLLM draws no uniform numbers for a greedy request: u is empty")
    for i in range(min(n + 1, n_prop)):
        if c["p_target"][i] != (1.0 if i < n else 0.0):
            fail(where, f"p_target[{i}]", f"greedy: draft token {i + 1} was {'accepted' if i < n else 'rejected'}, "
                                          f"so the target's argmax {'is' if i < n else 'is not'} that token")


def check_decision(c: dict, n_prop: int, facts: RunFacts, where: str) -> None:
    n = c["num_accepted"]
    if not 0 <= n <= n_prop:
        fail(where, "num_accepted", f"must lie in 0..{n_prop} (the draft tokens of this cycle)")
    if facts.vllm and facts.temperature == 0:
        check_vllm_greedy_decision(c, n, n_prop, where)
        check_rejection_fields(c, n, n_prop, where)
        return
    u = c["u"]
    if len(u) != min(n + 1, n_prop):
        fail(where, "u", f"one draw per tested position: {min(n + 1, n_prop)} for {n} accepted of {n_prop}, got {len(u)}")
    for i, x in enumerate(u):
        if not is_num(x) or not 0.0 <= x < 1.0:
            fail(where, f"u[{i}]", f"a uniform draw must lie in [0, 1), got {x!r:.40}")
        verdict = passes(facts.rule, x, c["accept_prob"][i], c["p_target"][i])
        if facts.vllm:  # vLLM accepts when p_target/p_draft >= u: the two differ only at a tie
            verdict = x <= c["accept_prob"][i]
        if verdict is not None and verdict != (i < n):
            test = "u < p_target" if facts.rule == "p_target_only" else "u < accept_prob"
            fail(where, f"u[{i}]", f"the draw says {'accept' if verdict else 'reject'} ({test}) but the cycle "
                                   f"{'accepted' if i < n else 'rejected'} draft token {i + 1}")
    check_rejection_fields(c, n, n_prop, where)


def check_rejection_fields(c: dict, n: int, n_prop: int, where: str) -> None:
    rejected = n < n_prop
    if c["rejected_position"] != (n + 1 if rejected else None):
        fail(where, "rejected_position", f"must be {n + 1 if rejected else 'null'} (first failing position, 1-based) "
                                         f"with {n} accepted of {n_prop}")
    if (c["resampled_token_id"] is None) == rejected or (c["bonus_token_id"] is None) != rejected:
        fail(where, "resampled_token_id", "a rejection has a resampled token and no bonus; a full accept the reverse")


def check_residual(c: dict, facts: RunFacts, where: str) -> None:
    res = c["residual_top"]
    if c["resampled_token_id"] is None:
        if res is not None:
            fail(where, "residual_top", "only a rejected cycle has a residual distribution")
        return
    if res is None or len(res) > facts.trace_top_k + 1:
        fail(where, "residual_top", f"a rejection records its residual: 1..{facts.trace_top_k + 1} entries")
    for e in res:
        if not isinstance(e, dict) or not is_int(e.get("token_id")) or not isinstance(e.get("text"), str) or \
                not all(is_num(e.get(f)) and 0 <= e[f] <= 1 + ABS_TOL for f in ("p_target", "p_draft", "residual")):
            fail(where, "residual_top", "entries are {token_id, text, p_target, p_draft, residual} in [0, 1]")
    check_token_ids([e["token_id"] for e in res], facts.vocab_size, where, "residual_top")
    sampled = [e for e in res if e["token_id"] == c["resampled_token_id"]]
    if not sampled or sampled[0]["residual"] <= 0:
        fail(where, "residual_top", "the resampled token must be listed with a residual probability above 0")


def check_greedy(c: dict, n: int, next_token: int, where: str) -> None:
    """Temperature 0: one-hot distributions, so accept while the draft is the target's argmax."""
    if any(p != 1.0 for p in c["p_draft"]):
        fail(where, "p_draft", "greedy: the draft proposes its argmax, with probability 1")
    if any(p not in (0.0, 1.0) for p in c["p_target"]):
        fail(where, "p_target", "greedy: the target's distribution is one-hot, so p_target is 0 or 1")
    argmax = c["target_top"][n] if n < len(c["target_top"]) else []
    if len(argmax) != 1 or argmax[0]["token_id"] != next_token:
        fail(where, "resampled_token_id" if c["resampled_token_id"] is not None else "bonus_token_id",
             "greedy: the token after the accepted drafts is the target's argmax (target_top)")


def cycle_texts(c: dict) -> list[tuple[str, list[int], list[str]]]:
    pairs = [("draft_token_texts", c["draft_token_ids"], c["draft_token_texts"]),
             ("committed_token_texts", c["committed_token_ids"], c["committed_token_texts"])]
    nxt = c["resampled_token_id"] if c["resampled_token_id"] is not None else c["bonus_token_id"]
    pairs.append(("next_token_text", [nxt], [c["next_token_text"]]))
    for name in ("target_top", "draft_top"):
        for row in c[name]:
            pairs.append((name, [e["token_id"] for e in row], [e["text"] for e in row]))
    if c["residual_top"]:
        pairs.append(("residual_top", [e["token_id"] for e in c["residual_top"]], [e["text"] for e in c["residual_top"]]))
    return pairs


# ---------------------------------------------------------------- caches

def check_vllm_caches(c: dict, n_prop: int, committed_after: int, chain: CacheChain, facts: RunFacts,
                      where: str) -> CacheChain:
    """A captured vLLM's num_computed_tokens (schema.VLLM_CONVENTION): the prefill first, then each verify step
    computes the last committed token and the drafts, and the scheduler takes the rejected drafts off."""
    t = c["target_cache_len"]
    check_lengths(t, where, "target_cache_len")
    prompt_len = len(facts.prompt_ids)
    if chain.target is None:
        if n_prop or not t["before"] < prompt_len or t["after_append"] != prompt_len:
            fail(where, "target_cache_len", f"vLLM's first cycle is the prefill: no drafts, from the prefix-cache hit "
                                            f"(below the prompt's {prompt_len} tokens) to {prompt_len}")
        if c["verify_positions"] != prompt_len - t["before"]:
            fail(where, "verify_positions", f"the prefill computes the {prompt_len - t['before']} positions not cached")
    else:
        if t["before"] != chain.target:
            fail(where, "target_cache_len.before", f"must continue the previous cycle's length {chain.target}")
        if t["after_append"] != t["before"] + n_prop + 1 or c["verify_positions"] != n_prop + 1:
            fail(where, "target_cache_len.after_append", f"the verify step computes the last committed token and "
                                                         f"{n_prop} drafts: {t['before']} + {n_prop + 1}")
    want = t["after_append"] - (n_prop - c["num_accepted"])
    if t["after_rollback"] != want:
        fail(where, "target_cache_len.after_rollback", f"must be {want}: vLLM's scheduler takes the "
                                                       f"{n_prop - c['num_accepted']} rejected drafts off")
    if not c["finished"] and want != committed_after - 1:
        fail(where, "target_cache_len.after_rollback", f"must be committed length - 1 = {committed_after - 1} "
                                                       "between vLLM's steps")
    return CacheChain(want, None)


def check_caches(c: dict, n_prop: int, committed_after: int, chain: CacheChain, facts: RunFacts, where: str) -> CacheChain:
    """Lengths by the convention: both caches end one short of the committed sequence (or as the fault says)."""
    if facts.vllm:
        return check_vllm_caches(c, n_prop, committed_after, chain, facts, where)
    keep = committed_after - 1
    t = c["target_cache_len"]
    check_lengths(t, where, "target_cache_len")
    if t["before"] != chain.target:
        fail(where, "target_cache_len.before", f"must continue the previous cycle's length {chain.target}")
    if t["after_append"] != t["before"] + n_prop + 1:
        fail(where, "target_cache_len.after_append", f"verify appends K+1 = {n_prop + 1} positions to {t['before']}")
    if c["verify_positions"] != n_prop + 1:
        fail(where, "verify_positions", f"verify runs over [last committed, d1..d{n_prop}] = {n_prop + 1} positions")
    keep_rejected = facts.faults.get("keep_rejected_kv", False)
    want = t["after_append"] if keep_rejected else keep
    if t["after_rollback"] != want:
        fail(where, "target_cache_len.after_rollback", f"must be {want}: " + (
            "the declared fault keeps the rejected K/V" if keep_rejected else "committed length - 1 by the convention"))
    d = c.get("draft_cache_len")
    if not isinstance(d, dict) or chain.draft is None:
        if c["draft_catch_up"] and c["catch_up_time_s"] < 0:
            fail(where, "catch_up_time_s", "cannot be negative")
        return CacheChain(t["after_rollback"], None)
    check_lengths(d, where, "draft_cache_len")
    if facts.drafter_kind == EAGLE3:  # no draft offset, no teaching fault reaches the head
        if d["before"] != chain.draft:
            fail(where, "draft_cache_len.before", f"must continue the previous cycle's length {chain.draft}")
        return check_eagle3_cache(c, d, n_prop, keep, where, t["after_rollback"])
    if d["before"] != chain.draft:
        own = f" (the draft read its own {len(facts.prompt_ids) + facts.draft_offset}-token prompt)" if facts.draft_offset else ""
        fail(where, "draft_cache_len.before", f"must continue the previous cycle's length {chain.draft}{own}")
    if not facts.drafts_k_with_cache:
        return CacheChain(t["after_rollback"], d["after_rollback"])
    if d["after_append"] != d["before"] + n_prop:
        fail(where, "draft_cache_len.after_append", f"K = {n_prop} draft steps append {n_prop} positions to {d['before']}")
    if facts.drafter_kind == EAGLE:
        return check_eagle_cache(c, d, keep, where, t["after_rollback"])
    draft_keep = keep + facts.draft_offset  # in the draft's own coordinates (its own prompt length)
    cropped = d["after_append"] if keep_rejected else min(d["after_append"], draft_keep)
    catch_up = cropped < draft_keep and not facts.faults.get("skip_draft_catch_up", False)
    if c["draft_catch_up"] != catch_up:
        fail(where, "draft_catch_up", f"must be {str(catch_up).lower()}: the draft is fed the committed tokens "
                                      "it never saw (d_K after a full accept)")
    if d["after_rollback"] != (draft_keep if catch_up else cropped):
        offset = f", offset by the draft's own prompt ({facts.draft_offset:+d})" if facts.draft_offset else ""
        fail(where, "draft_cache_len.after_rollback", f"must be {draft_keep if catch_up else cropped} by the convention"
             + offset + (" and the declared fault" if facts.faults else ""))
    if not catch_up and c["catch_up_time_s"] != 0 and not facts.fast_path:
        fail(where, "catch_up_time_s", "no catch-up ran, so its time is 0")
    return CacheChain(t["after_rollback"], d["after_rollback"])


def check_eagle_cache(c: dict, d: dict, keep: int, where: str, target_after: int) -> CacheChain:
    """The head keeps only entries built on the target's true features: its first draft step
    (fed f_{n-2}) survives, later steps (fed its own predictions) are dropped, and the accepted
    tokens are fed again with true features. The teaching faults leave the head alone."""
    catch_up = d["before"] + 1 < keep
    if c["draft_catch_up"] != catch_up:
        fail(where, "draft_catch_up", f"must be {str(catch_up).lower()}: the head is fed again every committed "
                                      "token past its first draft step, with the target's true features")
    if d["after_rollback"] != keep:
        fail(where, "draft_cache_len.after_rollback", f"must be {keep}: committed length - 1 by the convention")
    if not catch_up and c["catch_up_time_s"] != 0:
        fail(where, "catch_up_time_s", "no catch-up ran, so its time is 0")
    return CacheChain(target_after, d["after_rollback"])


def check_eagle3_cache(c: dict, d: dict, n_prop: int, keep: int, where: str, target_after: int) -> CacheChain:
    """The EAGLE-3 head's first draft token comes from the output of its last entry (kept from the catch-up),
    so K draft steps append K - 1 entries; those rest on its own hiddens and are cropped, and every cycle
    feeds the committed tokens again with the target's features (the accepted ones and the next token)."""
    if d["after_append"] != d["before"] + max(n_prop - 1, 0):
        fail(where, "draft_cache_len.after_append", f"the EAGLE-3 head's {n_prop} draft steps append {max(n_prop - 1, 0)} "
                                                    f"positions to {d['before']} (step 1 reads its last entry's output)")
    if c["draft_catch_up"] is not True:
        fail(where, "draft_catch_up", "must be true: every cycle the EAGLE-3 head is fed the committed tokens past its "
                                      "last true entry, with the target's features")
    if d["after_rollback"] != keep:
        fail(where, "draft_cache_len.after_rollback", f"must be {keep}: committed length - 1 by the convention")
    return CacheChain(target_after, d["after_rollback"])


# ---------------------------------------------------------------- one cycle

def check_cycle(c: dict, facts: RunFacts, run: Progress, texts: dict, where: str) -> None:
    drafts = c["draft_token_ids"]
    n_prop = len(drafts)
    if run.finished:
        fail(where, "cycle", "a cycle after the one that finished the run")
    if n_prop > facts.k:
        fail(where, "draft_token_ids", f"{n_prop} draft tokens, more than K={facts.k}")
    if facts.drafts_k_with_cache and n_prop != facts.k:
        fail(where, "draft_token_ids",
             f"has {n_prop} entries, expected {facts.k}: the {facts.drafter_kind} drafter proposes exactly K")
    check_token_ids(drafts, facts.vocab_size, where, "draft_token_ids")
    check_texts(c["draft_token_texts"], n_prop, where, "draft_token_texts")
    prompt_len = len(facts.prompt_ids)
    if c["committed_len_before"] != prompt_len + len(run.generated):
        fail(where, "committed_len_before", f"must be prompt + tokens so far = {prompt_len + len(run.generated)}")
    check_probabilities(c, n_prop, where)
    check_decision(c, n_prop, facts, where)
    n = c["num_accepted"]
    nxt = c["resampled_token_id"] if c["resampled_token_id"] is not None else c["bonus_token_id"]
    next_field = "resampled_token_id" if c["resampled_token_id"] is not None else "bonus_token_id"
    check_token_ids([nxt], facts.vocab_size, where, next_field)
    what = f"the {n} accepted drafts plus the {'resampled' if n < n_prop else 'bonus'} token"
    want, finished = check_commit(c, drafts[:n], nxt, what, facts, run, where)
    check_top(c["target_top"], n_prop + 1, facts, where, "target_top", drafts, c["p_target"])
    check_top(c["draft_top"], n_prop, facts, where, "draft_top", drafts, c["p_draft"])
    check_residual(c, facts, where)
    if facts.temperature == 0:
        check_greedy(c, n, nxt, where)
    for name, ids, strings in cycle_texts(c):
        check_text_map(texts, ids, strings, where, name)
    check_drafter_state(c, facts, run, where)
    run.chain = check_caches(c, n_prop, prompt_len + len(run.generated) + len(want), run.chain, facts, where)
    check_times(c, n_prop, facts, where)
    run.generated += want
    run.finished = finished
