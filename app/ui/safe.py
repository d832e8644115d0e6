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


def table(rows: list[dict], **kwargs):
    """A small static table (st.table: plain HTML, drawn at once, no data-grid code to load).

    st.table renders each cell as Markdown, so every text cell goes through md()."""
    import streamlit as st

    return st.table([{k: md(v) if isinstance(v, str) else v for k, v in row.items()} for row in rows],
                    hide_index=True, **kwargs)


def markdown_table(rows: list[dict], raw: tuple[str, ...] = ()) -> str:
    """A small table as Markdown text, every cell escaped with md(): st.markdown draws it with the
    page's text, needing neither the data grid's nor st.table's formatting script (0.7 MB).
    A cell's line breaks become spaces (a table row is one line); md() escapes its | too.
    Cells of the `raw` columns go in as they are: Markdown the caller built from escaped parts
    (a link whose text went through md() and whose URL was urlencoded)."""
    columns = list(dict.fromkeys(k for row in rows for k in row))

    def cell(value, column: str = "") -> str:
        if column in raw:
            return str(value)
        return md(" ".join(str("" if value is None else value).split()))

    def numeric(column: str) -> bool:  # right-aligned, as st.table does
        return all(isinstance(row.get(column), (int, float)) for row in rows if row.get(column) is not None)

    lines = ["| " + " | ".join(cell(c) for c in columns) + " |",
             "|" + "".join("---:|" if numeric(c) else "---|" for c in columns)]
    lines += ["| " + " | ".join(cell(row.get(c), c) for c in columns) + " |" for row in rows]
    return "\n".join(lines)
