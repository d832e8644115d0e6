"""What a chain cycle's drafter state must mean for the drafters other than a draft model:
prompt lookup's n-gram match, the other-tokenizer draft's own tokens and cache, which
feature each step of an EAGLE head read, and suffix decoding's match (suffix_checks.py); and
what a live vLLM's draft model, captured, records. chain_checks.check_cycle calls check_drafter_state.
"""
from engine.trace.check_basics import Progress, RunFacts, close, fail, is_int
from engine.trace.schema import DRAFT_MODEL, EAGLE, FEATURE_HEADS, PROMPT_LOOKUP, SUFFIX, VLLM_DRAFT_GREEDY
from engine.trace.shared_checks import check_text_map, check_texts, check_token_ids
from engine.trace.suffix_checks import check_suffix_state


def check_one_hot(c: dict, n_prop: int, facts: RunFacts, where: str) -> None:
    """A deterministic drafter proposes with probability 1: p_draft 1, its top list the token itself, beta = p_target."""
    for i, (d, p_d, p_t, b, row) in enumerate(zip(c["draft_token_ids"], c["p_draft"], c["p_target"], c["beta"], c["draft_top"])):
        if p_d != 1.0:
            fail(where, f"p_draft[{i}]", f"{facts.drafter_kind} proposes deterministically: p_draft is 1")
        if len(row) != 1 or row[0]["token_id"] != d:
            fail(where, f"draft_top[{i}]", f"{facts.drafter_kind}'s distribution is one-hot on the proposed token {d}")
        if not close(b, p_t):
            fail(where, f"beta[{i}]", "with a one-hot draft, beta = sum_x min(p_target, p_draft) is p_target of the draft token")


def check_prompt_lookup(state: dict, drafts: list[int], sequence: list[int], facts: RunFacts, where: str) -> None:
    """The proposals are what followed an earlier occurrence of the sequence's last n tokens."""
    if not state.get("matched"):
        if drafts:
            fail(where, "draft_token_ids", "prompt lookup without a match proposes nothing")
        return
    n, start, cont = state.get("ngram_size"), state.get("match_start"), state.get("continuation_start")
    lo, hi = facts.drafter["min_ngram"], facts.drafter["max_ngram"]
    if not (is_int(n) and lo <= n <= hi and is_int(start) and 0 <= start and cont == start + n < len(sequence)):
        fail(where, "drafter_state", f"a match is n in {lo}..{hi} tokens at match_start, continuing at match_start + n "
                                     "inside the committed sequence")
    if sequence[start:start + n] != sequence[len(sequence) - n:]:
        fail(where, "drafter_state.match_start", f"the {n} tokens there are not the sequence's last {n}")
    if drafts != sequence[cont:cont + facts.k]:
        fail(where, "draft_token_ids", f"prompt lookup proposes the (up to K) tokens that followed the match, from "
                                       f"position {cont}: {sequence[cont:cont + facts.k]}")
    if state.get("proposed") != len(drafts):
        fail(where, "drafter_state.proposed", f"must be {len(drafts)}")


def check_other_tokenizer(state: dict, drafts: list[int], c: dict, facts: RunFacts, run: "Progress", where: str) -> None:
    """The draft's own tokens re-encode to the proposals; its own cache ends two short of the
    committed text in draft tokens (the last one is re-predicted: token healing)."""
    if state.get("target_token_ids") != drafts or state.get("target_token_texts") != c["draft_token_texts"]:
        fail(where, "drafter_state.target_token_ids", "the re-encoded draft text is the cycle's proposal (ids and texts)")
    own, own_texts = state.get("draft_token_ids"), state.get("draft_token_texts")
    if not isinstance(own, list) or not isinstance(own_texts, list):
        fail(where, "drafter_state.draft_token_ids", "the draft's own tokens: a list of ids and one of texts")
    check_token_ids(own, facts.drafter.get("draft_vocab_size"), where, "drafter_state.draft_token_ids")
    check_texts(own_texts, len(own), where, "drafter_state.draft_token_texts")
    check_text_map(run.draft_texts, own, own_texts, where, "drafter_state.draft_token_texts")
    lengths, committed = state.get("draft_cache_len"), state.get("draft_committed_len")
    if not isinstance(lengths, dict) or not all(is_int(lengths.get(f)) and lengths[f] >= 0
                                                for f in ("before", "after_append", "after_rollback")):
        fail(where, "drafter_state.draft_cache_len", "the draft's own cache lengths: before, after_append, after_rollback")
    if not is_int(committed) or lengths["after_rollback"] != max(committed - 2, 0):
        fail(where, "drafter_state.draft_cache_len.after_rollback",
             "the draft's cache keeps all of the committed text's draft tokens but the last two")
    if run.own_cache is not None and lengths["before"] != run.own_cache:
        fail(where, "drafter_state.draft_cache_len.before", f"must continue the previous cycle's length {run.own_cache}")
    if lengths["after_append"] < lengths["before"]:
        fail(where, "drafter_state.draft_cache_len.after_append", "drafting only appends to the draft's cache")
    run.own_cache = lengths["after_rollback"]


def check_eagle_state(c: dict, n_prop: int, where: str, kind: str = EAGLE) -> None:
    """Optional for an eagle head (older eagle traces lack it), required of an eagle3 head: which feature
    each draft step read. Step 1 reads the target's true feature at n-2 (n = committed length before the
    cycle: f_{n-2} for EAGLE, the fused aux hidden states g_{n-2} for EAGLE-3), later steps the head's own
    output."""
    state = c.get("drafter_state")
    if state is None:
        if kind != EAGLE:
            fail(where, "drafter_state", f"every cycle of the {kind} drafter records its state (kind {kind!r})")
        return
    if state.get("kind", EAGLE) != kind:
        fail(where, "drafter_state.kind", f"an {kind} trace's drafter state has kind {kind!r}")
    sources = state.get("feature_sources")
    want = (["target"] + ["head"] * (n_prop - 1)) if n_prop else []
    if sources is not None and sources != want:
        fail(where, "drafter_state.feature_sources", f"must be {want}: draft step 1 reads the target's feature, "
                                                     "later steps the head's own predicted feature")
    first = state.get("first_feature_position")
    if first is not None and first != c["committed_len_before"] - 2:
        fail(where, "drafter_state.first_feature_position",
             f"must be {c['committed_len_before'] - 2}: the target's feature of the token before the last committed one")


def check_vllm_draft_model(c: dict, facts: RunFacts, run: "Progress", where: str) -> None:
    """A live vLLM's draft model: nothing in the prefill (the first cycle), then K drafts (fewer only where the
    request nears its end); q one-hot where it drafted its argmax (or the request is greedy), else its
    recorded distribution; no drafter state, and no draft cache length (the capture does not read it)."""
    n_prop = len(c["draft_token_ids"])
    if run.chain.target is not None and n_prop == 0:  # the prefill's own rule is check_vllm_caches'
        fail(where, "draft_token_ids", "vLLM's draft model drafts in every step after the prefill (the first cycle)")
    if c["draft_cache_len"] is not None or "drafter_state" in c:
        fail(where, "draft_cache_len", "a captured vLLM draft model records neither its cache length nor a "
                                       "drafter_state")
    if facts.temperature == 0 or facts.drafter.get("vllm_draft_sample_method") == VLLM_DRAFT_GREEDY:
        check_one_hot(c, n_prop, facts, where)


def check_drafter_state(c: dict, facts: RunFacts, run: "Progress", where: str) -> None:
    if facts.vllm and facts.drafter_kind == DRAFT_MODEL:
        check_vllm_draft_model(c, facts, run, where)
        return
    if facts.drafter_kind in FEATURE_HEADS:
        check_eagle_state(c, len(c["draft_token_ids"]), where, facts.drafter_kind)
    if facts.drafts_k_with_cache:
        return
    state = c.get("drafter_state")
    if not isinstance(state, dict) or state.get("kind") != facts.drafter_kind:
        fail(where, "drafter_state",
             f"every cycle of the {facts.drafter_kind} drafter records its state (kind {facts.drafter_kind!r})")
    if c["draft_cache_len"] is not None:
        fail(where, "draft_cache_len", f"{facts.drafter_kind} keeps no cache over the target's positions: null")
    check_one_hot(c, len(c["draft_token_ids"]), facts, where)
    if facts.drafter_kind == PROMPT_LOOKUP:
        check_prompt_lookup(state, c["draft_token_ids"], facts.prompt_ids + run.generated, facts, where)
    elif facts.drafter_kind == SUFFIX:
        check_suffix_state(state, c["draft_token_ids"], facts.prompt_ids + run.generated, facts, where)
    else:
        check_other_tokenizer(state, c["draft_token_ids"], c, facts, run, where)
