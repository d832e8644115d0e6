"""The checks a chain cycle, a tree cycle and the header share: token ids in range, one text
per id, the commit rule, top-N lists, cache lengths and times. Each raises BrokenInvariant through `fail`.
"""
from engine.trace.check_basics import ABS_TOL, MAX_TOKEN_ID, Progress, RunFacts, close, fail, is_int, is_num
from engine.trace.commit import final_tokens


def check_token_ids(ids: list, vocab: int | None, where: str, field: str) -> None:
    limit = vocab if vocab is not None else MAX_TOKEN_ID + 1
    for i, t in enumerate(ids):
        if not is_int(t) or not 0 <= t < limit:
            fail(where, f"{field}[{i}]", f"a token id must be an integer in 0..{limit - 1}, got {t!r:.40}")


def check_texts(texts: list, n: int, where: str, field: str) -> None:
    if len(texts) != n or not all(isinstance(t, str) for t in texts):
        fail(where, field, f"must be {n} strings, one per token id")


def check_commit(c: dict, accepted: list[int], next_token: int, what: str, facts: RunFacts, run: Progress,
                 where: str) -> tuple[list[int], bool]:
    """committed = final_tokens(accepted + [next token]) (engine/trace/commit.py, the rule every cycle
    kind commits by); `what` names those tokens in the refusal. Returns the committed tokens and finished."""
    budget = facts.max_new_tokens - len(run.generated)
    want, finished = final_tokens(accepted + [next_token], budget, facts.eos_ids)
    if c["committed_token_ids"] != want:
        fail(where, "committed_token_ids", f"must be {what}, cut at EOS and at the budget of {budget}: {want}")
    check_texts(c["committed_token_texts"], len(want), where, "committed_token_texts")
    if c["finished"] != finished:
        fail(where, "finished", f"must be {str(finished).lower()}: a run ends at EOS or at max_new_tokens")
    return want, finished


def check_text_map(known: dict, ids: list[int], texts: list[str], where: str, field: str) -> None:
    """A token id decodes to one text everywhere in the trace."""
    for t, text in zip(ids, texts):
        if known.setdefault(t, text) != text:
            fail(where, field, f"token {t} is written {text!r:.30} here and {known[t]!r:.30} elsewhere")


def check_top(entries, n_rows: int, facts: RunFacts, where: str, field: str, chosen: list[int], p_chosen: list[float]) -> None:
    """Top-N lists: sorted, in range, and agreeing with the draft token's recorded probability."""
    if len(entries) != n_rows:
        fail(where, field, f"needs {n_rows} rows, has {len(entries)}")
    for r, row in enumerate(entries):
        if not isinstance(row, list) or len(row) > facts.trace_top_k:
            fail(where, f"{field}[{r}]", f"must be a list of at most trace_top_k = {facts.trace_top_k} entries")
        last = 1.0 + ABS_TOL
        for e in row:
            if not isinstance(e, dict) or not is_int(e.get("token_id")) or not isinstance(e.get("text"), str) \
                    or not is_num(e.get("p")) or not 0 < e["p"] <= last:
                fail(where, f"{field}[{r}]", "entries are {token_id, text, p} with 0 < p <= 1, most likely first")
            last = e["p"] + ABS_TOL
        check_token_ids([e["token_id"] for e in row], facts.vocab_size, where, f"{field}[{r}]")
        if sum(e["p"] for e in row) > 1.0 + 1e-3:
            fail(where, f"{field}[{r}]", "probabilities of one distribution sum to more than 1")
        if r < len(chosen):
            for e in row:
                if e["token_id"] == chosen[r] and not close(e["p"], p_chosen[r]):
                    fail(where, f"{field}[{r}]", f"lists draft token {chosen[r]} at p={e['p']:.6g}, the cycle "
                                                 f"records {p_chosen[r]:.6g}")


def check_lengths(lengths: dict, where: str, field: str) -> None:
    for name in ("before", "after_append", "after_rollback"):
        if lengths[name] < 0:
            fail(where, f"{field}.{name}", "a cache length cannot be negative")


def check_times(c: dict, n_prop: int, facts: RunFacts, where: str) -> None:
    for name in ("draft_time_s", "catch_up_time_s"):
        if c[name] < 0:
            fail(where, name, "a time cannot be negative")
    for name in ("verify_time_s", "cycle_time_s"):  # a forward pass always takes some time
        if c[name] <= 0:
            fail(where, name, "a measured time must be positive")
    steps = c["draft_step_times_s"]
    if facts.drafts_k_with_cache and len(steps) != n_prop:
        fail(where, "draft_step_times_s", f"one time per draft step: {n_prop}, got {len(steps)}")
    if not all(is_num(x) and x >= 0 for x in steps):
        fail(where, "draft_step_times_s", "times must be non-negative numbers")
