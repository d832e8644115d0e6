"""The Diagnose page's charts: a diagnosis (app/ui/diagnoses.py's checked dict of `engine diagnose`)
in, a figure out.

- verdict_figure: each change's tokens/s over the baseline's on the same clock, the verdict's order
  first (engine/diagnose/verdict.py, its options passed in as dicts), and the baseline's line at 1;
- effects_figure: each experiment's effect on the acceptance rate (arm - baseline) with its 95%
  interval over requests, one row per experiment in the report's order, and the zero line;
- paired_figure: one experiment's requests, the baseline's acceptance rate against the arm's, on axes
  fitted to those rates.

Plain functions, no Streamlit. Experiment names, request ids and categories come from untrusted
files: they reach Plotly through esc().
"""
import numpy as np
import plotly.graph_objects as go

from app.figures.style import GRID, OKABE_ITO, esc, figure

# engine/diagnose/experiments.py's kinds
CAUSE, TUNING, ALTERNATIVE, PROPERTY = "cause", "tuning", "alternative", "property"
KIND_LEGEND = {CAUSE: "a setting of this drafter (cause)", TUNING: "K (judged by tokens/s, not by this)",
               ALTERNATIVE: "another drafter", PROPERTY: "what the pair does (not a setting)"}
KIND_COLOURS = {CAUSE: OKABE_ITO["blue"], TUNING: OKABE_ITO["sky_blue"], ALTERNATIVE: OKABE_ITO["orange"],
                PROPERTY: OKABE_ITO["grey"]}
KIND_SYMBOLS = {CAUSE: "circle", TUNING: "triangle-up", ALTERNATIVE: "diamond", PROPERTY: "square"}
ROW_PX = 34
MARGIN = dict(l=10, r=10, t=72, b=48)  # room under the plot for the x axis's title
# engine/diagnose/verdict.py's clocks: how a change's tokens/s were timed
CLOCK_LEGEND = {"wall clock": "measured on the wall clock (interleaved arms)",
                "step times": "on this machine's calibrated step times"}
CLOCK_SYMBOLS = {"wall clock": "circle", "step times": "diamond"}
VERDICT_ROW_PX = 26


def padded(low: float, high: float, share: float = 0.06) -> list[float]:
    """[low, high] widened by `share` of its span on each side (a point at an end is not cut in half)."""
    pad = max(high - low, 1e-9) * share
    return [low - pad, high + pad]


def speedup_bounds(o: dict) -> tuple[float, float]:
    """The interval of the difference in tokens/s, as multiples of the baseline's (the point for a prediction)."""
    if o["interval"] is None:
        return o["speedup"], o["speedup"]
    return tuple((o["baseline"] + end) / o["baseline"] for end in o["interval"])


def option_label(o: dict, rank: int | None) -> str:
    return (f"{rank}. " if rank else "") + f"{esc(o['name'])} ×{o['speedup']:.2f} (n={o['requests']})"


def option_hover(o: dict) -> str:
    low, high = speedup_bounds(o)
    how = ("the K advisor's figure: one target step a token" if o["interval"] is None else
           f"difference {o['variant'] - o['baseline']:+.1f} tokens/s, 95% {'joint ' if o['joint'] > 1 else ''}"
           f"interval {o['interval'][0]:+.1f} to {o['interval'][1]:+.1f} (×{low:.2f} to ×{high:.2f})")
    return (f"<b>{esc(o['name'])}</b>: {'faster' if o['faster'] else 'not shown faster'}<br>"
            f"tokens/s on the {esc(o['clock'])}: {o['baseline']:.1f} → {o['variant']:.1f} (×{o['speedup']:.2f})<br>"
            f"{how}<br>{o['requests']} requests")


def verdict_figure(options: list[dict], ranked: int) -> go.Figure:
    """One row per change, top to bottom: the verdict's `ranked` first (numbered), then the rest. A point at
    its tokens/s over the baseline's on the same clock, a bar across its interval; filled where it is faster."""
    labels = [option_label(o, i + 1 if i < ranked else None) for i, o in enumerate(options)]
    traces = []
    for clock, legend in CLOCK_LEGEND.items():
        these = [(label, o) for label, o in zip(labels, options) if o["clock"] == clock]
        if not these:
            continue
        x = [o["speedup"] for _, o in these]
        bounds = [speedup_bounds(o) for _, o in these]
        colour = OKABE_ITO["blue"] if clock == "wall clock" else OKABE_ITO["bluish_green"]
        traces.append(dict(
            type="scatter", mode="markers", name=legend, y=[label for label, _ in these], x=np.array(x, dtype=float),
            error_x=dict(type="data", symmetric=False, thickness=2, color=colour,
                         array=np.array([high - v for v, (_, high) in zip(x, bounds)]),
                         arrayminus=np.array([v - low for v, (low, _) in zip(x, bounds)])),
            marker=dict(size=11, color=colour, line=dict(width=2, color=colour),
                        symbol=[CLOCK_SYMBOLS[clock] + ("" if o["faster"] else "-open") for _, o in these]),
            hovertext=[option_hover(o) for _, o in these], hoverinfo="text"))
    ends = [e for o in options for e in speedup_bounds(o)] + [1.0]
    line = dict(type="line", x0=1, x1=1, xref="x", y0=0, y1=1, yref="paper", line=dict(color=GRID, width=2, dash="dot"))
    fig = figure(traces, "What to change, fastest first (× the baseline's tokens/s on the same clock)",
                 110 + VERDICT_ROW_PX * max(1, len(options)),
                 xaxis=dict(title=dict(text="dotted line: the baseline · open marker: not shown faster"),
                            range=padded(min(ends), max(ends)), tickprefix="×", zeroline=False),
                 yaxis=dict(type="category", categoryorder="array", categoryarray=labels, autorange="reversed",
                            title=dict(text="")),
                 shapes=[line], showlegend=True, margin=dict(l=10, r=10, t=58, b=38))
    # from the chart's left edge, not the plot's: the row labels are wide, and the toolbar sits at the right
    return fig.update_layout(title_xref="container")


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
    labels = [f"{esc(f['experiment'])} (n={f['requests']})" for f in rows]  # the requests behind each difference
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


def rate_axis(rates: list[float], title: str) -> dict:
    """An acceptance-rate axis fitted to the rates shown (0.04 to 0.12 fills the plot), never past 0 or 1
    by more than its padding."""
    low, high = (min(rates), max(rates)) if rates else (0.0, 1.0)
    return dict(title=dict(text=title), range=padded(max(0.0, low), min(1.0, max(high, low + 0.02))))


def paired_figure(pairs: list[dict], arm: str) -> go.Figure:
    """Each request both arms finished: the baseline's acceptance rate (x) against the arm's (y), on one
    range for both axes fitted to the rates. Above the diagonal the arm accepted more of that request's
    draft tokens."""
    shown = [p for p in pairs if p["base"]["acceptance_rate"] is not None and p["arm"]["acceptance_rate"] is not None]
    rates = [p[side]["acceptance_rate"] for p in shown for side in ("base", "arm")]
    dots = dict(type="scatter", mode="markers", name="a request",
                x=np.array([p["base"]["acceptance_rate"] for p in shown], dtype=float),
                y=np.array([p["arm"]["acceptance_rate"] for p in shown], dtype=float),
                marker=dict(color=OKABE_ITO["blue"], size=9, symbol="circle", opacity=0.8),
                hovertext=[f"<b>{esc(p['base']['id'])}</b> ({esc(p['base']['category'])})<br>baseline "
                           f"{p['base']['accepted']}/{p['base']['drafted']} = {p['base']['acceptance_rate']:.3f}<br>"
                           f"{esc(arm)} {p['arm']['accepted']}/{p['arm']['drafted']} = {p['arm']['acceptance_rate']:.3f}"
                           for p in shown], hoverinfo="text")
    x_axis = rate_axis(rates, "baseline's acceptance rate (a request's accepted / drafted: its hover)")
    span = x_axis["range"]
    diagonal = dict(type="scatter", mode="lines", name="the same in both arms", x=span, y=span,
                    line=dict(color=GRID, dash="dot"), hoverinfo="skip")
    fig = figure([diagonal, dots], f"Per request: acceptance rate, baseline against {esc(arm)} ({len(shown)} requests)",
                 380, xaxis=x_axis, yaxis=rate_axis(rates, f"{esc(arm)}'s acceptance rate"), margin=MARGIN)
    return fig.update_layout(title_xref="container")  # a long arm name: from the chart's left edge
