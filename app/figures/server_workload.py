"""A server workload's figures (`python -m engine client`'s folder, engine/workload/server_stats.py's dict in):

- accepted_strip_figure: each request's accepted draft tokens at every drafting step, a strip per
  request (the first request on top), coloured 0..K, with the count on each cell while it fits;
- prompt_length_figure: acceptance by the tokens of each request's prompt (the workload page's context
  chart, app/figures/workload.py, over prompts: a server reports no context length per step).

Plain functions, no Streamlit. Request ids come from an untrusted folder: they reach Plotly through esc().
"""
import numpy as np
import plotly.graph_objects as go

from app.figures.style import INK, OKABE_ITO, esc, figure, tint
from app.figures.workload import context_figure

MAX_STRIPS = 60  # requests drawn as strips; the page says how many more there are
MAX_LABELLED_STEPS = 40  # beyond this many steps a cell is too narrow for its count
ROW_PX = 22


def strip_rows(stats: dict) -> list[dict]:
    """The requests that carry per-step counts, in the folder's order, at most MAX_STRIPS of them."""
    return [r for r in stats["per_request"] if r["accepted_per_cycle"] is not None][:MAX_STRIPS]


def accepted_strip_figure(stats: dict) -> go.Figure:
    """Rows are requests, columns their drafting steps in order; a cell's colour and number are the draft tokens
    that step accepted (vLLM's per_step_accepted). A blank cell: the request had ended."""
    rows = strip_rows(stats)
    k = stats["k"] or max((max(r["accepted_per_cycle"], default=0) for r in rows), default=1) or 1
    width = max((len(r["accepted_per_cycle"]) for r in rows), default=0)
    z = np.full((len(rows), width), np.nan)
    hover = [["" for _ in range(width)] for _ in rows]
    for i, r in enumerate(rows):
        for j, a in enumerate(r["accepted_per_cycle"]):
            z[i, j] = a
            hover[i][j] = f"<b>{esc(r['id'])}</b> ({esc(r['category'])})<br>step {j + 1}: accepted {a} of up to {k}"
    scale = [[0.0, tint(OKABE_ITO["vermillion"], 0.75)], [0.5, tint(OKABE_ITO["sky_blue"], 0.35)],
             [1.0, OKABE_ITO["blue"]]]
    trace = dict(type="heatmap", z=z, x=np.arange(1, width + 1), y=[esc(r["id"]) for r in rows], zmin=0, zmax=k,
                 colorscale=scale, xgap=1, ygap=2, hovertext=hover, hoverinfo="text",
                 colorbar=dict(title=dict(text="accepted"), tickmode="array", tickvals=list(range(k + 1)), len=0.9))
    if width <= MAX_LABELLED_STEPS:
        trace |= dict(texttemplate="%{z}", textfont=dict(color=INK, size=11))
    return figure([trace], f"Accepted draft tokens at each step, a strip per request (0 to {k})",
                  110 + ROW_PX * max(1, len(rows)),
                  xaxis=dict(title=dict(text="drafting step of the request"), dtick=1 if width <= 30 else None),
                  yaxis=dict(type="category", autorange="reversed", title=dict(text="request")))


def prompt_length_figure(stats: dict) -> go.Figure:
    """Acceptance rate by bins of each request's prompt length, each bar with its requests and steps."""
    return context_figure(stats, labels=(stats["source"], ""),
                          title="Acceptance against prompt length (a server reports no context length per step)",
                          axis_title="prompt length (tokens)")
