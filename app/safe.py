"""Putting untrusted text (token texts, prompts, file names, error messages) into Markdown.

Streamlit renders st.markdown / st.info / st.caption as Markdown with its own extras
($math$, :colour[...] and :icons:). HTML is escaped with html.escape; every other
ASCII punctuation character is backslash-escaped so it shows as itself.
"""
import html
import string

_PUNCT = set(string.punctuation) - set("&<>\"'")  # those five are left to html.escape


def md(text: str) -> str:
    """Text that Streamlit's Markdown shows literally, never as formatting or HTML."""
    escaped = "".join("\\" + ch if ch in _PUNCT else ch for ch in text)
    return html.escape(escaped, quote=True).replace("\n", "  \n")
