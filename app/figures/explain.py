"""One-line captions for the five stages of a cycle, built from the cycle's own numbers.

Plain text (the pages show it with st.text-like elements that never interpret HTML
or Markdown), so token texts appear quoted, not escaped.
"""
from app.figures.derive import HEAD_ROW, OwnPrompt, cycle_drafter, prob_text, quoted
from engine.trace.schema import (
    DRAFT_MODEL,
    EAGLE,
    EAGLE3,
    EAGLE3_TOP,
    OTHER_TOKENIZER,
    PROMPT_LOOKUP,
    SUFFIX,
    SUFFIX_REQUEST,
)

STAGES = {
    1: "1 Draft",
    2: "2 Verify",
    3: "3 Test",
    4: "4 Resample / bonus",
    5: "5 Rollback",
}


def discarded_untested(rejected: int, k: int) -> str:
    """The clause for the draft positions after a rejection, which are never tested."""
    if rejected >= k:
        return ""
    if rejected + 1 == k:
        return f"; position {k} is discarded untested"
    return f"; positions {rejected + 1}–{k} are discarded untested"


def stage_caption(c: dict, k: int, stage: int, faults: dict | None = None, greedy: bool = False,
                  drafter: str | None = None, own: OwnPrompt | None = None, captured: bool = False,
                  head: dict | None = None) -> str:
    """What happens at this stage of cycle c, and why, in one line.

    `faults` is the trace header's "faults" entry: a run recorded with a deliberate bug
    (teaching pages) gets its rollback described as it really happened. `drafter` is the
    header's drafter kind (without it, the cycle's own drafter_state says). `own`: a draft model
    that read its own rendering of the prompt (derive.own_prompt), whose cache is offset from the target's.
    `captured`: a live vLLM's cycle (Trace.is_vllm_capture), whose first cycle is its prefill and whose
    cache keeps rejected drafts' slots until they are overwritten. `head`: the header's drafter entry of an
    EAGLE-3 run (its aux layers, and whether it ran mis-set on the target's top layer).
    """
    if captured and (stage in (1, 2, 5)):
        return _captured(c, k, stage, cycle_drafter(c, drafter))
    if stage == 5 and faults and faults.get("keep_rejected_kv"):
        return _skipped_rollback(c, k)
    if greedy and stage in (3, 4):
        return (_greedy_test if stage == 3 else _greedy_resample)(c, k)
    if cycle_drafter(c, drafter) == EAGLE and stage in (1, 5):
        return (_head_draft if stage == 1 else _head_rollback)(c, k)
    if cycle_drafter(c, drafter) == EAGLE3 and stage in (1, 5):
        return _head3_draft(c, k, head or {}) if stage == 1 else _head3_rollback(c)
    if own is not None and stage in (1, 5) and cycle_drafter(c, drafter) == DRAFT_MODEL \
            and c["draft_cache_len"] is not None:
        return (_draft(c, k) + " " + own_prompt_words(own)) if stage == 1 else _own_rollback(c, own)
    return {1: _draft, 2: _verify, 3: _test, 4: _resample, 5: _rollback}[stage](c, k)


def own_prompt_words(own: OwnPrompt) -> str:
    """What the draft read, said where it drafts: not the target's prompt."""
    return (f"It read the prompt without the chat template ({len(own.token_ids)} tokens of its own; the target read "
            f"{own.target_len}), so it guesses the continuation of another text than the target's.")


def own_cache_words(own: OwnPrompt) -> str:
    """What the offset draft's cache holds after a rollback, and how that compares with the target's."""
    gap = abs(own.offset)
    than = (f"{gap} position{'' if gap == 1 else 's'} {'fewer' if own.offset < 0 else 'more'} than the target's"
            if gap else "as many positions as the target's, with other prompt tokens")
    return (f"the draft holds its own prompt ({len(own.token_ids)} tokens, without the chat template) and every "
            f"committed token after the target's prompt but the last: {than}")


def _own_rollback(c: dict, own: OwnPrompt) -> str:
    t, d = c["target_cache_len"], c["draft_cache_len"]
    text = (f"Cache entries past the committed prefix are removed: target {t['after_append']} → {t['after_rollback']}, "
            f"draft {d['after_append']} → {d['after_rollback']}. The target holds every committed token but the last "
            f"(its prompt, with the chat template, is {own.target_len} tokens); {own_cache_words(own)}. The last "
            f"committed token opens the next cycle in both.")
    if c["draft_catch_up"]:
        text += " The draft never ran on its own last token, so it is fed now (catch-up)."
    return text


def _greedy_test(c: dict, k: int) -> str:
    n, j = c["num_accepted"], c["rejected_position"]
    head = ("Temperature 0: there is no random draw. Left to right, a draft token is kept only if it is the "
            "target's most likely token (its argmax)")
    if k == 0:
        return "Temperature 0, and nothing was proposed: there is no draft token to test."
    if j is None:
        return f"{head}: all {k} were, so the text is exactly what plain greedy decoding would write."
    rest = discarded_untested(j, k)
    return (f"{head}: {n} accepted, position {j} ({quoted(c['draft_token_texts'][j - 1])}) rejected because the "
            f"target's argmax there is {quoted(c['next_token_text'])}{rest}.")


def _greedy_resample(c: dict, k: int) -> str:
    token = quoted(c["next_token_text"])
    if k == 0:
        return f"With nothing proposed, the target's argmax {token} is committed: one ordinary greedy step."
    if c["rejected_position"] is None:
        return (f"All {k} drafts matched, so the target's argmax at position {k + 1} (already computed) is added: "
                f"{token}, {k + 1} tokens for one target pass.")
    return (f"At the rejected position the target's own argmax {token} is committed instead (at temperature 0 "
            f"the residual puts all its mass there), exactly as plain greedy decoding would.")


def _listed(texts: list[str], limit: int = 8) -> str:
    shown = texts[:limit]  # a long K would swamp the line; the figure has them all
    return ", ".join(quoted(t) for t in shown) + (", …" if len(texts) > len(shown) else "")


def _draft(c: dict, k: int) -> str:
    drafter = c.get("drafter_state") or {}
    tokens = _listed(c["draft_token_texts"])
    if drafter.get("kind") == PROMPT_LOOKUP:
        if not drafter["matched"]:
            return ("Prompt lookup found no earlier occurrence of the last tokens, so it proposes nothing: "
                    "this cycle is a plain target step (one position verified, its token drawn from the target).")
        return (f"Prompt lookup found the last {drafter['ngram_size']} token(s) earlier in the text (at position "
                f"{drafter['match_start']}) and copies the {k} token(s) that followed ({tokens}). The proposal is "
                f"deterministic (p_draft = 1), so each token is kept with probability p_target: still exact.")
    if drafter.get("kind") == SUFFIX:
        return _suffix_draft(drafter, k, tokens)
    if drafter.get("kind") == OTHER_TOKENIZER:
        own = _listed(drafter["draft_token_texts"])
        return (f"The draft model, which has its own tokenizer, proposes {len(drafter['draft_token_ids'])} of its own "
                f"tokens ({own}); their text, re-encoded with the target's tokenizer, gives the {k} target tokens "
                f"tested below ({tokens}). Greedy only: accepted while each is the target's argmax.")
    return (f"The small draft model proposes K={k} tokens one after another ({tokens}); they are provisional, "
            f"because drafting is cheap but only the target model decides what is kept.")


def _suffix_draft(state: dict, k: int, tokens: str) -> str:
    if not state["source"]:
        return ("Suffix decoding found no continuation of the last tokens in this request's text or in earlier "
                "requests' outputs (or only ones below the minimum probability), so it proposes nothing: this "
                "cycle is a plain target step (one position verified, its token drawn from the target).")
    where = ("this request's own prompt and output" if state["source"] == SUFFIX_REQUEST
             else f"the outputs of {state['cached_requests']} earlier request(s)")
    return (f"Suffix decoding matched the last {state['match_len']} token(s) in {where} and proposes the {k} token(s) "
            f"that most often followed ({tokens}), each kept while its frequency probability stays above the "
            f"minimum. The proposal is deterministic (p_draft = 1), so each token is kept with probability "
            f"p_target: still exact.")


def _head_draft(c: dict, k: int) -> str:
    tokens = _listed(c["draft_token_texts"])
    later = (f"; steps 2–{k} each read its previous draft with the feature the head itself predicted" if k > 2 else
             "; step 2 reads its first draft with the feature the head itself predicted" if k == 2 else "")
    return (f"The EAGLE head proposes K={k} tokens ({tokens}) from the target's own features: step 1 reads the last "
            f"committed token with the target's true feature of the token before it, which the last verify pass "
            f"already computed{later}. The target's own output layer turns each predicted feature into p_draft.")


def _head3_draft(c: dict, k: int, head: dict) -> str:
    tokens = _listed(c["draft_token_texts"])
    layers = head.get("aux_layer_ids")
    if head.get("eagle3_features") == EAGLE3_TOP:
        reads = ("the target's last layer's output at the token before it, in place of its auxiliary layers: mis-set "
                 "on purpose, as an engine runs it that does not collect them. The head learnt to read the fused "
                 "layers, so its guesses seldom hold")
    else:
        where = f"after layers {', '.join(map(str, layers))}" if isinstance(layers, list) and layers else "of several layers"
        reads = (f"the target's hidden states {where} at the token before it, fused by fc (the last verify pass "
                 "computed them, so drafting needs no target pass of its own)")
    later = (f"; steps 2–{k} each read the previous draft with the head's own output in place of the fused state"
             if k > 2 else "; step 2 reads the first draft with the head's own output in place of the fused state"
             if k == 2 else "")
    return (f"The EAGLE-3 head proposes K={k} tokens ({tokens}): step 1 reads the last committed token with {reads}"
            f"{later}. Its own output layer scores a draft vocabulary of its own; every other token has p_draft = 0.")


def _head3_rollback(c: dict) -> str:
    t, d = c["target_cache_len"], c["draft_cache_len"]
    text = (f"Cache entries past the committed prefix are removed: target {t['after_append']} → {t['after_rollback']}. "
            "The EAGLE-3 head's cache (its own row) drops every entry its later draft steps appended, built on its "
            "own outputs")
    if c["draft_catch_up"]:
        fed = d["after_rollback"] - min(d["before"], d["after_rollback"])
        text += (f", then takes the {fed} newly committed token(s) again with the target's hidden states from this "
                 "verify pass (catch-up)")
    return text + (f": {d['after_append']} → {d['after_rollback']}. Both now hold every committed token but the "
                   "last, which opens the next cycle.")


def _head_rollback(c: dict, k: int) -> str:
    t, d = c["target_cache_len"], c["draft_cache_len"]
    text = (f"Cache entries past the committed prefix are removed: target {t['after_append']} → {t['after_rollback']}. "
            f"The {HEAD_ROW} keeps only entries built on the target's true features: its first draft step's entry "
            f"stays, the later ones (built on its own predicted features, or on rejected tokens) are dropped")
    if c["draft_catch_up"]:
        fed = d["after_rollback"] - min(d["before"] + 1, d["after_rollback"])
        text += (f", and the {fed} accepted token(s) are fed to it again with the target's true features from this "
                 f"verify pass (catch-up)")
    return text + (f": {HEAD_ROW} cache {d['after_append']} → {d['after_rollback']}. Both now hold every committed "
                   f"token but the last, which opens the next cycle.")


def _verify(c: dict, k: int) -> str:
    t = c["target_cache_len"]
    if k == 0:
        return (f"Nothing was proposed, so the target runs one ordinary decoding step on the last committed token; "
                f"its cache grows {t['before']} → {t['after_append']}.")
    return (f"The target model scores all {k + 1} positions (the last committed token plus the {k} drafts) in one "
            f"forward pass, the whole point of speculation; its cache grows provisionally {t['before']} → {t['after_append']}.")


def _test(c: dict, k: int) -> str:
    n, j = c["num_accepted"], c["rejected_position"]
    if k == 0:
        return "Nothing was proposed, so there is no draft token to test."
    if j is None:
        return (f"Left to right, each draft token is kept if u < min(1, p_target/p_draft): all {k} passed, "
                f"so the output still follows the target model exactly.")
    i = j - 1
    rest = discarded_untested(j, k)
    # the three numbers as the token strip and the test table print them (prob_text), so the
    # comparison reads the same in all three places however small p_target is
    return (f"Left to right, each draft token is kept if u < min(1, p_target/p_draft): {n} accepted, "
            f"position {j} ({quoted(c['draft_token_texts'][i])}) rejected because u = {prob_text(c['u'][i])} ≥ "
            f"min(1, {prob_text(c['p_target'][i])} / {prob_text(c['p_draft'][i])}) = "
            f"{prob_text(c['accept_prob'][i])}{rest}.")


def _resample(c: dict, k: int) -> str:
    token = quoted(c["next_token_text"])
    if k == 0:
        return f"With nothing proposed, the token {token} is drawn from the target's distribution: one ordinary step."
    if c["rejected_position"] is None:
        return (f"All {k} drafts passed, so the target's distribution at position {k + 1}, already computed in the "
                f"same pass, gives a free bonus token {token}: {k + 1} tokens for one target pass.")
    return (f"At the rejected position the token {token} is drawn from norm(max(0, p_target − p_draft)), the mass "
            f"the draft under-proposed; this correction keeps the output distributed exactly like the target's.")


def _rollback(c: dict, k: int) -> str:
    t, d = c["target_cache_len"], c["draft_cache_len"]
    if d is None:  # prompt lookup keeps no cache; the other-tokenizer draft keeps one over its own tokens
        text = (f"Target cache entries past the committed prefix are removed: {t['after_append']} → {t['after_rollback']}, "
                f"every committed token but the last.")
        own = (c.get("drafter_state") or {}).get("draft_cache_len")
        if own:
            text += (f" The draft re-encodes the committed text in its own tokens and keeps its cache over the part "
                     f"that did not change: {own['after_append']} → {own['after_rollback']} draft-token positions.")
        else:
            text += " Prompt lookup has nothing to roll back: the next lookup reads the committed text."
        return text
    text = (f"Cache entries past the committed prefix are removed: target {t['after_append']} → {t['after_rollback']}, "
            f"draft {d['after_append']} → {d['after_rollback']}; both now hold every committed token but the last, "
            f"which opens the next cycle.")
    if c["draft_catch_up"]:
        text += " The draft never ran on its own last token, so it is fed now (catch-up)."
    return text


def _skipped_rollback(c: dict, k: int) -> str:
    t = c["target_cache_len"]
    return (f"This run was recorded with a deliberate fault: the rollback is skipped, so the target's cache stays at "
            f"{t['after_rollback']} entries, K/V of rejected tokens included, and later cycles attend to them.")


def _captured(c: dict, k: int, stage: int, drafter: str) -> str:
    """Draft, verify and rollback as a live vLLM did them (schema.VLLM_CONVENTION); the test and the resample
    read as the lab's."""
    t = c["target_cache_len"]
    if c["cycle"] == 0:
        return {1: ("vLLM's prefill: the target reads the prompt and samples the first output token. vLLM proposes "
                    "drafts only after it, so this step has none."),
                2: (f"The prefill computes the {t['after_append'] - t['before']} prompt positions not already in "
                    f"vLLM's prefix cache in one forward: num_computed_tokens {t['before']} → {t['after_append']}."),
                5: (f"Nothing to take back: all {t['after_append']} prompt positions stay computed. The first output "
                    "token is computed by the next step, with its drafts.")}[stage]
    if stage == 1 and drafter == DRAFT_MODEL and k:
        return (f"vLLM's draft model proposed {k} tokens ({_listed(c['draft_token_texts'])}) at the end of the step "
                f"before. " + ("It took its argmax each time, so p_draft is 1 (a one-hot q)." if all(
                    p == 1.0 for p in c["p_draft"]) else "It sampled them from its distribution at the request's "
                    "temperature and handed that distribution to the rejection sampler as p_draft."))
    if stage == 1:
        return _draft(c, k)
    if stage == 2:
        return (f"vLLM's target computes the last committed token and the {k} drafts in one forward: "
                f"num_computed_tokens {t['before']} → {t['after_append']}." if k else
                f"Nothing was proposed, so vLLM's target computes the last committed token alone: "
                f"num_computed_tokens {t['before']} → {t['after_append']}.")
    rejected = t["after_append"] - t["after_rollback"]
    if not rejected:
        return (f"Nothing to take back: num_computed_tokens stays {t['after_rollback']}, every committed token but "
                f"the last, which the next step computes.")
    return (f"vLLM's scheduler takes the {rejected} rejected draft(s) off num_computed_tokens: {t['after_append']} → "
            f"{t['after_rollback']}, every committed token but the last. Their K/V stay in their paged slots until "
            f"the next step overwrites them; nothing reads them before that.")
