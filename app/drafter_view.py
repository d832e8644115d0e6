"""Stage 1 of the stepper for drafters other than a draft model: where each proposal came from.

Prompt lookup: the earlier n-gram that matched, highlighted in the text, and the tokens
copied after it. Other-tokenizer draft: its own tokens, their text and the target's
re-encoding side by side, with the boundaries that do not line up. Computing lives in
app/derive.py; this module only renders, and escapes every token text.
"""
import html

import streamlit as st

from app import derive
from app.figures import INK, OKABE_ITO
from app.safe import md

ROLE_STYLE = {
    derive.LOOKUP_NGRAM: f"background:{OKABE_ITO['sky_blue']};color:{INK};",
    derive.LOOKUP_COPIED: f"background:{OKABE_ITO['yellow']};color:{INK};",
    derive.LOOKUP_TAIL: f"border-bottom:3px solid {OKABE_ITO['vermillion']};",
    derive.LOOKUP_PLAIN: "",
}


def lookup_html(view: list[tuple[str, str]]) -> str:
    """The text with each token in a span styled by its role; every token text escaped."""
    spans = []
    for text, role in view:
        shown = html.escape(derive.visible_text(text), quote=True)
        spans.append(f'<span title="{html.escape(role)}" style="{ROLE_STYLE[role]}padding:0 1px;">{shown}</span>')
    return '<div style="font-family:monospace;line-height:1.9;word-break:break-all;">' + "".join(spans) + "</div>"


def legend_html() -> str:
    items = [f'<span style="{ROLE_STYLE[r]}padding:0 4px;">{html.escape(r)}</span>'
             for r in (derive.LOOKUP_NGRAM, derive.LOOKUP_COPIED, derive.LOOKUP_TAIL)]
    return '<div style="font-size:0.85em;">' + " &nbsp; ".join(items) + "</div>"


def show_provenance(texts: list[str], c: dict) -> None:
    """Stage 1 panel for prompt lookup and the other-tokenizer draft (nothing for a draft model)."""
    state = c.get("drafter_state") or {}
    if state.get("kind") == "prompt-lookup":
        view = derive.lookup_view(texts, c)
        if view is None:
            st.caption("No earlier occurrence of the last tokens: nothing was proposed (a plain target step).")
            return
        st.caption(f"Where the proposal came from: the last {state['ngram_size']} token(s) also occur at position "
                   f"{state['match_start']}; the tokens that followed them there are copied as the proposal.")
        st.html(legend_html() + lookup_html(view))
    elif state.get("kind") == "other-tokenizer":
        rows = derive.alignment_rows(c)
        fragment = state.get("healed_fragment")
        healed = (f" The committed text ended in the draft token {derive.visible_text(fragment)!r}: the draft "
                  f"re-predicted it (token healing), so only the text after it is new.") if fragment else ""
        st.caption(md("The draft's own tokens, their text, and the target tokens that text re-encodes to "
                      "(only the first K target tokens are verified)." + healed))
        st.dataframe([{"draft token id": r.draft_token_id, "draft token": derive.visible_text(r.draft_text),
                       "target tokens": " | ".join(derive.visible_text(t) for t in r.target_texts) or "(past K)",
                       "boundary lines up": {True: "yes", False: "no", None: "?"}[r.aligned]} for r in rows],
                     hide_index=True)
