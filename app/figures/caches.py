"""The KV caches of target and draft at a stage of the cycle: one strip per model, a cell per cache
position, coloured by whether it is committed, provisional, rolled back or fed in the catch-up.

An EAGLE or EAGLE-3 head's cache is a row of its own, with the head's own rollback rule (cache_cells).
Plain functions, no Streamlit: a cycle record in, a figure out.
"""
from typing import Sequence

import plotly.graph_objects as go

from app.figures.derive import FEATURE_HEAD, FEATURE_TARGET, OwnPrompt, cycle_drafter, draft_cache_name
from app.figures.style import (
    CATCH_UP,
    COMMITTED,
    PROVISIONAL,
    ROLLED_BACK,
    STYLES,
    cells,
    esc,
    figure,
    labels,
    legend_name,
    shown,
)
from engine.trace.schema import DRAFT_MODEL, EAGLE, EAGLE3

CACHE_CONTEXT = 6  # committed cells shown before the ones this cycle touches
MAX_CACHE_CELLS = 512  # a strip never draws more cells than this, whatever lengths a trace records


HEAD_CATCH_UP = "head catch-up (accepted tokens re-fed with the target's features)"
HEAD3_CATCH_UP = "head catch-up (newly committed tokens fed with the target's hidden states)"
# How many of a cycle's draft-step entries a head keeps at the rollback: an EAGLE head its first (built on the
# target's true feature); an EAGLE-3 head none (every step after the first read the head's own output), so its
# catch-up rebuilds every newly committed position (engine/drafters/eagle3.py).
HEAD_KEEPS = {EAGLE: 1, EAGLE3: 0}
CATCH_UP_LEGEND = {EAGLE: HEAD_CATCH_UP, EAGLE3: HEAD3_CATCH_UP}


def cache_cells(lengths: dict, stage: int, model: str, head_keeps: int | None = None) -> dict[str, tuple[int, int]]:
    """Cell ranges [start, end) per state for one model's cache at a stage of the cycle.

    before: committed; after_append: provisional entries added (the draft's in stage 1,
    the target's in stage 2); at the rollback stage the entries past after_rollback are
    removed, and a draft that never ran on d_K gains one entry (catch-up), so
    after_rollback can exceed after_append.

    A head keeps only entries built on the target's true features: `head_keeps` of this cycle's draft-step
    entries (HEAD_KEEPS: an EAGLE head its first, at position `before`; an EAGLE-3 head none) survive, the
    later ones (built on its own outputs) are dropped, and the committed tokens past them are fed again with
    the target's features: those positions are drawn as catch-up, the rest of the dropped ones as rolled back.
    """
    before, appended, after = lengths["before"], lengths["after_append"], lengths["after_rollback"]
    if model == "target" and stage == 1:
        return {COMMITTED: (0, before)}
    if stage < 5:
        return {COMMITTED: (0, before), PROVISIONAL: (before, appended)}
    if head_keeps is not None:
        kept = min(before + head_keeps, after)
        return {COMMITTED: (0, kept), ROLLED_BACK: (max(after, kept), appended), CATCH_UP: (kept, after)}
    return {COMMITTED: (0, min(appended, after)), ROLLED_BACK: (after, appended), CATCH_UP: (appended, after)}


def cache_figure(c: dict, stage: int, sequence_texts: Sequence[str], drafter: str | None = None,
                 own: OwnPrompt | None = None) -> go.Figure:
    """The KV-cache strip of target and draft at a stage, with the recorded lengths.

    sequence_texts[p] is the token at sequence position p: the committed tokens
    followed by this cycle's drafts (so a cell can show whose K/V it holds). `drafter` is
    the trace header's drafter kind: an EAGLE head's cache is its own row, named so. `own`: the
    draft read its own rendering of the prompt (derive.own_prompt), so its row is drawn at its own
    positions, labelled with its own prompt's tokens and then the tokens committed after the target's prompt.
    """
    drafter = cycle_drafter(c, drafter)
    row = draft_cache_name(drafter)
    t_len, d_len = c["target_cache_len"], c["draft_cache_len"]
    lengths = {"target": t_len} if d_len is None else {"target": t_len, row: d_len}  # prompt lookup: no draft cache
    own = own if d_len is not None and drafter == DRAFT_MODEL else None
    texts = {"target": sequence_texts, row: own.cache_texts(list(sequence_texts)) if own else sequence_texts}
    keeps = HEAD_KEEPS.get(drafter)
    per_model = {model: cache_cells(v, stage, model, keeps if model == row else None) for model, v in lengths.items()}
    first = max(0, min(v["before"] for v in lengths.values()) - CACHE_CONTEXT)
    notes = head_cell_notes(c, stage, keeps) if keeps is not None and d_len is not None else {}  # per state
    prompt_notes = own_prompt_notes(own) if own else {}  # every state: the draft's own prompt cells
    traces = [t for state in (COMMITTED, PROVISIONAL, ROLLED_BACK, CATCH_UP)
              for t in _cache_state(state, per_model, first, texts, {row: prompt_notes or notes.get(state, {})},
                                    CATCH_UP_LEGEND.get(drafter) if state == CATCH_UP else None)]
    end = min(max(max(v["after_append"], v["after_rollback"]) for v in lengths.values()), first + MAX_CACHE_CELLS)
    note = f" (positions 0–{first - 1}: committed, not drawn)" if first else ""
    return figure(traces, cache_title(c, stage, drafter), 240, barmode="overlay",
                  yaxis=dict(categoryorder="array", categoryarray=[row, "target"], fixedrange=True),
                  xaxis=dict(title=dict(text="cache position" + note + (own_axis_note(own) if own else "")),
                             range=[first - 0.5, end + 0.5], fixedrange=True))


def own_axis_note(own: OwnPrompt) -> str:
    """Under the strip: why the draft's row does not line up with the target's."""
    gap = abs(own.offset)
    where = (f"its cells sit {gap} position{'' if gap == 1 else 's'} {'behind' if own.offset < 0 else 'ahead of'} "
             f"the target's" if gap else "its cells line up with the target's but hold other prompt tokens")
    return (f" · draft row: its own {len(own.token_ids)}-token prompt (no chat template; the target's has "
            f"{own.target_len}), so {where}")


def own_prompt_notes(own: OwnPrompt) -> dict[int, str]:
    """Hover notes on the draft's own prompt cells: which token of that prompt each holds."""
    n = len(own.token_ids)
    return {i: f"the draft's own prompt (without the chat template), token {i + 1} of {n}"
               + ("" if own.texts[i] is not None else f": id {own.token_ids[i]}, which the trace writes no text for")
            for i in range(n)}


def head_cell_notes(c: dict, stage: int, keeps: int = 1) -> dict[str, dict[int, str]]:
    """Hover notes on a head's cells: which feature each draft step's entry was built on (where the record
    says), and, after the rollback, which entries were rebuilt from the target's features (`keeps`: HEAD_KEEPS)."""
    d = c["draft_cache_len"]
    sources = (c.get("drafter_state") or {}).get("feature_sources") or []
    words = {FEATURE_TARGET: "built on the target's true feature", FEATURE_HEAD: "built on the head's predicted feature"}
    if stage < 5:
        return {PROVISIONAL: {d["before"] + i: words.get(src, "") for i, src in enumerate(sources)}}
    kept = min(d["before"] + keeps, d["after_rollback"])
    return {CATCH_UP: {p: "dropped, then fed again with the target's true feature" for p in range(kept, d["after_rollback"])},
            ROLLED_BACK: {p: "built on a predicted feature or a rejected token: dropped" for p in range(kept, d["after_append"])}}


def _cache_state(state: str, per_model: dict, first: int, texts: dict[str, Sequence[str]],
                 notes: dict[str, dict[int, str]] | None = None, legend: str | None = None) -> list[dict]:
    """The cells of one state in every row, each row labelled with its own `texts[row]`; `notes[row]`
    add a line to the hover of that row's cells (the EAGLE head's, or a draft's own prompt)."""
    ys, xs, hover, names = [], [], [], []
    for model, ranges in per_model.items():
        start, end = ranges.get(state, (0, 0))
        row_texts = texts[model]
        for p in range(max(start, first), min(end, first + MAX_CACHE_CELLS)):
            text = row_texts[p] if p < len(row_texts) else "?"
            ys.append(model), xs.append(p)
            names.append(("✗" if state == ROLLED_BACK else "") + shown(text, 6))
            note = (notes or {}).get(model, {}).get(p)
            hover.append(f"{model} cache position {p}: K/V of <b>{shown(text)}</b> · {STYLES[state].label}"
                         + (f"<br>{esc(note)}" if note else ""))
    if not xs:
        return []
    name = f"{STYLES[state].mark} {legend}" if legend else legend_name(state)
    return [cells(name, STYLES[state], ys, [x - 0.45 for x in xs], [0.9] * len(xs), hover),
            labels(xs, ys, names, size=10)]


def cache_title(c: dict, stage: int, drafter: str | None = None) -> str:
    t, d = c["target_cache_len"], c["draft_cache_len"]
    row = draft_cache_name(cycle_drafter(c, drafter))
    if d is None:  # a drafter without a cache over the target's positions
        if stage < 2:
            return f"KV cache: target {t['before']} (this drafter keeps no cache over the target's positions)"
        if stage < 5:
            return f"KV cache: target {t['before']} → {t['after_append']} (provisional entries dotted)"
        return f"KV cache after rollback: target {t['after_append']} → {t['after_rollback']}"
    if stage == 1:
        return f"KV caches: {row} {d['before']} → {d['after_append']} (provisional); target still {t['before']}"
    if stage < 5:
        return (f"KV caches: target {t['before']} → {t['after_append']}, "
                f"{row} {d['before']} → {d['after_append']} (provisional entries dotted)")
    return (f"KV caches after rollback: target {t['after_append']} → {t['after_rollback']}, "
            f"{row} {d['after_append']} → {d['after_rollback']}")
