"""What every figure shares: the palette, the styles of each kind of token or cache cell, escaping,
the stepper's chart sizes, and the plain-dict building blocks the figures are made of.

Colours come from the Okabe-Ito palette (readable with the common colour-vision deficiencies) and
every category also has a symbol, a pattern or a word, so nothing relies on colour alone. Figures
set no background colour: the app's light or dark theme supplies it. Cells (tokens, cache
entries) are opaque light tints with dark text, readable on either theme; text drawn straight on
the background takes the theme's font colour.

Plotly renders a subset of HTML in text, tick labels and hovers, so every token text passes
through `esc` (html.escape) before it goes into a figure.

Speed: each figure is built as plain dicts and wrapped in a go.Figure once, without Plotly's
per-property validation (it costs 10-40 ms a figure, on every step of the stepper). Tests rebuild
every figure with validation on (`validated`), so a wrong property name still fails. Per-point
arrays are numpy arrays: Plotly deep-copies a figure twice on its way to the browser, element by
element for a list, in one memcpy for an array.
"""
import html
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from app.figures.derive import ACCEPTED, BONUS, DISCARDED, PROMPT, REJECTED, RESAMPLED, visible_text

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


UNTRIED, PROPOSED, KEPT, DROPPED = "untried", "proposed", "kept", "discarded slot"
TREE_STYLES = {  # the chain figures' styles (STYLES above) where the meaning is the same
    PROMPT: Style("root: the last committed token", STYLES[PROMPT].colour, "▪", "square", ""),
    PROPOSED: Style("proposed (not tested yet)", OKABE_ITO["sky_blue"], "?", "square-open", "."),
    ACCEPTED: Style("accepted (the path)", STYLES[ACCEPTED].colour, STYLES[ACCEPTED].mark, "circle", ""),
    REJECTED: Style("rejected (tried)", STYLES[REJECTED].colour, STYLES[REJECTED].mark, "x", "x"),
    UNTRIED: Style("untried", OKABE_ITO["grey"], "–", "line-ew-open", "."),
    BONUS: Style("next token: bonus", STYLES[BONUS].colour, STYLES[BONUS].mark, "star", "+"),
    RESAMPLED: Style("next token: from the residual", STYLES[RESAMPLED].colour, STYLES[RESAMPLED].mark, "diamond", "/"),
    KEPT: Style("kept", STYLES[ACCEPTED].colour, "✓", "square", ""),
    DROPPED: Style("discarded", STYLES[REJECTED].colour, "✗", "x", "x"),
    CATCH_UP: Style("draft catch-up (fed after compaction)", OKABE_ITO["sky_blue"], "+", "cross", "+"),
}


# The chart each stepper stage is about (app/views/stepper.py stage_chart): its Streamlit key, and the
# height of the test and resample charts, low enough to show whole under the controls at 1366x768
# (tests/test_browser_projector.py measures it).
STAGE_CHART_KEY = "stage_chart"
STAGE_CHART_PX = 320
NOT_DRAWN = "not drawn"  # the one wording for a u the test never drew (after the first rejection)


def fmt_p(p: float | None) -> str:
    if p is None:
        return "not in the trace's top list"
    return f"{p:.3f}" if p >= 0.001 or p == 0 else f"{p:.1e}"


def tint(hex_colour: str, amount: float = 0.6) -> str:
    """An opaque light tint: the colour mixed with `amount` of white."""
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    r, g, b = (round(v + (255 - v) * amount) for v in (r, g, b))
    return f"#{r:02X}{g:02X}{b:02X}"


# ---------------------------------------------------------------- sizes at 1366x768

PROJECTOR_WIDTH_PX = 900  # plot width of a full-width figure at 1366x768 with the sidebar open
HALF_WIDTH_PX = 430  # a figure in one of two columns there
CHAR_PX = 0.62  # width of a monospace character, in units of the font size


def text_px(text: str, size: int) -> float:
    """Rough drawn width of a one-line label (HTML line breaks split it; the widest line counts)."""
    lines = text.replace("<br>", "\n").split("\n")
    return max(len(html.unescape(line)) for line in lines) * size * CHAR_PX


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


def fitted_probability_axis(values, headroom: float = 1.2) -> dict:
    """probability_axis() cut down to its data: 0 to `headroom` times the largest value (never past
    probability_axis's top), so rates of 0.04-0.12 fill the chart instead of its bottom tenth."""
    seen = [float(v) for v in values if v is not None and v == v]  # v == v: not NaN
    top = max(seen, default=1.0)
    return probability_axis() | dict(range=[0, min(1.12, max(0.02, top * headroom))])
