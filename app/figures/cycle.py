"""The stepper's figures of one cycle's tokens: the text so far, and the cycle at a glance (the K
drafted positions with their probabilities, and what the cycle commits).

Plain functions, trace records in, figure out; no Streamlit calls here, so tests call these
directly. The shared styles and building blocks are in style.py; the test's and the resample's
charts in acceptance.py, the KV caches in caches.py, all cycles and a cycle's time in overview.py.
"""
from typing import Sequence

import plotly.graph_objects as go

from app.figures.acceptance import target_argmax
from app.figures.derive import (
    ACCEPTED,
    BONUS,
    PROMPT,
    RESAMPLED,
    TEXT_WRAP,
    TokenInfo,
    cycle_tokens,
    position_outcomes,
    prob_text,
)
from app.figures.style import (
    CHAR_PX,
    NOT_DRAWN,
    PROJECTOR_WIDTH_PX,
    PROVISIONAL,
    STYLES,
    cells,
    figure,
    fmt_p,
    labels,
    legend_name,
    shown,
    text_px,
)

# ---------------------------------------------------------------- the text so far

TEXT_ROWS_KEPT = 60  # lines of text a figure carries; older lines are left out (speed)


def token_hover(t: TokenInfo) -> str:
    head = f"<b>{shown(t.text)}</b> · {legend_name(t.origin)}"
    if t.origin == PROMPT:
        return head + " token"
    head += f" (cycle {t.cycle})"
    if t.depth is not None:
        return tree_token_hover(head, t)
    if t.origin == ACCEPTED:
        return (f"{head}<br>p_target {fmt_p(t.p_target)} · p_draft {fmt_p(t.p_draft)}"
                f"<br>min(1, p_target/p_draft) {fmt_p(t.accept_prob)}"
                f" · u {fmt_p(t.u) if t.u is not None else NOT_DRAWN} → accepted")
    if t.origin == RESAMPLED:
        return (f"{head}<br>drawn from the residual: {fmt_p(t.residual)}"
                f"<br>p_target {fmt_p(t.p_target)} · p_draft {fmt_p(t.p_draft)}")
    return f"{head}<br>drawn from the target at position K+1: p_target {fmt_p(t.p_target)}"


def tree_token_hover(head: str, t: TokenInfo) -> str:
    """The numbers of a token a tree cycle committed (app/figures/tree.py draws the tree itself)."""
    if t.origin == ACCEPTED:
        return (f"{head}<br>draft tree, depth {t.depth}: p_target {fmt_p(t.p_target)} · q (draft) {fmt_p(t.p_draft)}"
                f"<br>tried with r[t] {fmt_p(t.accept_prob)} · u {fmt_p(t.u) if t.u is not None else NOT_DRAWN} → accepted")
    if t.origin == RESAMPLED:
        return (f"{head}<br>every candidate at depth {t.depth} was rejected: drawn from the residual {fmt_p(t.residual)}"
                f"<br>p_target {fmt_p(t.p_target)}")
    return f"{head}<br>bonus after the path's last node (depth {t.depth}): p_target {fmt_p(t.p_target)}"


def text_figure(tokens: Sequence[TokenInfo], highlight_cycle: int | None = None,
                visible_rows: int = 12) -> go.Figure:
    """The text so far, one cell per token coloured by origin; this cycle's tokens outlined."""
    last_row = tokens[-1].row if tokens else 0
    kept = [t for t in tokens if t.row > last_row - TEXT_ROWS_KEPT]
    traces = []
    for origin in (PROMPT, ACCEPTED, RESAMPLED, BONUS):
        group = [t for t in kept if t.origin == origin]
        if group:
            traces.append(cells(legend_name(origin), STYLES[origin], [t.row for t in group],
                                [t.col for t in group], [t.width for t in group], [token_hover(t) for t in group],
                                outline=[2.5 if t.cycle is not None and t.cycle == highlight_cycle else 0.5
                                         for t in group]))
    traces.append(labels([t.col + t.width / 2 for t in kept], [t.row for t in kept], [shown(t.text, t.width) for t in kept]))
    rows = min(last_row + 1, visible_rows)
    omitted = " · earlier lines left out" if len(kept) < len(tokens) else ""
    return figure(traces, f"Text so far (hover a token for its numbers; this cycle's tokens are outlined){omitted}",
                  100 + 26 * rows, barmode="overlay", dragmode="pan",
                  xaxis=dict(visible=False, range=[-0.5, TEXT_WRAP + 0.5]),
                  yaxis=dict(visible=False, range=[last_row + 0.5, last_row + 0.5 - rows]))  # reversed: first line on top


# ---------------------------------------------------------------- one cycle at a glance

DRAFT_ROW, NUMBERS_ROW, COMMITTED_ROW = 0, 1, 2  # y of the rows in the cycle figure
COLUMN = 16  # characters per position column in the cycle figure ("p_target 0.123" and a margin)


# The widest number derive.prob_text prints ("0.0051", "1.5e-4": six characters): the chart prints a
# probability as the strip above it and the test table do, so a 0.0004 never reads as 0.000 under its token.
WIDEST_P = "0.0051"


def numbers_fit(k: int, name: str = "p_target ") -> bool:
    """Do '{name}0.0051' labels fit K+1 columns of a projector-wide figure (with a 10% margin)?"""
    return text_px(name + WIDEST_P, 11) <= 0.9 * PROJECTOR_WIDTH_PX / (k + 1)


WIDE_K = max(k for k in range(1, 17) if numbers_fit(k))  # beyond this, labels lose their names; hovers keep all


def cell_chars(k: int) -> int:
    """Characters of token text a cycle-figure cell can hold beside its number and mark ('8: ' and ' ✓'):
    fewer as K grows (the hover has the whole token)."""
    room = int(0.85 * PROJECTOR_WIDTH_PX / (k + 1) / (13 * CHAR_PX))
    return max(1, min(COLUMN - 6, room - 5))


def _column_widths(c: dict, k: int) -> list[int]:
    """Width in characters of each position column 1..K+1 (equal: the figure is as wide as the page)."""
    return [COLUMN] * (k + 1)


def cycle_figure(c: dict, k: int, stage: int, greedy: bool = False) -> go.Figure:
    """Row 1: the K drafted tokens (provisional, then marked by the test's outcome).
    Row 2: p_draft under each (p_target too once the target has scored them).
    Row 3 (from stage 4): what the cycle commits, including the resampled or bonus token."""
    widths = _column_widths(c, k)
    starts = [sum(widths[:i]) for i in range(k + 1)]
    centres = [starts[i] + (widths[i] - 1) / 2 for i in range(k + 1)]
    outcomes = position_outcomes(c, k) if stage >= 3 else [PROVISIONAL] * k
    traces = []
    for outcome in dict.fromkeys(outcomes):
        idx = [i for i in range(k) if outcomes[i] == outcome]
        traces.append(cells(legend_name(outcome), STYLES[outcome], [DRAFT_ROW] * len(idx), [starts[i] for i in idx],
                            [widths[i] - 1 for i in idx], [_draft_hover(c, i, stage, greedy) for i in idx],
                            outline=[2] * len(idx)))
    marks = [f" {STYLES[o].mark}" if stage >= 3 else "" for o in outcomes]
    number = (lambda i: f"{i + 1}: ") if k <= WIDE_K else (lambda i: "")  # many positions: the hover numbers them
    traces.append(labels(centres[:k], [DRAFT_ROW] * k,
                         [f"{number(i)}{shown(c['draft_token_texts'][i], cell_chars(k))}{marks[i]}" for i in range(k)],
                         size=13 if k <= WIDE_K else 11))
    traces.append(labels(centres[:k], [NUMBERS_ROW] * k, _numbers(c, k, stage), size=11, on_cells=False))
    slot = ("target's extra<br>position K+1" if stage >= 2 else "K+1<br>(no draft token)") if k <= WIDE_K else "K+1"
    traces.append(labels([centres[k]], [DRAFT_ROW], [slot], size=11, on_cells=False))
    rows = 3 if stage >= 4 else 2
    if stage >= 4:
        traces += _committed_row(c, starts, widths)
    names = ["draft proposes", "p_draft<br>p_target" if stage >= 2 else "p_draft", "committed"]
    return figure(traces, f"Cycle {c['cycle']}: the K={k} draft positions", 100 + 58 * rows, barmode="overlay",
                  yaxis=dict(tickvals=list(range(rows)), ticktext=names[:rows], range=[rows - 0.5, -0.5],
                             fixedrange=True, showgrid=False, zeroline=False),
                  xaxis=dict(visible=False, range=[-0.5, starts[k] + widths[k]], fixedrange=True))


def _draft_hover(c: dict, i: int, stage: int, greedy: bool = False) -> str:
    text = f"position {i + 1}: <b>{shown(c['draft_token_texts'][i])}</b><br>p_draft {fmt_p(c['p_draft'][i])}"
    if stage >= 2:
        text += f"<br>p_target {fmt_p(c['p_target'][i])}"
    if stage >= 3 and greedy:
        top = target_argmax(c, i)
        text += f"<br>target's argmax <b>{shown(top['text']) if top else '?'}</b>" if i <= c["num_accepted"] else "<br>not tested"
    elif stage >= 3:
        u = fmt_p(c["u"][i]) if i < len(c["u"]) else NOT_DRAWN
        text += f"<br>min(1, p_target/p_draft) {fmt_p(c['accept_prob'][i])} · u {u}"
    return text


def _numbers(c: dict, k: int, stage: int) -> list[str]:
    """Under each draft token: p_draft, then p_target once the target has scored it."""
    name_d, name_t = ("p_draft ", "p_target ") if k <= WIDE_K else ("", "")
    # as the strip and the table print it; two decimals only where even a bare six characters do not fit
    fmt = prob_text if numbers_fit(k, name_t) else (lambda p: f"{p:.2f}")
    lines = [f"{name_d}{fmt(c['p_draft'][i])}" for i in range(k)]
    if stage >= 2:
        lines = [f"{line}<br>{name_t}{fmt(c['p_target'][i])}" for i, line in enumerate(lines)]
    return lines


def _committed_row(c: dict, starts: list[int], widths: list[int]) -> list[dict]:
    tokens = cycle_tokens(c)
    traces = []
    for origin in dict.fromkeys(t.origin for t in tokens):
        idx = [i for i, t in enumerate(tokens) if t.origin == origin]
        traces.append(cells(legend_name(origin), STYLES[origin], [COMMITTED_ROW] * len(idx), [starts[i] for i in idx],
                            [widths[i] - 1 for i in idx], [token_hover(tokens[i]) for i in idx],
                            outline=[2] * len(idx), legend=origin != ACCEPTED))
    traces.append(labels([starts[i] + (widths[i] - 1) / 2 for i in range(len(tokens))], [COMMITTED_ROW] * len(tokens),
                         [f"{shown(t.text, cell_chars(len(starts) - 1))} {STYLES[t.origin].mark}" for t in tokens]))
    return traces
