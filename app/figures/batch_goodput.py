"""Goodput against batch size, from a sweep (engine/stats/batch_results.py: bench/batch.py's files or a sweep
measured now): goodput per B for plain batched decoding and speculation, the crossover and the advisor's
choice; acceptance against B beside the speedup against B (vLLM #26504's lesson); the advisor's table.

Plain functions, no Streamlit, no torch: tests call them on hand-built sweeps. The preset name comes from a
file: it reaches Plotly through esc().
"""

import plotly.graph_objects as go

from app.figures.style import GRID, OKABE_ITO, esc, figure
from engine.stats.batch_results import PLAIN_K, BatchSize, BatchSweep

PLAIN_COLOUR, HF_COLOUR, BEST_COLOUR, ADVISED_COLOUR = (OKABE_ITO["grey"], OKABE_ITO["reddish_purple"],
                                                         OKABE_ITO["blue"], OKABE_ITO["orange"])


def batch_axis(sweep: BatchSweep) -> dict:
    """B on a log-2 axis, ticked at the batch sizes measured."""
    batches = [s.batch for s in sweep.sizes]
    return dict(type="log", tickvals=batches, ticktext=[str(b) for b in batches], title=dict(text="batch size B"),
                gridcolor=GRID)


def advised_words(size: BatchSize) -> str:
    return "plain" if size.advised_k == PLAIN_K else f"K={size.advised_k}"


def goodput_figure(sweep: BatchSweep) -> go.Figure:
    """Committed tokens/s over all rows against B: plain batched decoding (the engine's, and Hugging Face's
    generate when measured), speculation at each K (faint) and at the best K, the advisor's choice, and the
    crossover (the first B where no K beats plain decoding)."""
    b = [s.batch for s in sweep.sizes]
    ks = sorted(sweep.sizes[0].speculative)
    # one faint line per K, one legend entry for all of them
    traces = [dict(type="scatter", x=b, y=[s.speculative[k] for s in sweep.sizes], mode="lines",
                   name="speculating at each K", legendgroup="each K", showlegend=k == ks[0],
                   line=dict(color=BEST_COLOUR, width=1), opacity=0.3,
                   hovertemplate=f"B=%{{x}}, K={k}: %{{y:.1f}} tokens/s<extra></extra>") for k in ks]
    traces.append(dict(type="scatter", x=b, y=[s.plain for s in sweep.sizes], mode="lines+markers",
                       name="plain batched decoding (engine)", line=dict(color=PLAIN_COLOUR, dash="dash", width=3),
                       marker=dict(symbol="square", size=9),
                       hovertemplate="B=%{x}: plain %{y:.1f} tokens/s<extra></extra>"))
    if all(s.hf_generate is not None for s in sweep.sizes):
        traces.append(dict(type="scatter", x=b, y=[s.hf_generate for s in sweep.sizes], mode="lines+markers",
                           name="Hugging Face generate (plain)", line=dict(color=HF_COLOUR, dash="dot"),
                           marker=dict(symbol="x", size=9),
                           hovertemplate="B=%{x}: generate %{y:.1f} tokens/s<extra></extra>"))
    # the best K at each B is named under the axis (best_k_axis): written by the points, it sat under the
    # advisor's stars and on the plain curves, which run close to the best K's
    traces.append(dict(type="scatter", x=b, y=[s.speculative[s.best_k] for s in sweep.sizes], mode="lines+markers",
                       name="speculating at the best K", line=dict(color=BEST_COLOUR, width=3),
                       marker=dict(symbol="circle", size=10), customdata=[f"K={s.best_k}" for s in sweep.sizes],
                       hovertemplate="B=%{x}: best %{customdata}, %{y:.1f} tokens/s<extra></extra>"))
    advised = [s for s in sweep.sizes if s.advised_goodput is not None]
    if advised:
        traces.append(dict(type="scatter", x=[s.batch for s in advised], y=[s.advised_goodput for s in advised],
                           mode="markers", name="the advisor's choice", marker=dict(symbol="star", size=15,
                                                                                   color=ADVISED_COLOUR),
                           text=[f"{advised_words(s)}, {s.advised_over_best:.2f} of the best" for s in advised],
                           hovertemplate="B=%{x}: advisor chose %{text}<extra></extra>"))
    if sweep.crossover is not None:  # a line of its own, named in the legend: words in the plot sat on curves
        top = max(max(t["y"]) for t in traces)
        traces.append(dict(type="scatter", x=[sweep.crossover] * 2, y=[0, top], mode="lines",
                           name=f"no K pays from B = {sweep.crossover}", hoverinfo="skip",
                           line=dict(color=OKABE_ITO["vermillion"], dash="dash", width=2)))
    return figure(traces, f"Goodput against batch size: {esc(sweep.preset)}, {sweep.requests} requests of "
                          f"{sweep.max_new_tokens} tokens, greedy", height=480, top=110,
                  xaxis=best_k_axis(sweep), yaxis=dict(title=dict(text="committed tokens/s, all rows (decoding)"),
                                                       rangemode="tozero", gridcolor=GRID))


def best_k_axis(sweep: BatchSweep) -> dict:
    """The batch axis with the best K measured at each B under its tick."""
    return {**batch_axis(sweep), "ticktext": [f"{s.batch}<br>best K={s.best_k}" for s in sweep.sizes]}


def acceptance_speedup_figure(sweep: BatchSweep) -> go.Figure:
    """Left: the acceptance rate at each K against B (flat: every row runs its own ratio test). Right: the best
    K's goodput over plain batched decoding against B, with the line at 1 (below it, do not speculate).
    Acceptance alone says nothing about whether to speculate (vLLM #26504)."""
    b = [s.batch for s in sweep.sizes]
    ks = sorted(sweep.sizes[0].acceptance_rate)
    traces = [dict(type="scatter", x=b, y=[s.acceptance_rate[k] for s in sweep.sizes], mode="lines+markers",
                   name=f"acceptance rate at K={k}", xaxis="x", yaxis="y",
                   line=dict(color=BEST_COLOUR, width=1 + 2 * (k == max(ks))), opacity=0.35 + 0.65 * (k == max(ks)),
                   hovertemplate=f"B=%{{x}}, K={k}: acceptance rate %{{y:.3f}}<extra></extra>") for k in ks]
    traces.append(dict(type="scatter", x=b, y=[s.best_speedup for s in sweep.sizes], mode="lines+markers+text",
                       name="best K over plain batched decoding", xaxis="x2", yaxis="y2",
                       line=dict(color=OKABE_ITO["vermillion"], width=3), marker=dict(symbol="diamond", size=10),
                       text=[f"{s.best_speedup:.2f}×" for s in sweep.sizes], textposition="top center",
                       hovertemplate="B=%{x}: speedup %{text}<extra></extra>"))
    top = max(1.2, *(s.best_speedup for s in sweep.sizes)) * 1.15
    axis = batch_axis(sweep)
    return figure(traces, "Acceptance stays flat while the speedup falls", height=400, top=110,
                  xaxis={**axis, "domain": [0, 0.45]}, xaxis2={**axis, "domain": [0.55, 1], "anchor": "y2"},
                  yaxis=dict(title=dict(text="acceptance rate"), range=[0, 1.05], gridcolor=GRID),
                  yaxis2=dict(title=dict(text="speedup over plain (decoding)"), range=[0, top], anchor="x2",
                              gridcolor=GRID),
                  shapes=[dict(type="line", xref="x2 domain", x0=0, x1=1, yref="y2", y0=1, y1=1,
                               line=dict(color=PLAIN_COLOUR, dash="dot"))])


def advisor_rows(sweep: BatchSweep) -> list[dict]:
    """The table beside the figures: per B, what was measured (tokens/s over all rows) and what the advisor chose,
    with the goodput its cost model predicted for that choice (a path from the advice back to its forwards)."""
    idle = all(s.idle_share for s in sweep.sizes)  # a column for every row or none
    return [{"B": s.batch, "plain": round(s.plain, 1),
             **({"generate": round(s.hf_generate, 1)} if s.hf_generate is not None else {}),
             "best K": s.best_k, "best K tok/s": round(s.speculative[s.best_k], 1),
             "gain": f"{s.best_speedup:.2f}×",
             **({"idle rows": f"{s.idle_share[s.best_k]:.0%}"} if idle else {}),
             "advisor": "–" if s.advised_k is None else advised_words(s),
             "predicted": predicted_goodput(s),
             "advised / best": "–" if s.advised_over_best is None else round(s.advised_over_best, 2)}
            for s in sweep.sizes]


def predicted_goodput(size: BatchSize) -> float | str:
    """The cost model's goodput for the advised choice ("–" when none was kept)."""
    key = "plain" if size.advised_k == PLAIN_K else str(size.advised_k)
    if size.advised_k is None or key not in size.predicted:
        return "–"
    return round(size.predicted[key], 1)
