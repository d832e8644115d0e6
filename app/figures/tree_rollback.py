"""The rollback page's tree section: the correct tree engine beside one that crops like a chain.

Plain data in (engine/teaching/tree_rollback.py's TreeComparison), a Plotly figure or an HTML
string out; no Streamlit. Every token text is escaped before it reaches HTML or a hover.
"""
import html

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.figures.derive import visible_text
from app.figures.style import GRID, INK, MONO, OKABE_ITO
from app.figures.teaching import layout, rgba
from engine.teaching.tree_rollback import CORRECT, CROP, TREE_MODE_LABELS, TreeComparison

# One look per run: colour, line dash, marker (the lines differ without colour too).
TREE_STYLE = {CORRECT: (OKABE_ITO["blue"], "solid", "circle"), CROP: (OKABE_ITO["vermillion"], "dash", "x")}
BITE_WORDS = "the path left the first branch (a crop keeps the wrong K/V)"


def tree_cache_figure(cmp: TreeComparison) -> go.Figure:
    """Per cycle, the slots of each run's cache whose K/V differ from a fresh prefill of its committed
    text, target left and draft right; a ring marks each cycle whose path left the first branch."""
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=("target model's cache", "draft model's cache"))
    for mode, run in cmp.runs.items():
        colour, dash, symbol = TREE_STYLE[mode]
        label = TREE_MODE_LABELS[mode]
        x = [c.cycle for c in run.cycles]
        for col, model in ((1, "target"), (2, "draft")):
            y = [getattr(c, model).slots_differ for c in run.cycles]
            fig.add_scatter(x=x, y=y, mode="lines+markers", row=1, col=col, name=label, legendgroup=mode,
                            showlegend=col == 1, line=dict(color=colour, dash=dash, width=2),
                            marker=dict(symbol=symbol, size=8, color=colour),
                            hovertemplate=f"{html.escape(label)}<br>after cycle %{{x}}: %{{y}} slot(s) differ"
                                          f"<extra>{model}</extra>")
            bites = [(c.cycle, v) for c, v in zip(run.cycles, y) if c.left_first_branch]
            fig.add_scatter(x=[b[0] for b in bites], y=[b[1] for b in bites], mode="markers", row=1, col=col,
                            name=BITE_WORDS, legendgroup="bite", showlegend=col == 1 and mode == CORRECT,
                            marker=dict(symbol="circle-open", size=18, color=colour, line=dict(width=2)),
                            hovertemplate=f"{html.escape(label)}<br>cycle %{{x}}: the path left the first branch"
                                          "<extra></extra>")
    fig.update_yaxes(title="slots that differ from a fresh prefill", rangemode="tozero", row=1, col=1)
    fig.update_xaxes(title="cycle", gridcolor=GRID)
    fig.update_annotations(yshift=4)  # the subplot titles, clear of the plots
    return layout(fig, "After each cycle: cache slots holding K/V that a fresh prefill would not", 430, top=120,
                  legend=dict(orientation="h", yanchor="bottom", y=1.12, x=0, xanchor="left"))


def output_html(ids: list[int], texts: dict[int, str], first: int | None, label: str) -> str:
    """One run's generated tokens; from the first divergence on, tinted, and that token outlined."""
    mark = OKABE_ITO["vermillion"]
    spans = []
    for i, t in enumerate(ids):
        shown = html.escape(visible_text(texts.get(t, "?")), quote=True)
        if first is None or i < first:
            spans.append(f"<span>{shown}</span>")
        elif i == first:
            spans.append(f'<span title="token {i}: the first that differs" style="outline:2px solid {mark};'
                         f'background:{rgba(mark, 0.25)};color:{INK};font-weight:bold;">{shown}</span>')
        else:
            spans.append(f'<span style="background:{rgba(mark, 0.12)};">{shown}</span>')
    head = f'<div style="font-size:0.85em;margin-bottom:0.2em;"><b>{html.escape(label)}</b></div>'
    return (head + f'<div style="font-family:{html.escape(MONO, quote=True)};line-height:1.9;'
            f'word-break:break-all;">' + "".join(spans) + "</div>")
