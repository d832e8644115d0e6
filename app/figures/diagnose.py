"""The Diagnose page's charts: a diagnosis (app/ui/diagnoses.py's checked dict of `engine diagnose`)
in, a figure out.

- effects_figure: each experiment's effect on the acceptance rate (arm - baseline) with its 95%
  interval over requests, one row per experiment in the report's order, and the zero line;
- paired_figure: one experiment's requests, the baseline's acceptance rate against the arm's.

Plain functions, no Streamlit. Experiment names, request ids and categories come from untrusted
files: they reach Plotly through esc().
"""
import numpy as np
import plotly.graph_objects as go

from app.figures.style import GRID, OKABE_ITO, esc, figure, probability_axis

# engine/diagnose/experiments.py's kinds
CAUSE, TUNING, ALTERNATIVE, PROPERTY = "cause", "tuning", "alternative", "property"
KIND_LEGEND = {CAUSE: "a setting of this drafter (cause)", TUNING: "K (judged by tokens/s, not by this)",
               ALTERNATIVE: "another drafter", PROPERTY: "what the pair does (not a setting)"}
KIND_COLOURS = {CAUSE: OKABE_ITO["blue"], TUNING: OKABE_ITO["sky_blue"], ALTERNATIVE: OKABE_ITO["orange"],
                PROPERTY: OKABE_ITO["grey"]}
KIND_SYMBOLS = {CAUSE: "circle", TUNING: "triangle-up", ALTERNATIVE: "diamond", PROPERTY: "square"}
ROW_PX = 34
MARGIN = dict(l=10, r=10, t=72, b=48)  # room under the plot for the x axis's title


def effect_rows(d: dict) -> list[dict]:
    """The findings that measured an effect on acceptance, in the report's order."""
    return [f for f in d["findings"] if not f["skipped"] and not f["error"] and f["acceptance_rate"] is not None
            and f["acceptance_rate"]["difference"] is not None]


def effect_hover(f: dict) -> str:
    e = f["acceptance_rate"]
    iv = e["interval"]
    found = "found" if e["found"] else "no effect found (the interval includes 0)"
    return (f"<b>{esc(f['experiment'])}</b>: {found}<br>{esc(f['now'])}: acceptance {e['baseline']:.3f}<br>"
            f"{esc(f['change'])}: {e['variant']:.3f}<br>difference {e['difference']:+.3f}, "
            + ("95% joint interval " if e.get("joint", 1) > 1 else "95% interval ")
            + ("–" if iv is None else f"{iv[0]:+.3f} to {iv[1]:+.3f}") + f"<br>{f['requests']} requests in both arms")


def effects_figure(d: dict) -> go.Figure:
    """One point per experiment at its difference in acceptance rate, a bar across its 95% interval;
    filled where the interval excludes 0, open where it does not. Rows top to bottom in the report's order."""
    rows = effect_rows(d)
    labels = [esc(f["experiment"]) for f in rows]
    traces = []
    for kind, legend in KIND_LEGEND.items():
        these = [(label, f) for label, f in zip(labels, rows) if f["kind"] == kind]
        if not these:
            continue
        diffs = [f["acceptance_rate"]["difference"] for _, f in these]
        ivs = [f["acceptance_rate"]["interval"] for _, f in these]
        symbol = KIND_SYMBOLS[kind]
        traces.append(dict(
            type="scatter", mode="markers", name=legend, y=[label for label, _ in these],
            x=np.array(diffs, dtype=float),
            error_x=dict(type="data", symmetric=False, thickness=2, color=KIND_COLOURS[kind],
                         array=np.array([np.nan if iv is None else iv[1] - x for x, iv in zip(diffs, ivs)]),
                         arrayminus=np.array([np.nan if iv is None else x - iv[0] for x, iv in zip(diffs, ivs)])),
            marker=dict(size=11, color=KIND_COLOURS[kind], line=dict(width=2, color=KIND_COLOURS[kind]),
                        symbol=[symbol if f["acceptance_rate"]["found"] else f"{symbol}-open" for _, f in these]),
            hovertext=[effect_hover(f) for _, f in these], hoverinfo="text"))
    zero = dict(type="line", x0=0, x1=0, xref="x", y0=0, y1=1, yref="paper", line=dict(color=GRID, width=2, dash="dot"))
    return figure(traces, "Effect on the acceptance rate (arm − baseline), 95% intervals over requests · "
                  "open marker: no effect found", 190 + ROW_PX * max(1, len(rows)),
                  xaxis=dict(title=dict(text="difference in acceptance rate (accepted / drafted)"), zeroline=False),
                  yaxis=dict(type="category", categoryorder="array", categoryarray=labels, autorange="reversed",
                             title=dict(text="")),
                  shapes=[zero], showlegend=True, margin=MARGIN)


def paired_figure(pairs: list[dict], arm: str) -> go.Figure:
    """Each request both arms finished: the baseline's acceptance rate (x) against the arm's (y).
    Above the diagonal the arm accepted more of that request's draft tokens."""
    shown = [p for p in pairs if p["base"]["acceptance_rate"] is not None and p["arm"]["acceptance_rate"] is not None]
    dots = dict(type="scatter", mode="markers", name="a request",
                x=np.array([p["base"]["acceptance_rate"] for p in shown], dtype=float),
                y=np.array([p["arm"]["acceptance_rate"] for p in shown], dtype=float),
                marker=dict(color=OKABE_ITO["blue"], size=9, symbol="circle", opacity=0.8),
                hovertext=[f"<b>{esc(p['base']['id'])}</b> ({esc(p['base']['category'])})<br>baseline "
                           f"{p['base']['accepted']}/{p['base']['drafted']} = {p['base']['acceptance_rate']:.3f}<br>"
                           f"{esc(arm)} {p['arm']['accepted']}/{p['arm']['drafted']} = {p['arm']['acceptance_rate']:.3f}"
                           for p in shown], hoverinfo="text")
    diagonal = dict(type="scatter", mode="lines", name="the same in both arms", x=[0, 1], y=[0, 1],
                    line=dict(color=GRID, dash="dot"), hoverinfo="skip")
    return figure([diagonal, dots], f"Per request: acceptance rate in the baseline and in {esc(arm)} "
                  f"({len(shown)} requests)", 380,
                  xaxis=probability_axis() | dict(title=dict(text="baseline's acceptance rate")),
                  yaxis=probability_axis() | dict(title=dict(text=f"{esc(arm)}'s acceptance rate")), margin=MARGIN)
