"""The Workload page's charts: a workload's statistics (engine/workload/stats.py's dict) in, a figure out.

- category_figure: acceptance per category with its 95% interval over requests (two workloads side by side);
- conditional_figure: P(position i accepted | all before it accepted), one line per category shown (each
  its own colour), or one group of two workloads; position_rows: the same rates with their counts;
- histogram_figure: the share of cycles that accepted 0..K draft tokens;
- context_figure: acceptance against the tokens before a cycle's first draft position;
- rejection_figure: p_target against p_draft at every rejected draft token (sampled workloads only:
  at temperature 0 both are one-hot).

Every rate axis fits its data, and every rate is drawn with its counts (on the bar, under the
category, in the hover or the table beside it). Plain functions, no Streamlit. Category names and
token texts come from untrusted files: they reach Plotly through esc().
"""
import numpy as np
import plotly.graph_objects as go

from app.figures.style import GRID, OKABE_ITO, esc, figure, fitted_probability_axis, probability_axis

METRICS = {"acceptance_rate": "acceptance rate (accepted / drafted)",
           "mean_acceptance_length": "mean acceptance length (1 + accepted / drafts)"}
SIDES = (OKABE_ITO["blue"], OKABE_ITO["orange"])  # workload A, workload B
# One colour per category line: Okabe-Ito's seven, then six of Paul Tol's muted scheme that none of them is
# near (a workload has a dozen categories; with eight colours the ninth line took the first one's again).
# Grey is left out: "all requests" is drawn in OVERALL_COLOUR. Dash and marker vary too, so colour is
# never the only cue.
LINES = [OKABE_ITO[c] for c in ("blue", "orange", "bluish_green", "vermillion", "reddish_purple", "sky_blue",
                                "yellow")] + ["#332288", "#882255", "#999933", "#117733", "#AA4499", "#661100"]
OVERALL_COLOUR = "#444444"
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "triangle-down", "star", "cross", "pentagon")
OVERALL = "all requests"
COUNT_FONT = dict(size=11)


def groups(stats: dict) -> dict[str, dict]:
    """The categories in name order, then the whole workload."""
    return {**{name: stats["categories"][name] for name in sorted(stats["categories"])}, OVERALL: stats["overall"]}


def error_bars(values: list, intervals: list) -> dict:
    """Asymmetric error bars from [low, high] intervals (none where a group has no interval)."""
    up = [None if iv is None or v is None else iv[1] - v for v, iv in zip(values, intervals)]
    down = [None if iv is None or v is None else v - iv[0] for v, iv in zip(values, intervals)]
    return dict(type="data", symmetric=False, array=np.array(up, dtype=float),
                arrayminus=np.array(down, dtype=float), color=GRID, thickness=1.5)


def category_bars(stats: dict, metric: str, label: str, colour: str) -> dict:
    named = groups(stats)
    values = [g[metric] for g in named.values()]
    intervals = [(g.get("intervals") or {}).get(metric) for g in named.values()]
    hover = [f"<b>{esc(n)}</b> · {label}<br>{metric.replace('_', ' ')} {'–' if v is None else f'{v:.3f}'}"
             f"<br>95% interval over requests: {'–' if iv is None else f'{iv[0]:.3f} to {iv[1]:.3f}'}"
             f"<br>{g['requests']} requests · {g['cycles']} cycles"
             for (n, g), v, iv in zip(named.items(), values, intervals)]
    return dict(type="bar", name=esc(label), x=[esc(n) for n in named], y=np.array(values, dtype=float),
                error_y=error_bars(values, intervals), marker=dict(color=colour),
                hovertext=hover, hoverinfo="text")


def category_ticks(stats: dict, other: dict | None) -> dict:
    """Each category's name over its request count (both workloads', A | B, where two are drawn)."""
    sides = [groups(s) for s in (stats, other) if s is not None]
    names = list(dict.fromkeys(n for named in sides for n in named))
    counts = [" | ".join(str(named[n]["requests"]) if n in named else "–" for named in sides) for n in names]
    return dict(tickmode="array", tickvals=[esc(n) for n in names],
                ticktext=[f"{esc(n)}<br>{c} req" for n, c in zip(names, counts)])


def category_figure(stats: dict, metric: str = "acceptance_rate", other: dict | None = None,
                    labels: tuple[str, str] = ("this workload", "other workload")) -> go.Figure:
    """Each category's acceptance with its interval and request count; with `other`, the two workloads
    bar by bar (categories only one of them has get an empty slot in the other)."""
    bars = [category_bars(stats, metric, labels[0], SIDES[0])]
    if other is not None:
        bars.append(category_bars(other, metric, labels[1], SIDES[1]))
    axis = dict(title=dict(text=METRICS[metric]), rangemode="tozero")
    if metric == "acceptance_rate":
        tops = [g[metric] if iv is None else iv[1] for s in (stats, other) if s is not None
                for g in groups(s).values() for iv in [(g.get("intervals") or {}).get(metric)]]
        axis = fitted_probability_axis(tops) | dict(title=dict(text=METRICS[metric]))
    return figure(bars, f"By category: {METRICS[metric]}, with 95% intervals that resample requests",
                  400, barmode="group", yaxis=axis,
                  xaxis=dict(title=dict(text="category (requests)"), **category_ticks(stats, other)))


def default_lines(stats: dict) -> list[str]:
    """The categories the positions chart shows first: all of them where each can have its own colour,
    else the lowest and the highest by acceptance rate (unmeasured ones last), in name order."""
    names = sorted(stats["categories"])
    if len(names) <= len(LINES):
        return names
    ranked = sorted(names, key=lambda n: (stats["categories"][n]["acceptance_rate"] is None,
                                          stats["categories"][n]["acceptance_rate"] or 0.0, n))
    measured = [n for n in ranked if stats["categories"][n]["acceptance_rate"] is not None]
    half = len(LINES) // 2
    return sorted(set(measured[:half] + measured[-half:]))


def conditional_line(g: dict, name: str, colour: str, dash: str, width: float, symbol: str = "circle") -> dict | None:
    rows = g["conditional_acceptance"]
    if rows is None:  # a server's group that carries no per-step counts
        return None
    return dict(type="scatter", mode="lines+markers", name=esc(name),
                x=[r["position"] for r in rows], y=np.array([r["rate"] for r in rows], dtype=float),
                line=dict(color=colour, width=width, dash=dash), marker=dict(symbol=symbol, size=7),
                hovertext=[f"<b>{esc(name)}</b> · position {r['position']}<br>accepted {r['accepted']} of "
                           f"{r['reached']} cycles that reached it" for r in rows], hoverinfo="text")


def conditional_lines(stats: dict, shown: list[str] | None, other: dict | None, labels: tuple[str, str]) -> list:
    """One line per shown category (at most one per colour) and the whole workload's; with `other`,
    the first shown group (else all requests) of each workload."""
    if other is not None:
        group = (shown or [OVERALL])[0]
        pairs = [(s, label, SIDES[i]) for i, (s, label) in enumerate(zip((stats, other), labels))]
        return [conditional_line(groups(s)[group], f"{label} · {group}", colour, "solid", 2.5)
                for s, label, colour in pairs if group in groups(s)]
    names = [n for n in (default_lines(stats) if shown is None else shown) if n in stats["categories"]]
    lines = [conditional_line(stats["categories"][n], n, LINES[i], DASHES[i % len(DASHES)], 1.8,
                              SYMBOLS[i % len(SYMBOLS)]) for i, n in enumerate(names[:len(LINES)])]
    return lines + [conditional_line(stats["overall"], OVERALL, OVERALL_COLOUR, "solid", 3.5)]


def conditional_figure(stats: dict, shown: list[str] | None = None, other: dict | None = None,
                       labels: tuple[str, str] = ("this workload", "other workload")) -> go.Figure:
    """The rate at each position among cycles that reached it (default_lines picks the categories)."""
    lines = [line for line in conditional_lines(stats, shown, other, labels) if line is not None]
    rates = [v for line in lines for v in line["y"]]
    return figure(lines, "Conditional acceptance by draft position: P(i accepted | 1..i-1 accepted)", 400,
                  yaxis=fitted_probability_axis(rates) | dict(title=dict(text="rate among cycles that reached it")),
                  xaxis=dict(title=dict(text="draft position"), dtick=1))


def position_rows(named: dict[str, dict]) -> list[dict]:
    """The conditional rates as table rows, each with its counts: accepted of reached."""
    rows = []
    for name, g in named.items():
        cells = {f"position {r['position']}": f"{fmt(r['rate'])} ({r['accepted']}/{r['reached']})"
                 for r in g["conditional_acceptance"] or []}
        rows.append({"group": name, **cells})
    return rows


def side_by_side(stats: dict, other: dict | None, labels: tuple[str, str], bars_of) -> list[dict]:
    """One bar trace per workload that has what `bars_of(stats, label, colour)` draws (it returns None if not)."""
    drawn = (bars_of(s, label, SIDES[side]) for side, (s, label) in enumerate(zip((stats, other), labels))
             if s is not None)
    return [bars for bars in drawn if bars is not None]


def histogram_bars(s: dict, label: str, colour: str) -> dict | None:
    counts = s["overall"]["accepted_histogram"]
    if counts is None:  # a server's file without a histogram
        return None
    total = max(1, sum(counts))
    return dict(type="bar", name=esc(label), x=list(range(len(counts))), y=np.array([c / total for c in counts]),
                marker=dict(color=colour), hoverinfo="text", text=[str(c) for c in counts], textposition="outside",
                textfont=COUNT_FONT, cliponaxis=False,
                hovertext=[f"{c} of {total} cycles accepted {j}" for j, c in enumerate(counts)])


def histogram_figure(stats: dict, other: dict | None = None,
                     labels: tuple[str, str] = ("this workload", "other workload")) -> go.Figure:
    """The share of cycles that accepted exactly j draft tokens, j = 0..K, each bar with its count of cycles."""
    bars = side_by_side(stats, other, labels, histogram_bars)
    axis = fitted_probability_axis([v for b in bars for v in b["y"]], 1.3)
    return figure(bars, "Draft tokens accepted per cycle (all requests; the number of cycles on each bar)",
                  330, barmode="group", yaxis=axis | dict(title=dict(text="share of cycles")),
                  xaxis=dict(title=dict(text="accepted draft tokens in the cycle"), dtick=1))


def context_bars(s: dict, label: str, colour: str) -> dict:
    bins = s.get("context_length") or []
    names = [bin_name(b) for b in bins]
    return dict(type="bar", name=esc(label), x=names, y=np.array([b["acceptance_rate"] for b in bins], dtype=float),
                marker=dict(color=colour), hoverinfo="text", textposition="outside", textfont=COUNT_FONT,
                cliponaxis=False, text=[f"{b['requests']} req<br>{b['cycles']} cyc" for b in bins],
                hovertext=[f"{n} tokens<br>acceptance rate {fmt(b['acceptance_rate'])} · length "
                           f"{fmt(b['mean_acceptance_length'], 2)}<br>{b['cycles']} cycles of {b['requests']} requests"
                           for n, b in zip(names, bins)])


CONTEXT_TITLE = "Acceptance against context length (tokens before the cycle's first draft position)"


def context_figure(stats: dict, other: dict | None = None,
                   labels: tuple[str, str] = ("this workload", "other workload"), title: str = CONTEXT_TITLE,
                   axis_title: str = "context length (tokens)") -> go.Figure:
    """Acceptance rate by bins of the context before the cycle (prompt and everything committed), each
    bar with its requests and cycles: a bin of one request is one request's rate. A server workload's
    bins are of its prompts' lengths (app/figures/server_workload.py names them so)."""
    bars = side_by_side(stats, other, labels, context_bars)
    axis = fitted_probability_axis([v for b in bars for v in b["y"]], 1.45)  # room for two lines of counts
    return figure(bars, title, 360, barmode="group", yaxis=axis | dict(title=dict(text="acceptance rate")),
                  xaxis=dict(title=dict(text=axis_title), type="category"))


def rejection_figure(stats: dict) -> go.Figure:
    """p_target against p_draft at each rejected draft token: far below the diagonal, the draft was
    confident where the target was not."""
    rejected = stats["loss"]["rejected_tokens"]
    points = rejected["points"]
    dots = dict(type="scattergl", mode="markers", name="rejected draft token",
                x=np.array([p["p_draft"] for p in points], dtype=float),
                y=np.array([p["p_target"] for p in points], dtype=float),
                marker=dict(color=OKABE_ITO["vermillion"], symbol="x", size=6, opacity=0.6),
                hovertext=[f"request {esc(p['request'])} · cycle {p['cycle']}<br>p_draft {p['p_draft']:.3f} · "
                           f"p_target {p['p_target']:.3f}" for p in points], hoverinfo="text")
    diagonal = dict(type="scatter", mode="lines", name="p_target = p_draft", x=[0, 1], y=[0, 1],
                    line=dict(color=GRID, dash="dot"), hoverinfo="skip")
    return figure([diagonal, dots], f"At each rejection: p_target against p_draft ({len(points)} shown)", 380,
                  xaxis=probability_axis() | dict(title=dict(text="p_draft of the rejected token")),
                  yaxis=probability_axis() | dict(title=dict(text="p_target of the same token")))


def bin_name(b: dict) -> str:
    return f"{b['low']}+" if b.get("high") is None else f"{b['low']}-{b['high'] - 1}"


def fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"
