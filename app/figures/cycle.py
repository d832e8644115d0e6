"""Plotly figures of a trace: plain functions, trace records in, figure out.

No Streamlit calls here, so tests call these directly. Colours come from the Okabe-Ito
palette (readable with the common colour-vision deficiencies) and every category
also has a symbol, a pattern or a word, so nothing relies on colour alone. Figures set
no background colour: the app's light or dark theme supplies it. Cells (tokens, cache
entries) are opaque light tints with dark text, readable on either theme; text drawn
straight on the background takes the theme's font colour.

Plotly renders a subset of HTML in text, tick labels and hovers, so every token text
passes through `esc` (html.escape) before it goes into a figure.

Speed: each figure is built as plain dicts and wrapped in a go.Figure once, without
Plotly's per-property validation (it costs 10-40 ms a figure, on every step of the
stepper). Tests rebuild every figure with validation on (`validated`), so a wrong
property name still fails. Per-point arrays are numpy arrays: Plotly deep-copies a
figure twice on its way to the browser, element by element for a list, in one
memcpy for an array.
"""
import html
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import plotly.graph_objects as go

from app.figures.derive import (
    ACCEPTED,
    BONUS,
    DISCARDED,
    FEATURE_HEAD,
    FEATURE_TARGET,
    HEAD_ROW,
    PROMPT,
    REJECTED,
    RESAMPLED,
    TEXT_WRAP,
    Overview,
    TokenInfo,
    cycle_drafter,
    cycle_tokens,
    draft_cache_name,
    position_outcomes,
    visible_text,
)
from engine.trace.schema import EAGLE

OKABE_ITO = {
    "orange": "#E69F00", "sky_blue": "#56B4E9", "bluish_green": "#009E73", "yellow": "#F0E442",
    "blue": "#0072B2", "vermillion": "#D55E00", "reddish_purple": "#CC79A7", "grey": "#999999",
}
PROVISIONAL, COMMITTED, ROLLED_BACK, CATCH_UP = "provisional", "committed", "rolled back", "catch-up"
MONO = "ui-monospace, SFMono-Regular, Menlo, Consolas, 'DejaVu Sans Mono', monospace"
GRID = "rgba(128,128,128,0.55)"  # cell borders, visible on light and dark backgrounds
INK = "#1b1d26"  # text on cells: cells are light tints in both themes, so dark ink always reads


@dataclass(frozen=True)
class Style:
    label: str  # the word shown in legends
    colour: str
    mark: str  # a text symbol shown next to the word and on cells
    symbol: str  # Plotly marker symbol
    pattern: str  # Plotly bar pattern ("" = solid)


STYLES = {
    PROMPT: Style("prompt", OKABE_ITO["grey"], "▪", "square", ""),
    ACCEPTED: Style("accepted draft", OKABE_ITO["bluish_green"], "✓", "circle", ""),
    REJECTED: Style("rejected", OKABE_ITO["vermillion"], "✗", "x", "x"),
    DISCARDED: Style("discarded (never tested)", OKABE_ITO["grey"], "–", "line-ew-open", "."),
    RESAMPLED: Style("resampled", OKABE_ITO["orange"], "↻", "diamond", "/"),
    BONUS: Style("bonus", OKABE_ITO["blue"], "★", "star", "+"),
    PROVISIONAL: Style("provisional", OKABE_ITO["sky_blue"], "?", "square-open", "."),
    COMMITTED: Style("committed", OKABE_ITO["blue"], "▪", "square", ""),
    ROLLED_BACK: Style("rolled back", OKABE_ITO["vermillion"], "✗", "x", "x"),
    CATCH_UP: Style("draft catch-up (d_K fed)", OKABE_ITO["bluish_green"], "+", "cross", "+"),
}
P_TARGET_COLOUR, P_DRAFT_COLOUR = OKABE_ITO["blue"], OKABE_ITO["orange"]
RESIDUAL_COLOUR, ACCEPT_COLOUR, U_COLOUR = OKABE_ITO["reddish_purple"], OKABE_ITO["bluish_green"], OKABE_ITO["reddish_purple"]


def esc(text: str) -> str:
    """Escape for Plotly's HTML subset. quote=False: Plotly decodes &lt; &gt; &amp; but not &quot;."""
    return html.escape(text, quote=False)


def shown(text: str, limit: int | None = None) -> str:
    """A token as the figures show it: whitespace visible, cut to `limit` characters
    (a cell or tick has room for only so many; hovers show it whole), then escaped."""
    visible = visible_text(text)
    if limit is not None and len(visible) > limit:
        visible = visible[: max(1, limit - 1)] + "…"
    return esc(visible)


# The chart each stepper stage is about (app/views/stepper.py stage_chart): its Streamlit key, and the
# height of the test and resample charts, low enough to show whole under the controls at 1366x768
# (tests/test_browser_projector.py measures it).
STAGE_CHART_KEY = "stage_chart"
STAGE_CHART_PX = 320
NOT_DRAWN = "not drawn"  # the one wording for a u the test never drew (after the first rejection)
# Pixel widths of the stepper's stage-3 test table (app/views/stepper.py): each header and value, NOT_DRAWN
# included, fits in Source Sans 14 px with the table's 8 px padding either side; about 500 px in all, the
# width of the stepper's right column at 1366x768 (tests/test_browser_projector.py measures them).
TEST_TABLE_WIDTHS = {"pos": 38, "draft token": 86, "p_target": 68, "p_draft": 60, "min(1, ratio)": 92,
                     "u": 78, "target's argmax": 110, "result": 86}


def fmt_p(p: float | None) -> str:
    if p is None:
        return "not in the trace's top list"
    return f"{p:.3f}" if p >= 0.001 or p == 0 else f"{p:.1e}"


def tint(hex_colour: str, amount: float = 0.6) -> str:
    """An opaque light tint: the colour mixed with `amount` of white."""
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    r, g, b = (round(v + (255 - v) * amount) for v in (r, g, b))
    return f"#{r:02X}{g:02X}{b:02X}"


# ---------------------------------------------------------------- building blocks (plain dicts)

def figure(traces: list[dict], title: str, height: int, top: int = 72, **layout) -> go.Figure:
    """Title in the top-left corner, the legend on its own line under it."""
    base = dict(title=dict(text=title, x=0, xanchor="left", xref="paper", y=1, yref="container",
                           yanchor="top", pad=dict(t=6), font=dict(size=14)),
                height=height, margin=dict(l=10, r=10, t=top, b=10),
                legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0, xanchor="left"),
                hoverlabel=dict(font=dict(family=MONO)))
    return go.Figure(dict(data=traces, layout={**base, **layout}), _validate=False)


def validated(fig: go.Figure) -> go.Figure:
    """The same figure rebuilt with Plotly's validation (raises on any invalid property)."""
    return go.Figure(fig.to_dict())


def solid_pattern(shape: str) -> dict:
    """Light hatching drawn over a solid bar, so bars differ by more than colour."""
    return dict(shape=shape, fillmode="overlay", fgcolor="rgba(255,255,255,0.75)", size=6, solidity=0.3)


def cells(name: str, style: Style, y: list, base: list, width: list, hover: list[str],
          outline: list[float] | None = None, legend: bool = True, thickness: float = 0.8) -> dict:
    """Rectangles as horizontal bars (one per cell), hatched when the style has a pattern."""
    return dict(type="bar", orientation="h", y=np.asarray(y), base=np.asarray(base), x=np.asarray(width),
                width=thickness, name=name, showlegend=legend, hovertext=np.asarray(hover),
                hovertemplate="%{hovertext}<extra></extra>",
                marker=dict(color=tint(style.colour),
                            line=dict(color=style.colour if outline else GRID,
                                      width=1 if outline is None else np.asarray(outline)),
                            pattern=dict(shape=style.pattern, fillmode="overlay", fgcolor=style.colour,
                                         fgopacity=0.5, size=7, solidity=0.2)))


def labels(x: list, y: list, text: list[str], size: int = 13, on_cells: bool = True) -> dict:
    """Text drawn over cells (a separate trace, so Plotly never shrinks or hides it); dark ink
    on cells, the theme's font colour when `on_cells` is False (text on the background)."""
    font = dict(family=MONO, size=size, **({"color": INK} if on_cells else {}))
    return dict(type="scatter", x=np.asarray(x), y=np.asarray(y), text=np.asarray(text), mode="text",
                showlegend=False, hoverinfo="skip", textfont=font)


def legend_name(key: str) -> str:
    return f"{STYLES[key].mark} {STYLES[key].label}"


def probability_axis() -> dict:
    return dict(title=dict(text="probability"), range=[0, 1.12])


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
PROJECTOR_WIDTH_PX = 900  # plot width of a full-width figure at 1366x768 with the sidebar open
HALF_WIDTH_PX = 430  # a figure in one of two columns there
CHAR_PX = 0.62  # width of a monospace character, in units of the font size


def text_px(text: str, size: int) -> float:
    """Rough drawn width of a one-line label (HTML line breaks split it; the widest line counts)."""
    lines = text.replace("<br>", "\n").split("\n")
    return max(len(html.unescape(line)) for line in lines) * size * CHAR_PX


def named_numbers_fit(k: int) -> bool:
    """Do 'p_target 0.123' labels fit K+1 columns of a projector-wide figure (with a 10% margin)?"""
    return text_px("p_target 0.123", 11) <= 0.9 * PROJECTOR_WIDTH_PX / (k + 1)


WIDE_K = max(k for k in range(1, 17) if named_numbers_fit(k))  # beyond this, labels lose their names; hovers keep all


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
    name_d, name_t, digits = ("p_draft ", "p_target ", 3) if k <= WIDE_K else ("", "", 2)
    lines = [f"{name_d}{c['p_draft'][i]:.{digits}f}" for i in range(k)]
    if stage >= 2:
        lines = [f"{line}<br>{name_t}{c['p_target'][i]:.{digits}f}" for i, line in enumerate(lines)]
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


# ---------------------------------------------------------------- the test, per position

WIDE_MARK_MAX_K = 4  # up to this K, the min(1, ratio) mark spans both bars of its position


def wide_marks(k: int) -> bool:
    """Is a position's slot in a half-width figure wide enough for a 46 px min(1, ratio) mark?"""
    return k <= WIDE_MARK_MAX_K


def position_ticks(c: dict, k: int, stage: int) -> list[str]:
    outcomes = position_outcomes(c, k)
    ticks = []
    for i in range(k):
        if k > 4:  # many positions: the number and the mark; the hover has the token and the rest
            ticks.append(f"{i + 1}" + (f"<br>{STYLES[outcomes[i]].mark}" if stage >= 3 else ""))
            continue
        tick = f"{i + 1}: {shown(c['draft_token_texts'][i], 8)}"
        if stage >= 3:
            tick += f"<br>{STYLES[outcomes[i]].mark} {outcomes[i].split(' ')[0]}"
        ticks.append(tick)
    return ticks


def target_argmax(c: dict, i: int) -> dict | None:
    """The target's most likely token at draft position i+1 (from the trace's top list)."""
    top = c["target_top"][i] if i < len(c["target_top"]) else []
    return top[0] if top else None


def acceptance_figure(c: dict, k: int, stage: int = 3, greedy: bool = False) -> go.Figure:
    """Grouped bars p_target vs p_draft per drafted position; from stage 3 also
    min(1, p_target/p_draft) (a bar-wide line) and the draw u (a diamond) where tested.
    Greedy (temperature 0): no u at all; the test is whether the draft token is the target's
    argmax, so the target's top probability is marked instead."""
    ticks = position_ticks(c, k, stage)
    fade = [0.35 if o == DISCARDED and stage >= 3 else 1.0 for o in position_outcomes(c, k)]
    # No values printed on the bars: two neighbours' values ran into each other ("1.0001.000") and into
    # the test's marks. The cycle figure above and the stage-3 table print them; the hover has them too.
    tokens = np.asarray([shown(t) for t in c["draft_token_texts"]])
    traces = [
        dict(type="bar", x=ticks, y=c["p_target"], name="p_target (target model)", customdata=tokens,
             marker=dict(color=P_TARGET_COLOUR, opacity=fade),
             hovertemplate="<b>%{customdata}</b>: p_target %{y:.4f}<extra></extra>"),
        dict(type="bar", x=ticks, y=c["p_draft"], customdata=tokens,
             name="p_draft (EAGLE head)" if cycle_drafter(c) == EAGLE else "p_draft (draft model)",
             marker=dict(color=P_DRAFT_COLOUR, opacity=fade, pattern=solid_pattern("/")),
             hovertemplate="<b>%{customdata}</b>: p_draft %{y:.4f}<extra></extra>"),
    ]
    if stage >= 3:
        traces += _argmax_marks(c, k, ticks) if greedy else _acceptance_marks(c, ticks, wide_marks(k))
    if stage < 3:  # the test itself is drawn from stage 3 on
        title = "Verify: both models' probability of each draft token"
    else:
        title = ("Greedy test: keep while draft = target's argmax" if greedy else
                 "Test: keep while u < min(1, p_target / p_draft)")
    return figure(traces, title, STAGE_CHART_PX, top=96, barmode="group", bargap=0.3, yaxis=probability_axis(),
                  xaxis=dict(type="category"))


def _acceptance_marks(c: dict, ticks: list[str], wide: bool) -> list[dict]:
    tested = ticks[: len(c["u"])]  # u is drawn only up to the first rejection; the rest: "not drawn"
    return [
        dict(type="scatter", x=ticks, y=c["accept_prob"], mode="markers", name="min(1, p_target/p_draft)",
             marker=dict(symbol="line-ew-open", size=46 if wide else 16, color=ACCEPT_COLOUR,
                         line=dict(width=4, color=ACCEPT_COLOUR)),
             hovertemplate="acceptance probability %{y:.4f}<extra></extra>"),
        dict(type="scatter", x=tested, y=c["u"], mode="markers", name="u (uniform draw)",
             marker=dict(symbol="diamond", size=12, color=U_COLOUR, line=dict(width=1, color=GRID)),
             hovertemplate="u %{y:.4f}<extra></extra>"),  # values in the hover and the table, never on the bars
    ]


def _argmax_marks(c: dict, k: int, ticks: list[str]) -> list[dict]:
    tops = [target_argmax(c, i) for i in range(k)]
    tested = min(k, c["num_accepted"] + 1)
    return [dict(type="scatter", x=ticks[:tested], y=[t["p"] if t else None for t in tops[:tested]], mode="markers",
                 name="target's most likely token (argmax)",
                 customdata=np.asarray([shown(t["text"]) if t else "?" for t in tops[:tested]]),
                 marker=dict(symbol="line-ew-open", size=16, color=ACCEPT_COLOUR, line=dict(width=4, color=ACCEPT_COLOUR)),
                 hovertemplate="target's argmax <b>%{customdata}</b> (p %{y:.4f})<extra></extra>")]


# ---------------------------------------------------------------- resample or bonus

def unique_labels(texts: list[str], ids: list[int]) -> list[str]:
    """Category labels; two tokens that decode alike get their ids added."""
    names = [shown(t, 12) for t in texts]
    return [f"{n} #{i}" if names.count(n) > 1 else n for n, i in zip(names, ids)]


RESIDUAL_BARS = 5  # tokens shown at a rejection: the rejected draft, the resampled one, the residual's largest


def residual_bars(c: dict) -> list[dict]:
    """What the residual chart shows: the rejected draft token and the resampled token, always,
    then the residual's largest entries; never a token with nothing to draw (all three ~0)."""
    j = c["rejected_position"]
    rejected_id = c["draft_token_ids"][j - 1]
    entries = {e["token_id"]: dict(e) for e in c["residual_top"]}
    rejected = entries.pop(rejected_id, None) or {
        "token_id": rejected_id, "text": c["draft_token_texts"][j - 1], "p_target": c["p_target"][j - 1],
        "p_draft": c["p_draft"][j - 1], "residual": 0.0}  # the draft over-proposed it: no residual mass
    sampled = entries.pop(c["resampled_token_id"], None)  # never the rejected token: its residual is 0
    shown_ = [dict(rejected, role="rejected")] + ([dict(sampled, role="resampled")] if sampled else [])
    rest = sorted(entries.values(), key=lambda e: -e["residual"])
    shown_ += [dict(e, role="") for e in rest if max(e["residual"], e["p_target"], e["p_draft"]) >= 0.005]
    return shown_[:RESIDUAL_BARS]


def resample_figure(c: dict, k: int) -> go.Figure:
    """At a rejection: p_target, p_draft and the residual of the rejected draft token, the resampled
    token and the residual's other large entries; at a full accept: the target's distribution at K+1
    that the bonus token was drawn from."""
    if c["rejected_position"] is None:
        return _bonus_figure(c, k)
    entries = residual_bars(c)
    chosen = c["resampled_token_id"]
    marks = {"rejected": f"{STYLES[REJECTED].mark} rejected", "resampled": f"{STYLES[RESAMPLED].mark} resampled"}
    names = [f"{shown(e['text'], 8)}<br>{marks[e['role']]}" if e["role"] else shown(e["text"], 8) for e in entries]
    names = [f"{n} #{e['token_id']}" if names.count(n) > 1 else n for n, e in zip(names, entries)]
    edge = [3 if e["token_id"] == chosen else 0 for e in entries]
    full = np.asarray([shown(e["text"]) for e in entries])
    traces = [dict(type="bar", x=names, y=[e[field] for e in entries], name=name, customdata=full,
                   marker=dict(color=colour, pattern=solid_pattern(pattern),
                               line=dict(width=edge, color=OKABE_ITO["vermillion"])),
                   hovertemplate=f"<b>%{{customdata}}</b>: {name} %{{y:.4f}}<extra></extra>")
              for field, name, colour, pattern in (
                  ("p_target", "p_target", P_TARGET_COLOUR, ""), ("p_draft", "p_draft", P_DRAFT_COLOUR, "/"),
                  ("residual", "norm(max(0, p_target − p_draft))", RESIDUAL_COLOUR, "x"))]
    return figure(traces, f"Resample at position {c['rejected_position']} from the residual",
                  STAGE_CHART_PX, top=96, barmode="group", bargap=0.25, yaxis=probability_axis(), xaxis=dict(type="category"))


def _bonus_figure(c: dict, k: int) -> go.Figure:
    entries, chosen = c["target_top"][k], c["bonus_token_id"]
    ids = [e["token_id"] for e in entries]
    names = unique_labels([e["text"] for e in entries], ids)
    traces = [dict(type="bar", x=names, y=[e["p"] for e in entries], name=f"p_target at position K+1={k + 1}",
                   marker=dict(color=P_TARGET_COLOUR, line=dict(width=[3 if i == chosen else 0 for i in ids],
                                                               color=OKABE_ITO["vermillion"])),
                   hovertemplate="p_target %{y:.4f}<extra>%{x}</extra>")]
    marks = [_sampled_mark(names[ids.index(chosen)], "★ bonus")] if chosen in ids else []
    return figure(traces, f"Bonus: drawn from the target at position K+1={k + 1}", STAGE_CHART_PX, top=96, bargap=0.25,
                  yaxis=probability_axis(), xaxis=dict(type="category"), annotations=marks)


def _sampled_mark(label: str, word: str) -> dict:
    return dict(x=label, y=1.04, text=f"<b>{word}</b>", showarrow=False, font=dict(color=OKABE_ITO["vermillion"]))


# ---------------------------------------------------------------- KV caches

CACHE_CONTEXT = 6  # committed cells shown before the ones this cycle touches
MAX_CACHE_CELLS = 512  # a strip never draws more cells than this, whatever lengths a trace records


HEAD_CATCH_UP = "head catch-up (accepted tokens re-fed with the target's features)"


def cache_cells(lengths: dict, stage: int, model: str, head: bool = False) -> dict[str, tuple[int, int]]:
    """Cell ranges [start, end) per state for one model's cache at a stage of the cycle.

    before: committed; after_append: provisional entries added (the draft's in stage 1,
    the target's in stage 2); at the rollback stage the entries past after_rollback are
    removed, and a draft that never ran on d_K gains one entry (catch-up), so
    after_rollback can exceed after_append.

    An EAGLE head (`head`) keeps only entries built on the target's true features: its first
    draft step's entry (position `before`) survives, the later ones (built on its own
    predicted features) are dropped, and the accepted tokens are fed again with the target's
    features: those positions are drawn as catch-up, the rest of the dropped ones as rolled back.
    """
    before, appended, after = lengths["before"], lengths["after_append"], lengths["after_rollback"]
    if model == "target" and stage == 1:
        return {COMMITTED: (0, before)}
    if stage < 5:
        return {COMMITTED: (0, before), PROVISIONAL: (before, appended)}
    if head:
        kept = min(before + 1, after)
        return {COMMITTED: (0, kept), ROLLED_BACK: (max(after, kept), appended), CATCH_UP: (kept, after)}
    return {COMMITTED: (0, min(appended, after)), ROLLED_BACK: (after, appended), CATCH_UP: (appended, after)}


def cache_figure(c: dict, stage: int, sequence_texts: Sequence[str], drafter: str | None = None) -> go.Figure:
    """The KV-cache strip of target and draft at a stage, with the recorded lengths.

    sequence_texts[p] is the token at sequence position p: the committed tokens
    followed by this cycle's drafts (so a cell can show whose K/V it holds). `drafter` is
    the trace header's drafter kind: an EAGLE head's cache is its own row, named so.
    """
    drafter = cycle_drafter(c, drafter)
    row = draft_cache_name(drafter)
    t_len, d_len = c["target_cache_len"], c["draft_cache_len"]
    lengths = {"target": t_len} if d_len is None else {"target": t_len, row: d_len}  # prompt lookup: no draft cache
    head = drafter == EAGLE
    per_model = {model: cache_cells(v, stage, model, head and model == row) for model, v in lengths.items()}
    first = max(0, min(v["before"] for v in lengths.values()) - CACHE_CONTEXT)
    notes = head_cell_notes(c, stage) if head and d_len is not None else {}
    traces = [t for state in (COMMITTED, PROVISIONAL, ROLLED_BACK, CATCH_UP)
              for t in _cache_state(state, per_model, first, sequence_texts, notes.get(state, {}),
                                    HEAD_CATCH_UP if head and state == CATCH_UP else None)]
    end = min(max(max(v["after_append"], v["after_rollback"]) for v in lengths.values()), first + MAX_CACHE_CELLS)
    note = f" (positions 0–{first - 1}: committed, not drawn)" if first else ""
    return figure(traces, cache_title(c, stage, drafter), 240, barmode="overlay",
                  yaxis=dict(categoryorder="array", categoryarray=[row, "target"], fixedrange=True),
                  xaxis=dict(title=dict(text="cache position" + note), range=[first - 0.5, end + 0.5], fixedrange=True))


def head_cell_notes(c: dict, stage: int) -> dict[str, dict[int, str]]:
    """Hover notes on the EAGLE head's cells: which feature each draft step's entry was built on,
    and, after the rollback, which entries were rebuilt from the target's features."""
    d = c["draft_cache_len"]
    sources = (c.get("drafter_state") or {}).get("feature_sources") or []
    words = {FEATURE_TARGET: "built on the target's true feature", FEATURE_HEAD: "built on the head's predicted feature"}
    if stage < 5:
        return {PROVISIONAL: {d["before"] + i: words.get(src, "") for i, src in enumerate(sources)}}
    kept = min(d["before"] + 1, d["after_rollback"])
    return {CATCH_UP: {p: "dropped, then fed again with the target's true feature" for p in range(kept, d["after_rollback"])},
            ROLLED_BACK: {p: "built on a predicted feature or a rejected token: dropped" for p in range(kept, d["after_append"])}}


def _cache_state(state: str, per_model: dict, first: int, texts: Sequence[str],
                 notes: dict[int, str] | None = None, legend: str | None = None) -> list[dict]:
    """The cells of one state in every row; `notes` add a line to the hover of the EAGLE head's cells."""
    ys, xs, hover, names = [], [], [], []
    for model, ranges in per_model.items():
        start, end = ranges.get(state, (0, 0))
        for p in range(max(start, first), min(end, first + MAX_CACHE_CELLS)):
            text = texts[p] if p < len(texts) else "?"
            ys.append(model), xs.append(p)
            names.append(("✗" if state == ROLLED_BACK else "") + shown(text, 6))
            note = (notes or {}).get(p) if model == HEAD_ROW else None
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


# ---------------------------------------------------------------- all cycles

OVERVIEW_WINDOW = 120  # cycles shown at once in a long trace (pan for the rest)


SLOW_CYCLE = "slow cycle (over 3x the median time)"  # engine/stats/quiet.py's MAX_VERIFY_OVER_MEDIAN


def overview_figure(ov: Overview, num_cycles: int, current: int | None = None,
                    slow: Sequence[int] = ()) -> go.Figure:
    """One marker per cycle and position: accepted / rejected / discarded / bonus; an hourglass
    under each cycle whose time was an outlier (`slow`, from engine/stats/quiet.py).
    Clicking a marker selects it; the page jumps to that cycle."""
    traces = []
    for outcome in (ACCEPTED, REJECTED, DISCARDED, BONUS):
        cycles, positions = ov.points[outcome]
        style = STYLES[outcome]
        traces.append(dict(type="scatter", x=np.asarray(cycles, dtype=int), y=np.asarray(positions, dtype=int),
                           mode="markers", name=legend_name(outcome),
                           marker=dict(symbol=style.symbol, size=8 if outcome == DISCARDED else 11, color=style.colour,
                                       line=dict(width=2, color=style.colour)),
                           hovertemplate=f"cycle %{{x}} · position %{{y}}: {style.label}<extra></extra>"))
    if slow:  # a row of its own under position K+1, so no outcome marker is hidden
        traces.append(dict(type="scatter", x=np.asarray(slow, dtype=int), y=np.full(len(slow), ov.k + 2),
                           mode="markers", name=SLOW_CYCLE,
                           marker=dict(symbol="hourglass", size=12, color=OKABE_ITO["vermillion"]),
                           hovertemplate=f"cycle %{{x}}: {SLOW_CYCLE}<extra></extra>"))
    rows = ov.k + (2 if slow else 1)
    shapes = [] if current is None else [dict(type="rect", xref="x", yref="paper", x0=current - 0.5, x1=current + 0.5,
                                              y0=0, y1=1, fillcolor=OKABE_ITO["yellow"], opacity=0.25,
                                              line=dict(width=0), layer="below")]
    lo = 0 if current is None else max(0, min(current - OVERVIEW_WINDOW // 2, num_cycles - OVERVIEW_WINDOW))
    return figure(traces, "All cycles", 160 + 22 * rows, dragmode="pan", clickmode="event+select", shapes=shapes,
                  xaxis=dict(title=dict(text="cycle (click a marker to jump there)"), tickformat="d",
                             range=[lo - 0.5, min(num_cycles, lo + OVERVIEW_WINDOW) - 0.5],
                             **({"dtick": 1} if num_cycles <= 20 else {})),
                  yaxis=dict(title=dict(text="position"), tickvals=list(range(1, rows + 1)),
                             ticktext=[str(i) for i in range(1, ov.k + 1)] + ["K+1"] + (["slow"] if slow else []),
                             range=[rows + 0.6, 0.4], fixedrange=True))


# ---------------------------------------------------------------- where a cycle's time went

TIME_PARTS = (("draft_time_s", "draft: K steps", OKABE_ITO["orange"], "/"),
              ("verify_time_s", "verify: one target pass", OKABE_ITO["blue"], ""),
              ("catch_up_time_s", "draft catch-up", OKABE_ITO["bluish_green"], "+"))


def cycle_time_parts(c: dict) -> list[tuple[str, float]]:
    """(part, seconds) of one cycle, as recorded; what is left of cycle_time_s is the test, the
    resample, the rollback (cache crops) and Python bookkeeping, which the engine does not time apart."""
    parts = [(name, c[field]) for field, name, _, _ in TIME_PARTS]
    return parts + [("test, resample, rollback, other", max(0.0, c["cycle_time_s"] - sum(v for _, v in parts)))]


def cycle_time_title(c: dict, median_cycle_s: float | None = None, slow: bool = False) -> str:
    """The time bar's title; it names an outlier (engine/stats/quiet.py) as one, against the median."""
    title = f"Cycle {c['cycle']}: {c['cycle_time_s'] * 1000:.1f} ms of wall time"
    if median_cycle_s:
        ratio = c["cycle_time_s"] / median_cycle_s
        title += (f" ({ratio:.1f}x this trace's median {median_cycle_s * 1000:.1f} ms: an outlier, "
                  "the machine was busy)" if slow else f" (median cycle {median_cycle_s * 1000:.1f} ms)")
    return title


def cycle_time_figure(c: dict, median_cycle_s: float | None = None, slow: bool = False) -> go.Figure:
    """One stacked bar: where this cycle's wall time went, in milliseconds; an outlier cycle's
    bar is outlined in vermillion and its title says so."""
    colours = [colour for _, _, colour, _ in TIME_PARTS] + [OKABE_ITO["grey"]]
    patterns = [pattern for _, _, _, pattern in TIME_PARTS] + ["."]
    traces = [dict(type="bar", orientation="h", y=["time"], x=[seconds * 1000], name=name,
                   marker=dict(color=colour, pattern=solid_pattern(pattern) if pattern else None,
                               line=dict(width=3 if slow else 0, color=OKABE_ITO["vermillion"])),
                   hovertemplate=f"{name}: %{{x:.2f}} ms<extra></extra>")
              for (name, seconds), colour, pattern in zip(cycle_time_parts(c), colours, patterns)]
    return figure(traces, cycle_time_title(c, median_cycle_s, slow), 150, top=64,
                  barmode="stack", xaxis=dict(title=dict(text="milliseconds"), rangemode="tozero"),
                  yaxis=dict(visible=False, fixedrange=True))
