"""The cache compaction after a tree cycle: the target's (and the draft's) cache
slots from L on, before and after the accepted path's K/V are moved next to the prefix.

Plain functions, no Streamlit: a tree cycle record in, a figure out.
"""
import plotly.graph_objects as go

from app.figures.style import (
    CATCH_UP,
    CHAR_PX,
    DROPPED,
    KEPT,
    OKABE_ITO,
    PROJECTOR_WIDTH_PX,
    TREE_STYLES,
    cells,
    figure,
    labels,
    shown,
)

MAX_SLOTS = 96  # cache slots drawn per row at most, whatever a trace records


# ---------------------------------------------------------------- the cache compaction

ROWS = {"target": (0.0, 1.0), "draft": (2.4, 3.4)}  # y of each model's "after append" and "after compaction" rows


def slot_texts(c: dict, root_text: str) -> dict[int, str]:
    """Token text of each target slot from L on, after the verify's append: L the root, L+1+i node i."""
    L = c["target_cache_len"]["before"]
    return {L: root_text, **{L + 1 + i: nd["text"] for i, nd in enumerate(c["tree"]["nodes"])}}


def _cell_row(key: str, y: float, slots: list[int], texts: list[str], hover: list[str], legend: bool = True) -> list[dict]:
    if not slots:
        return []
    style = TREE_STYLES[key]
    return [cells(f"{style.mark} {style.label}", style, [y] * len(slots), [s - 0.45 for s in slots], [0.9] * len(slots),
                  hover, legend=legend), labels(slots, [y] * len(slots), texts, size=SLOT_PX)]


SLOT_PX = 12  # slot labels of the compaction figure; narrower cells cut the token shorter (the hover has it all)


def slot_chars(slots: int) -> int:
    """Characters of a token that fit one slot's cell when `slots` cells share the projector's width."""
    return max(1, int(0.85 * PROJECTOR_WIDTH_PX / max(slots, 1) / (SLOT_PX * CHAR_PX)))


def cell_text(texts: dict[int, str], slot: int, chars: int = 5) -> str:
    """A slot's label: its token, cut to the cell; blank where the record does not say whose K/V it holds."""
    return shown(texts[slot], chars) if slot in texts else ""


def prefix_words(L: int) -> str:
    return "no prefix" if L <= 0 else "slot 0: the prefix" if L == 1 else f"slots 0–{L - 1}: the prefix"


def _holds(model: str, slot: int, text: str | None) -> str:
    what = f"K/V of <b>{shown(text)}</b>" if text is not None else "K/V of a draft node off the accepted path"
    return f"{model} slot {slot}: {what}"


def _model_rows(model: str, lengths: dict, kept: list[int], texts: dict[int, str], fed: dict[int, str],
                legend: bool, chars: int) -> list[dict]:
    """One model's two rows: every slot after the append (kept or discarded), then the kept ones moved
    left and (the draft) the committed tokens fed after them. `texts`: the token of each slot after the
    append, where known; `fed`: the token of each catch-up slot."""
    top, bottom = ROWS[model]
    before = lengths["before"]
    window = range(before, min(lengths["after_append"], before + MAX_SLOTS))
    keep = set(kept)
    traces = []
    for key, words in ((KEPT, "kept"), (DROPPED, "discarded: not on the accepted path")):
        slots = [s for s in window if (s in keep) == (key == KEPT)]
        traces += _cell_row(key, top, slots, [cell_text(texts, s, chars) for s in slots],
                            [f"{_holds(model, s, texts.get(s))} · {words}" for s in slots], legend)
    moved = [(before + j, src) for j, src in enumerate(kept[:MAX_SLOTS])]
    traces += _cell_row(KEPT, bottom, [d for d, _ in moved], [cell_text(texts, s, chars) for _, s in moved],
                        [f"{_holds(model, d, texts.get(s))} after compaction "
                         + ("(in place)" if d == s else f"(moved from slot {s})") for d, s in moved], legend=False)
    catch_up = [s for s in range(before + len(kept), min(lengths["after_rollback"], before + MAX_SLOTS))]
    traces += _cell_row(CATCH_UP, bottom, catch_up, [cell_text(fed, s, chars) for s in catch_up],
                        [f"{_holds(model, s, fed.get(s))}, fed after the compaction (catch-up)" for s in catch_up])
    return traces


def draft_texts(c: dict, root_text: str) -> tuple[dict[int, str], dict[int, str]]:
    """The draft's kept slots hold the committed positions L, L+1, ... (the root, then the path's tokens);
    which node a discarded draft slot held the record does not say. Returns (append texts, catch-up texts)."""
    before, kept = c["draft_cache_len"]["before"], c["tree"]["compaction"]["draft"]["kept_slots"]
    committed = ([root_text] + list(c["committed_token_texts"]))
    held = {src: committed[j] for j, src in enumerate(kept) if j < len(committed)}
    fed = {s: committed[s - before] for s in range(before + len(kept), c["draft_cache_len"]["after_rollback"])
           if s - before < len(committed)}
    return held, fed


def move_arrows(model: str, moves: list[list[int]]) -> list[dict]:
    """One arrow per move [from, to]: from the slot after the append down to its slot after compaction."""
    top, bottom = ROWS[model]
    return [dict(x=dst, y=bottom - 0.42, ax=src, ay=top + 0.42, xref="x", yref="y", axref="x", ayref="y", text="",
                 showarrow=True, arrowhead=2, arrowsize=1, arrowwidth=1.6, arrowcolor=OKABE_ITO["blue"],
                 name=f"{model} move")
            for src, dst in moves[:MAX_SLOTS]]


def tree_compaction_figure(c: dict, root_text: str = "", layout: str = "dynamic") -> go.Figure:
    """The target's cache slots from L on after the verify (every node's slot, kept or discarded) and after
    the compaction (the path's K/V moved next to the prefix, one arrow per move); the draft's too when
    the record has them. The prefix (slots 0..L-1) is never touched and not drawn."""
    t, comp = c["target_cache_len"], c["tree"]["compaction"]
    L = t["before"]
    d, end = c.get("draft_cache_len"), t["after_append"]
    if d is not None:
        end = max(end, d["after_append"], d["after_rollback"])
    end = min(end, L + MAX_SLOTS)
    chars = slot_chars(end - L)
    traces = _model_rows("target", t, comp["target"]["kept_slots"], slot_texts(c, root_text), {}, True, chars)
    arrows = move_arrows("target", comp["target"]["moves"])
    ticks = {0.0: "target: after the verify", 1.0: "target: after compaction"}
    if d is not None and comp.get("draft") is not None:
        held, fed = draft_texts(c, root_text)
        traces += _model_rows("draft", d, comp["draft"]["kept_slots"], held, fed, False, chars)
        arrows += move_arrows("draft", comp["draft"]["moves"])
        ticks.update({2.4: "draft: after drafting", 3.4: "draft: after compaction, catch-up"})
    dropped = t["after_append"] - L - len(comp["target"]["kept_slots"])
    title = (f"Cycle {c['cycle']}: compaction ({layout} cache), target {t['after_append']} → {t['after_rollback']} "
             f"slots: {len(comp['target']['moves'])} K/V moved left, {dropped} discarded")
    bottom = max(ticks)
    return figure(traces, title, 150 + 70 * len(ticks), top=96, barmode="overlay", annotations=arrows,
                  xaxis=dict(title=dict(text=f"cache slot ({prefix_words(L)}, untouched, not drawn)"),
                             range=[L - 0.5, max(end, L + 1) - 0.5], dtick=1, tickformat="d", fixedrange=True),
                  yaxis=dict(tickvals=list(ticks), ticktext=list(ticks.values()), range=[bottom + 0.6, -0.6],
                             fixedrange=True, showgrid=False, zeroline=False))
