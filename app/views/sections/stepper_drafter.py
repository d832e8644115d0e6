"""Stage 1 of the stepper for drafters other than a draft model: where each proposal came from.

Prompt lookup: the earlier n-gram that matched, highlighted in the text, and the tokens
copied after it. Suffix decoding: the matched suffix the same way (an earlier place in the text when
this request's own tree proposed), both trees' matches and scores, and each token's frequency
probability. Other-tokenizer draft: its own tokens, their text and the target's
re-encoding side by side, with the boundaries that do not line up. EAGLE head: per draft
step, the token it read and whether it read the target's true feature or its own
predicted one. Computing lives in app/figures/derive.py; this module only renders, and escapes
every token text.
"""
import html

import streamlit as st

from app.figures import derive
from app.figures.style import INK, OKABE_ITO
from app.ui.safe import md
from engine.trace.schema import EAGLE, OTHER_TOKENIZER, PROMPT_LOOKUP, SUFFIX, SUFFIX_REQUEST

ROLE_STYLE = {
    derive.LOOKUP_NGRAM: f"background:{OKABE_ITO['sky_blue']};color:{INK};",
    derive.LOOKUP_COPIED: f"background:{OKABE_ITO['yellow']};color:{INK};",
    derive.LOOKUP_TAIL: f"border-bottom:3px solid {OKABE_ITO['vermillion']};",
    derive.LOOKUP_PLAIN: "",
    derive.SUFFIX_MATCH: f"background:{OKABE_ITO['sky_blue']};color:{INK};",
    derive.SUFFIX_FOLLOWED: f"background:{OKABE_ITO['yellow']};color:{INK};",
}


def lookup_html(view: list[tuple[str, str]]) -> str:
    """The text with each token in a span styled by its role; every token text escaped."""
    spans = []
    for text, role in view:
        shown = html.escape(derive.visible_text(text), quote=True)
        spans.append(f'<span title="{html.escape(role)}" style="{ROLE_STYLE[role]}padding:0 1px;">{shown}</span>')
    return '<div style="font-family:monospace;line-height:1.9;word-break:break-all;">' + "".join(spans) + "</div>"


FEATURE_WORDS = {derive.FEATURE_TARGET: "the target's true feature (from the last verify pass)",
                 derive.FEATURE_HEAD: "the head's own predicted feature",
                 None: "not recorded in this trace"}
FEATURE_STYLE = {derive.FEATURE_TARGET: f"background:{OKABE_ITO['sky_blue']};color:{INK};",
                 derive.FEATURE_HEAD: f"background:{OKABE_ITO['yellow']};color:{INK};", None: ""}


def head_steps_html(steps: list[derive.HeadStep]) -> str:
    """One table row per draft step of the EAGLE head; every token text escaped."""
    def tok(text: str) -> str:
        return f"<code>{html.escape(derive.visible_text(text), quote=True)}</code>"

    head = ("<tr><th>step</th><th>reads token (position)</th><th>with the feature</th>"
            "<th>proposes</th><th>outcome</th></tr>")
    rows = [f"<tr><td>{s.step}</td><td>{tok(s.token_text)} ({s.position})</td>"
            f'<td><span style="{FEATURE_STYLE[s.feature]}padding:0 4px;">{html.escape(FEATURE_WORDS[s.feature], quote=False)}'
            f"</span> at position {s.feature_position}</td><td>{tok(s.proposed_text)}</td>"
            f"<td>{html.escape(s.outcome)}</td></tr>" for s in steps]
    return '<table style="font-size:0.9em;border-collapse:collapse;">' + head + "".join(rows) + "</table>"


def legend_html(roles: tuple[str, ...] = (derive.LOOKUP_NGRAM, derive.LOOKUP_COPIED, derive.LOOKUP_TAIL)) -> str:
    items = [f'<span style="{ROLE_STYLE[r]}padding:0 4px;">{html.escape(r)}</span>' for r in roles]
    return '<div style="font-size:0.85em;">' + " &nbsp; ".join(items) + "</div>"


def show_provenance(texts: list[str], c: dict, drafter: str | None = None) -> None:
    """Stage 1 panel for prompt lookup, the other-tokenizer draft and the EAGLE head (nothing for a
    draft model). `drafter` is the trace header's drafter kind."""
    state = c.get("drafter_state") or {}
    if derive.cycle_drafter(c, drafter) == EAGLE:
        st.caption("Where the proposals came from: the EAGLE head drafts from the target's own features. Step 1 "
                   "reads the last committed token with the target's true feature of the token before it (the "
                   "verify pass already computed it); each later step reads the head's previous draft with the "
                   "feature the head itself predicted. Its cache is the \"EAGLE head\" row of the KV strip.")
        st.html(head_steps_html(derive.head_steps(texts, c)))
    elif state.get("kind") == PROMPT_LOOKUP:
        view = derive.lookup_view(texts, c)
        if view is None:
            st.caption("No earlier occurrence of the last tokens: nothing was proposed (a plain target step).")
            return
        st.caption(f"Where the proposal came from: the last {state['ngram_size']} token(s) also occur at position "
                   f"{state['match_start']}; the tokens that followed them there are copied as the proposal.")
        st.html(legend_html() + lookup_html(view))
    elif state.get("kind") == SUFFIX:
        show_suffix(texts, c, state)
    elif state.get("kind") == OTHER_TOKENIZER:
        rows = derive.alignment_rows(c)
        fragment = state.get("healed_fragment")
        healed = (f" The committed text ended in the draft token {derive.quoted(fragment)}: the draft "
                  f"re-predicted it (token healing), so only the text after it is new.") if fragment else ""
        st.caption(md("The draft's own tokens, their text, and the target tokens that text re-encodes to "
                      "(only the first K target tokens are verified)." + healed))
        st.dataframe([{"draft token id": r.draft_token_id, "draft token": derive.visible_text(r.draft_text),
                       "target tokens": " | ".join(derive.visible_text(t) for t in r.target_texts) or "(past K)",
                       "boundary lines up": {True: "yes", False: "no", None: "?"}[r.aligned]} for r in rows],
                     hide_index=True)


SUFFIX_ROLES = (derive.SUFFIX_MATCH, derive.SUFFIX_FOLLOWED, derive.LOOKUP_TAIL)


def trees_caption(state: dict) -> str:
    """Both trees' best drafts in one line: which won and why (the higher score; this request's on a tie)."""
    def one(name: str, entry: dict) -> str:
        return f"{name}: match {entry['match_len']}, {entry['proposed']} token(s), score {entry['score']:.3g}"
    won = {None: "neither proposed anything", SUFFIX_REQUEST: "this request's tree won",
           "global": "the global tree won"}[state["source"]]
    earlier = f"all outputs ({state['cached_requests']} finished + this one)"
    return (f"{one('this request', state['request'])}; {one(earlier, state['global'])} — {won} (the higher score, "
            "the sum of the token probabilities; this request's on a tie).")


def show_suffix(texts: list[str], c: dict, state: dict) -> None:
    """Stage 1 for suffix decoding: the match in the text, both trees, each proposed token's probability."""
    st.caption(md(trees_caption(state)))
    view = derive.suffix_view(texts, c)
    if view is None:
        st.caption("No continuation found (or all below the minimum probability): nothing was proposed, a plain "
                   "target step.")
        return
    if state["source"] == SUFFIX_REQUEST:
        st.caption(f"Where the proposal came from: the last {state['match_len']} token(s) also stand at position "
                   f"{state['match_start']}, followed by the proposal; they were its most frequent continuation.")
    else:
        st.caption(f"Where the proposal came from: the last {state['match_len']} token(s) matched in the "
                   "global tree, over earlier requests' outputs (not in this trace) and this request's own output, "
                   "and the proposal is what most often followed them there.")
    st.html(legend_html(SUFFIX_ROLES) + lookup_html(view))
    st.dataframe([{"proposed token": derive.visible_text(text), "frequency probability": round(p, 4)}
                  for text, p in zip(c["draft_token_texts"], state["token_probs"])], hide_index=True)
