"""Plotly figures of the teaching pages: plain data in, figure out, no Streamlit calls.

Colours are Okabe-Ito (safe for the common colour-vision deficiencies) and every
category also differs by a pattern, a marker, a line dash or a word. No background or
font colour is set, so the app's light or dark theme supplies them. Plotly renders a
subset of HTML in text and hovers: every token text goes through `token_label`
(html.escape) first.
"""
import html
from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.figures.derive import VISIBLE_WHITESPACE
from app.figures.style import GRID, MONO, OKABE_ITO
from engine.stats.repeats import Repeated
from engine.teaching.exactness import LabResult
from engine.teaching.runs import (
    CORRECT,
    DRIFT_FLOOR,
    IN_PLACE,
    KEEP_REJECTED,
    MODE_LABELS,
    SHIFTED,
    SKIP_CATCH_UP,
    STALE,
    CacheView,
    Comparison,
)
from engine.trace.metrics import expected_tokens_per_cycle, predicted_speedup

FLOAT_LEVEL = 1e-4  # cached vs fresh distances below this are float rounding

# One look per run mode: colour, line dash and marker, so lines differ without colour.
MODE_STYLE = {
    "reference": (OKABE_ITO["grey"], "solid", "square"),
    CORRECT: (OKABE_ITO["blue"], "solid", "circle"),
    KEEP_REJECTED: (OKABE_ITO["vermillion"], "dash", "x"),
    SKIP_CATCH_UP: (OKABE_ITO["orange"], "dot", "diamond"),
}
# Cache-cell status: colour, bar pattern, the mark printed on the cell.
CELL_STYLE = {
    IN_PLACE: (OKABE_ITO["bluish_green"], "", ""),
    STALE: (OKABE_ITO["vermillion"], "x", "✗"),
    SHIFTED: (OKABE_ITO["reddish_purple"], "/", "→"),
}
CELL_WORDS = {IN_PLACE: "in place (right token, right position)",
              STALE: "stale: K/V of a rejected or discarded draft token",
              SHIFTED: "shifted: a committed token at the wrong position"}


def token_label(text: str) -> str:
    """A token for a figure: whitespace made visible, control characters spelled out, escaped."""
    out = "".join(VISIBLE_WHITESPACE.get(ch, ch if ch.isprintable() else f"\\x{ord(ch):02x}") for ch in text)
    return html.escape(out or "∅", quote=False)


def cell_label(text: str, width: int = 3) -> str:
    """A token cut to fit a narrow cell (the hover shows it whole), then escaped."""
    return token_label(text if len(text) <= width else text[: width - 1] + "…")


def rgba(hex_colour: str, alpha: float) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def layout(fig: go.Figure, title: str, height: int, top: int = 80, **extra) -> go.Figure:
    """Title top-left, legend on its own line under it (unless given), no theme colours."""
    legend = extra.pop("legend", dict(orientation="h", yanchor="bottom", y=1.02, x=0, xanchor="left"))
    fig.update_layout(title=dict(text=title, x=0, xanchor="left", y=0.98, yanchor="top", font=dict(size=14)),
                      height=height, margin=dict(l=10, r=10, t=top, b=10), legend=legend,
                      hoverlabel=dict(font=dict(family=MONO)), **extra)
    return fig


# ---------------------------------------------------------------- rollback demo: outputs

def divergence_rows(cmp: Comparison) -> list[tuple[str, str, list[int]]]:
    """(key, label, generated ids) per row; plain decoding only when greedy (else not comparable)."""
    rows = []
    if cmp.settings["temperature"] == 0 and cmp.reference is not None:
        rows.append(("reference", "plain target decoding", cmp.reference))
    rows += [(mode, MODE_LABELS[mode], run.generated) for mode, run in cmp.runs.items()]
    return rows


def divergence_figure(cmp: Comparison, max_tokens: int = 64) -> go.Figure:
    """One row per run, one cell per generated token; cells that differ from the correct
    run are hatched and marked, the first difference of each row is outlined."""
    correct = cmp.runs[CORRECT].generated
    rows = divergence_rows(cmp)
    fig = go.Figure()
    for same in (True, False):
        xs, ys, hover = [], [], []
        for _key, label, ids in rows:
            for i, t in enumerate(ids[:max_tokens]):
                if (i < len(correct) and correct[i] == t) == same:
                    xs.append(i), ys.append(label)
                    hover.append(f"{html.escape(label)}, token {i}: <b>{token_label(cmp.texts[t])}</b>")
        colour = OKABE_ITO["blue"] if same else OKABE_ITO["vermillion"]
        fig.add_bar(x=[0.9] * len(xs), base=[x - 0.45 for x in xs], y=ys, orientation="h", width=0.8,
                    name="same token as the correct run" if same else "✗ differs from the correct run",
                    marker=dict(color=rgba(colour, 0.25), line=dict(color=colour, width=1),
                                pattern=dict(shape="" if same else "x", fgcolor=colour, fgopacity=0.4, size=6)),
                    hovertext=hover, hovertemplate="%{hovertext}<extra></extra>")
    longest = max((len(cmp.texts[t]) for _, _, ids in rows for t in ids[:max_tokens]), default=1)
    for _key, label, ids in rows:
        fig.add_scatter(x=list(range(len(ids[:max_tokens]))), y=[label] * len(ids[:max_tokens]), mode="text",
                        text=[cell_label(cmp.texts[t]) for t in ids[:max_tokens]], showlegend=False,
                        hoverinfo="skip", textfont=dict(family=MONO, size=12 if longest <= 2 else 9))
    _mark_first_divergence(fig, rows, correct, max_tokens)
    fig.update_yaxes(categoryorder="array", categoryarray=[label for _, label, _ in reversed(rows)], fixedrange=True)
    fig.update_xaxes(title="generated token index", range=[-0.6, min(max_tokens, max(len(r[2]) for r in rows)) - 0.4])
    return layout(fig, "Generated tokens, run by run (same prompt, settings and seed)", 120 + 44 * len(rows),
                  barmode="overlay", dragmode="pan")


def _mark_first_divergence(fig: go.Figure, rows, correct: list[int], max_tokens: int) -> None:
    from engine.teaching.runs import first_divergence
    for _, label, ids in rows:
        first = first_divergence(ids, correct)
        if first is not None and first < min(max_tokens, len(ids)):
            fig.add_scatter(x=[first], y=[label], mode="markers", showlegend=False, hoverinfo="skip",
                            marker=dict(symbol="square-open", size=26, color=OKABE_ITO["vermillion"],
                                        line=dict(width=3, color=OKABE_ITO["vermillion"])))


# ---------------------------------------------------------------- rollback demo: drift

def drift_figure(cmp: Comparison, metric: str = "tv") -> go.Figure:
    """Per cycle, distance between the next-token distribution computed from each run's
    cache and from a fresh prefill of its committed sequence; target left, draft right."""
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=("target model", "draft model"))
    for mode, run in cmp.runs.items():
        colour, dash, symbol = MODE_STYLE[mode]
        for col, model in ((1, "target"), (2, "draft")):
            values = [max(getattr(c, f"{model}_{metric}"), DRIFT_FLOOR) for c in run.cycles]
            fig.add_scatter(x=[c.cycle for c in run.cycles], y=values, mode="lines+markers", row=1, col=col,
                            name=MODE_LABELS[mode], legendgroup=mode, showlegend=col == 1,
                            line=dict(color=colour, dash=dash, width=2), marker=dict(symbol=symbol, size=8, color=colour),
                            hovertemplate=f"{MODE_LABELS[mode]}<br>cycle %{{x}}: %{{y:.2e}}<extra>{model}</extra>")
    last = max((c.cycle for run in cmp.runs.values() for c in run.cycles), default=0)
    for col in (1, 2):  # where float rounding ends: a correct cache stays below this line
        fig.add_scatter(x=[0, last], y=[FLOAT_LEVEL, FLOAT_LEVEL], mode="lines", row=1, col=col,
                        name="float rounding ends here", legendgroup="float", showlegend=col == 1,
                        line=dict(color=GRID, dash="dot", width=2), hoverinfo="skip")
    name = "total variation" if metric == "tv" else "KL(fresh ‖ cached), nats"
    fig.update_yaxes(type="log", title=f"{name} (log)", exponentformat="power", row=1, col=1)
    fig.update_xaxes(title="cycle")
    fig.update_annotations(yshift=4)  # the subplot titles, clear of the plots
    return layout(fig, "Next-token distribution from the run's cache vs from a fresh prefill", 420, top=120,
                  legend=dict(orientation="h", yanchor="bottom", y=1.12, x=0, xanchor="left"))


# ---------------------------------------------------------------- rollback demo: the cache

CACHE_WINDOW = 48  # cells shown at once; the view can be panned to earlier ones


def cache_strip_figure(target: CacheView, draft: CacheView, attention: Sequence[float],
                       texts: dict[int, str], title: str) -> go.Figure:
    """Both caches cell by cell, coloured by status, with the target's attention from the
    next position on each of its cells underneath."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.45, 0.55], vertical_spacing=0.08)
    for model, view in (("target", target), ("draft", draft)):
        for status, (colour, pattern, _mark) in CELL_STYLE.items():
            idx = [p for p, s in enumerate(view.status) if s == status]
            if not idx:
                continue
            fig.add_bar(x=[0.9] * len(idx), base=[p - 0.45 for p in idx], y=[f"{model} cache"] * len(idx),
                        orientation="h", width=0.8, name=CELL_WORDS[status], legendgroup=status,
                        showlegend=model == "target" or status not in target.status, row=1, col=1,
                        marker=dict(color=rgba(colour, 0.3), line=dict(color=colour, width=1.5),
                                    pattern=dict(shape=pattern, fgcolor=colour, fgopacity=0.5, size=6)),
                        hovertext=[f"{model} cache cell {p}: K/V of <b>{token_label(texts[view.token_ids[p]])}</b>"
                                   f"<br>{CELL_WORDS[status]}" for p in idx],
                        hovertemplate="%{hovertext}<extra></extra>")
        fig.add_scatter(x=list(range(len(view.token_ids))), y=[f"{model} cache"] * len(view.token_ids),
                        mode="text", text=[token_label(texts[t]) + CELL_STYLE[s][2] for t, s in
                                           zip(view.token_ids, view.status)],
                        textfont=dict(family=MONO, size=11), showlegend=False, hoverinfo="skip", row=1, col=1)
    _attention_bars(fig, target, attention)
    end = max(len(target.token_ids), len(draft.token_ids))
    fig.update_xaxes(range=[max(-0.5, end - CACHE_WINDOW - 0.5), end - 0.5])
    fig.update_xaxes(title="cache position", row=2, col=1)
    fig.update_yaxes(categoryorder="array", categoryarray=["draft cache", "target cache"], fixedrange=True, row=1, col=1)
    fig.update_yaxes(title="target attention", row=2, col=1)
    return layout(fig, title, 430, top=110, barmode="overlay", dragmode="pan")


def _attention_bars(fig: go.Figure, target: CacheView, attention: Sequence[float]) -> None:
    colours = [CELL_STYLE[s][0] for s in target.status]
    patterns = [CELL_STYLE[s][1] for s in target.status]
    fig.add_bar(x=list(range(len(attention))), y=list(attention), showlegend=False, row=2, col=1,
                marker=dict(color=colours, pattern=dict(shape=patterns, fillmode="overlay", fgcolor="rgba(255,255,255,0.6)",
                                                        size=5, solidity=0.3)),
                hovertemplate="cell %{x}: %{y:.3f} of the attention<extra></extra>")


# ---------------------------------------------------------------- exactness lab

def histogram_entries(res: LabResult, top: int) -> list[int]:
    """Token ids worth a bar: the most likely under the target, plus any that were drawn often."""
    n = max(res.samples, 1)
    weight = [max(p, res.speculative_counts[i] / n, res.plain_counts[i] / n,
                  res.predicted[i] if res.predicted else 0.0) for i, p in enumerate(res.exact)]
    return sorted(range(len(weight)), key=lambda i: -weight[i])[:top]


def lab_histogram_figure(res: LabResult, texts: dict[int, str], rule_label: str, top: int = 20) -> go.Figure:
    """Sampled frequencies (speculative and plain) against the exact target distribution;
    everything outside the shown tokens is one 'other' bar."""
    ids = histogram_entries(res, top)
    labels = [f"{token_label(texts[i])} #{i}" for i in ids] + ["other"]
    n = max(res.samples, 1)

    def with_other(values: list[float]) -> list[float]:
        shown = [values[i] for i in ids]
        return shown + [max(0.0, sum(values) - sum(shown))]

    fig = go.Figure()
    fig.add_bar(x=labels, y=with_other([c / n for c in res.speculative_counts]), name=f"speculative ({rule_label})",
                marker=dict(color=OKABE_ITO["orange"]), hovertemplate="speculative %{y:.3f}<extra>%{x}</extra>")
    fig.add_bar(x=labels, y=with_other([c / n for c in res.plain_counts]), name="plain target sampling",
                marker=dict(color=OKABE_ITO["sky_blue"],
                            pattern=dict(shape="/", fillmode="overlay", fgcolor="rgba(255,255,255,0.7)", size=6, solidity=0.3)),
                hovertemplate="plain %{y:.3f}<extra>%{x}</extra>")
    fig.add_scatter(x=labels, y=with_other(res.exact), mode="markers", name="target distribution (exact)",
                    marker=dict(symbol="line-ew-open", size=30, color=OKABE_ITO["blue"], line=dict(width=4)),
                    hovertemplate="target %{y:.3f}<extra>%{x}</extra>")
    if res.predicted is not None:
        fig.add_scatter(x=labels, y=with_other(res.predicted), mode="markers", name="what this rule samples (worked out)",
                        marker=dict(symbol="diamond-open", size=11, color=OKABE_ITO["reddish_purple"], line=dict(width=2)),
                        hovertemplate="rule's own distribution %{y:.3f}<extra>%{x}</extra>")
    fig.update_yaxes(title="share of samples / probability", rangemode="tozero")
    fig.update_xaxes(type="category", title="token (text #id)")
    which = "next token" if res.position == 1 else "token after next"
    return layout(fig, f"The {which}: {res.samples} samples each", 420, top=96, barmode="group", bargap=0.25)


# ---------------------------------------------------------------- interview figures

def forward_cost_figure(timings: Sequence[Repeated], model_name: str) -> go.Figure:
    """Time of one forward pass over 1..n new positions: median bar, middle half as an error bar;
    a width whose repeats disagree (spread over MAX_SPREAD) is hatched grey and labelled so."""
    n = list(range(1, len(timings) + 1))
    ms = [t.median_s * 1000 for t in timings]
    ok = [t.trustworthy for t in timings]
    fig = go.Figure()
    fig.add_bar(x=n, y=ms, marker=dict(color=[OKABE_ITO["blue"] if good else OKABE_ITO["grey"] for good in ok],
                                       pattern=dict(shape=["" if good else "/" for good in ok])),
                error_y=dict(type="data", symmetric=False,
                             array=[(t.high_s - t.median_s) * 1000 for t in timings],
                             arrayminus=[(t.median_s - t.low_s) * 1000 for t in timings]),
                text=[f"{v:.1f} ms" if good else f"{v:.1f} ms?<br>spread {t.spread:.0%}"
                      for v, good, t in zip(ms, ok, timings)], textposition="outside", cliponaxis=False,
                customdata=[t.describe() for t in timings],
                hovertemplate="%{x} positions: %{customdata}<extra></extra>")
    fig.update_xaxes(title="positions scored in one forward pass", dtick=1)
    fig.update_yaxes(title="median time (ms), bar: middle half of repeats", rangemode="tozero")
    return layout(fig, f"{html.escape(model_name)}: one pass over n positions, measured now", 340, top=60)


def speedup_figure(alpha: float, c: float, k_max: int = 12, k_marked: int | None = None) -> go.Figure:
    """Predicted wall-time speedup against K for the measured alpha and c (Leviathan et al.)."""
    ks = list(range(1, k_max + 1))
    fig = go.Figure()
    for a, dash, colour in ((alpha, "solid", OKABE_ITO["blue"]), (max(alpha - 0.2, 0.0), "dash", OKABE_ITO["reddish_purple"]),
                            (min(alpha + 0.2, 0.99), "dot", OKABE_ITO["bluish_green"])):
        fig.add_scatter(x=ks, y=[predicted_speedup(a, k, c) for k in ks], mode="lines+markers",
                        name=f"α = {a:.2f}" + (" (this trace)" if a == alpha else ""),
                        line=dict(color=colour, dash=dash, width=2),
                        hovertemplate=f"α {a:.2f}, K %{{x}}: %{{y:.2f}}×<extra></extra>")
    fig.add_hline(y=1.0, line=dict(color=GRID, width=3),
                  annotation_text="break-even: slower below this line", annotation_position="bottom left")
    if k_marked:
        fig.add_vline(x=k_marked, line=dict(color=GRID, dash="dot"), annotation_text=f"trace K={k_marked}")
    fig.update_xaxes(title="K (draft tokens per cycle)", dtick=1)
    fig.update_yaxes(title="predicted speedup (×)", rangemode="tozero")
    return layout(fig, f"Predicted speedup (1−α^(K+1)) / ((1−α)(Kc+1)) at c = {c:.2f}", 360, top=90)


def acceptance_length_figure(tokens_per_cycle: Sequence[int], k: int, alpha: float) -> go.Figure:
    """How many tokens each cycle committed, with the mean and the i.i.d. prediction."""
    counts = [sum(1 for t in tokens_per_cycle if t == n) for n in range(1, k + 2)]
    mean = sum(tokens_per_cycle) / max(len(tokens_per_cycle), 1)
    fig = go.Figure()
    fig.add_bar(x=list(range(1, k + 2)), y=counts, marker=dict(color=OKABE_ITO["bluish_green"]),
                name="cycles", hovertemplate="%{y} cycles committed %{x} tokens<extra></extra>")
    fig.add_vline(x=mean, line=dict(color=OKABE_ITO["blue"], width=3),
                  annotation_text=f"mean acceptance length {mean:.2f}", annotation_position="top left")
    fig.add_vline(x=expected_tokens_per_cycle(alpha, k), line=dict(color=OKABE_ITO["vermillion"], dash="dash", width=2),
                  annotation_text=f"i.i.d. prediction {expected_tokens_per_cycle(alpha, k):.2f}",
                  annotation_position="top right")
    fig.update_xaxes(title="tokens committed in a cycle (accepted drafts + 1)", dtick=1)
    fig.update_yaxes(title="cycles")
    return layout(fig, "Acceptance length, cycle by cycle", 320, top=70)


LAYOUTS = ("contiguous tensor (HF DynamicCache.crop)", "static buffer (gpt-fast, HF StaticCache)",
           "paged blocks (vLLM, SGLang)")


def cache_layouts_figure(before: int, appended: int, after: int, block_size: int = 4,
                         spare: int = 3) -> go.Figure:
    """The same rollback (appended -> after) in three cache layouts.

    Contiguous: the tail is sliced off and the tensor shrinks. Static: the buffer keeps
    its size and its data; only the length pointer moves back, the cells past it are
    masked and overwritten later. Paged: slots sit in fixed-size blocks; a block whose
    slots are all past the new length can go back to the pool."""
    first = max(0, before - 4)
    fig = go.Figure()
    kept = list(range(first, after))
    dropped = list(range(after, appended))
    rows = {LAYOUTS[0]: (kept, dropped, []), LAYOUTS[1]: (kept, dropped, list(range(appended, appended + spare))),
            LAYOUTS[2]: (kept, dropped, list(range(appended, _round_up(appended, block_size))))}
    words = {LAYOUTS[0]: "sliced off (memory released)", LAYOUTS[1]: "stale, masked; overwritten next cycle",
             LAYOUTS[2]: "slot rolled back (num_computed_tokens moves back)"}
    for i, (row, (keep, drop, free)) in enumerate(rows.items()):
        _layout_cells(fig, row, keep, "kept", OKABE_ITO["bluish_green"], "", i == 0)
        _layout_cells(fig, row, drop, words[row], OKABE_ITO["vermillion"], "x", True)
        _layout_cells(fig, row, free, "empty capacity", OKABE_ITO["grey"], ".", i == 1)
    _block_frames(fig, first, appended, after, block_size)
    fig.add_annotation(x=after - 0.5, y=LAYOUTS[1], text="length pointer", showarrow=True, ay=-28, ax=0)
    fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(LAYOUTS)), fixedrange=True)
    fig.update_xaxes(title="cache position", range=[first - 0.6, max(appended + spare, _round_up(appended, block_size)) + 0.1],
                     fixedrange=True)
    return layout(fig, f"Rolling back {appended} → {after} cached positions in three layouts", 330, top=96,
                  barmode="overlay", showlegend=True)


def _round_up(n: int, block: int) -> int:
    return -(-n // block) * block


def _layout_cells(fig: go.Figure, row: str, cells: list[int], name: str, colour: str, pattern: str,
                  legend: bool) -> None:
    if not cells:
        return
    fig.add_bar(x=[0.86] * len(cells), base=[p - 0.43 for p in cells], y=[row] * len(cells), orientation="h",
                width=0.6, name=name, showlegend=legend,
                marker=dict(color=rgba(colour, 0.3), line=dict(color=colour, width=1.5),
                            pattern=dict(shape=pattern, fgcolor=colour, fgopacity=0.5, size=6)),
                customdata=cells, hovertemplate=f"{row}<br>position %{{customdata}}: {html.escape(name)}<extra></extra>")


def _block_frames(fig: go.Figure, first: int, appended: int, after: int, block: int) -> None:
    """Outline each block of the paged row; a block with no kept slot is marked reusable."""
    start = (first // block) * block
    for b in range(start, _round_up(appended, block), block):
        free = b >= after
        fig.add_shape(type="rect", x0=b - 0.5, x1=b + block - 0.5, y0=-0.42, y1=0.42, yref="y", xref="x",
                      line=dict(color=OKABE_ITO["vermillion"] if free else OKABE_ITO["blue"], width=2,
                                dash="dash" if free else "solid"))
        label = "block free" if free else f"block {b // block}"
        fig.add_annotation(x=b + block / 2 - 0.5, y=-0.5, yref="y", text=label, showarrow=False,
                           font=dict(size=10), yanchor="top")
