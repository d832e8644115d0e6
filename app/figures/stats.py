"""Plotly figures of the statistics page: engine analysis in, figure out, no Streamlit.

Numbers come from engine/stats/analysis.py and engine/stats/sweep.py; these functions only draw
them. Same conventions as app/figures/style.py: Okabe-Ito colours, and every series also
differs by marker symbol, dash or pattern, so colour is never the only cue.
"""
from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.figures.style import OKABE_ITO, esc
from engine.stats.analysis import Calibration, CycleTimes, KAdvice, SpeedReport, TraceStats, best_k, predicted_per_position
from engine.stats.sweep import SweepResult
from engine.trace.metrics import predicted_speedup

MEASURED, LEVIATHAN, REFINED, PLAIN = "measured", "Leviathan", "refined", "plain decoding"
COLOURS = {MEASURED: OKABE_ITO["blue"], LEVIATHAN: OKABE_ITO["orange"], REFINED: OKABE_ITO["bluish_green"],
           PLAIN: OKABE_ITO["grey"]}
SYMBOLS = {MEASURED: "circle", LEVIATHAN: "diamond-open", REFINED: "square-open"}
DASHES = {LEVIATHAN: "dash", REFINED: "solid"}
COMPARE_COLOURS = (OKABE_ITO["blue"], OKABE_ITO["vermillion"])
COMPARE_PATTERNS = ("", "/")


def _layout(fig: go.Figure, title: str, height: int, top: int = 72, legend_y: float = 1.02,
            **extra) -> go.Figure:
    """Title top left, legend on its own line under it; no colours set, so the app theme applies.

    Figures with subplot titles raise the legend (legend_y) above those titles.
    """
    fig.update_layout(title=dict(text=title, x=0, xanchor="left", xref="paper", y=1, yref="container",
                                 yanchor="top", pad=dict(t=6), font=dict(size=14)),
                      height=height, margin=dict(l=10, r=10, t=top, b=10),
                      legend=dict(orientation="h", yanchor="bottom", y=legend_y, x=0, xanchor="left"), **extra)
    return fig


def _hatch(shape: str | list[str]) -> dict:
    """Light hatching drawn over the bar's own colour (overlay keeps the colour visible)."""
    return dict(shape=shape, fillmode="overlay", fgcolor="rgba(255,255,255,0.75)", size=6, solidity=0.3)


def _ms(seconds: float) -> float:
    return seconds * 1000


def _break_even(fig: go.Figure, text: str = "1x = plain decoding", **where) -> None:
    """The 1x line, named in the legend: a name beside it lands on whichever bar or curve passes there."""
    fig.add_hline(y=1.0, line=dict(color=COLOURS[PLAIN], dash="dot"), name=text, showlegend=True, **where)


# ---------------------------------------------------------------- acceptance

def per_position_figure(st: TraceStats) -> go.Figure:
    """Measured per-position acceptance (bars) against alpha^i, with mean beta per position."""
    positions = list(range(1, st.k + 1))
    fig = go.Figure()
    fig.add_bar(x=positions, y=st.acceptance["per_position_acceptance"], name="measured (vLLM per-position rate)",
                marker=dict(color=COLOURS[MEASURED]), hovertemplate="position %{x}: %{y:.3f}<extra></extra>")
    fig.add_scatter(x=positions, y=predicted_per_position(st.alpha, st.k), mode="lines+markers",
                    name=f"predicted alpha^i (alpha = {st.alpha:.3f})",
                    line=dict(color=COLOURS[LEVIATHAN], dash="dash"), marker=dict(symbol="diamond", size=9),
                    hovertemplate="position %{x}: alpha^i = %{y:.3f}<extra></extra>")
    fig.add_scatter(x=positions, y=st.beta_by_position, mode="markers", name="mean beta at this position",
                    marker=dict(symbol="x", size=10, color=OKABE_ITO["reddish_purple"]),
                    hovertemplate="position %{x}: mean beta %{y:.3f}<extra></extra>")
    fig.update_xaxes(title="draft position i", dtick=1)
    fig.update_yaxes(title="fraction of cycles", range=[0, 1.05])
    return _layout(fig, "Per-position acceptance: a survival curve", 340, top=90)


def tokens_per_cycle_figure(st: TraceStats) -> go.Figure:
    """Histogram of tokens committed per cycle beside the truncated geometric the measured alpha predicts."""
    n = list(range(1, st.k + 2))
    total = max(1, sum(st.tokens_per_cycle))  # the drafts: a cycle that drafted nothing is not in it
    fig = go.Figure()
    fig.add_bar(x=n, y=[c / total for c in st.tokens_per_cycle], name="measured",
                marker=dict(color=COLOURS[MEASURED]), customdata=st.tokens_per_cycle,
                hovertemplate="%{x} tokens: %{y:.3f} (%{customdata} drafts)<extra></extra>")
    fig.add_bar(x=n, y=st.pmf, name=f"truncated geometric at alpha = {st.alpha:.3f}",
                marker=dict(color=COLOURS[LEVIATHAN], pattern=_hatch("/")),
                hovertemplate="%{x} tokens: predicted %{y:.3f}<extra></extra>")
    fig.update_xaxes(title="tokens committed in one cycle (accepted + 1)", dtick=1)
    fig.update_yaxes(title="fraction of drafts (cycles that drafted)")
    return _layout(fig, "Tokens per cycle: measured and predicted", 340, top=90, barmode="group")


# ---------------------------------------------------------------- cost

def verify_cost_figure(cal: Calibration, k: int, trace_verify_s: float | None = None) -> go.Figure:
    """Verify time against positions, with the one-step cost Leviathan's formula assumes."""
    fig = go.Figure()
    fig.add_scatter(x=cal.verify_positions, y=[_ms(t) for t in cal.verify_s], mode="lines+markers",
                    name="calibrated verify time", line=dict(color=COLOURS[MEASURED]), marker=dict(size=9),
                    hovertemplate="%{x} positions: %{y:.2f} ms<extra></extra>")
    if trace_verify_s is not None:
        fig.add_scatter(x=[k + 1], y=[_ms(trace_verify_s)], mode="markers", name=f"this trace's median at K+1 = {k + 1}",
                        marker=dict(symbol="star", size=15, color=OKABE_ITO["vermillion"]),
                        hovertemplate="%{x} positions: %{y:.2f} ms (trace median)<extra></extra>")
    # named in the legend: written beside the line it sat on the verify curve, which starts near one step
    fig.add_hline(y=_ms(cal.target_step_s), line=dict(color=COLOURS[LEVIATHAN], dash="dash"), showlegend=True,
                  name="one target step (what Leviathan's formula assumes for any width)")
    fig.update_xaxes(title="positions in one target forward", dtick=1)
    fig.update_yaxes(title="ms", rangemode="tozero")
    return _layout(fig, f"What verification costs (cache length {cal.cache_len})", 340, top=90)


def cycle_profile_figure(t: CycleTimes) -> go.Figure:
    """Where the median cycle's time goes: one labelled bar per part (the catch-up, which only
    fully accepted cycles pay, averaged over all cycles)."""
    parts = {"draft steps (K)": t.draft_s, "verify (K+1 positions)": t.verify_s, "draft catch-up (mean)": t.catch_up_s,
             "other: test, resample, rollback, Python": t.other_s}
    share = [v / t.cycle_s if t.cycle_s > 0 else 0.0 for v in parts.values()]
    fig = go.Figure(go.Bar(y=list(parts), x=[_ms(v) for v in parts.values()], orientation="h",
                           text=[f"{_ms(v):.2f} ms ({p:.0%})" for v, p in zip(parts.values(), share)],
                           textposition="auto", marker=dict(color=COLOURS[MEASURED]), showlegend=False,
                           hovertemplate="%{y}: %{x:.2f} ms<extra></extra>"))
    fig.update_xaxes(title="ms per cycle (median)", rangemode="tozero")
    fig.update_yaxes(autorange="reversed")
    return _layout(fig, f"Where a cycle's {_ms(t.cycle_s):.1f} ms go", 300)


def speed_figure(r: SpeedReport) -> go.Figure:
    """Measured speedup beside both predictions (the measured one's spread, the middle half of
    cycles, is in its hover: an error bar would sit on the value printed above the bar)."""
    names = [MEASURED, LEVIATHAN, REFINED]
    values = [r.measured, r.leviathan, r.refined]
    spread = r.measured_spread
    hover = [f"middle half of cycles {spread.low:.2f}x-{spread.high:.2f}x", "prediction", "prediction"]
    fig = go.Figure(go.Bar(x=[f"{n}" for n in names], y=values, text=[f"{v:.2f}x" for v in values],
                           textposition="outside", cliponaxis=False, customdata=hover,
                           marker=dict(color=[COLOURS[n] for n in names], pattern=_hatch(["", "/", "."])),
                           hovertemplate="%{x}: %{y:.3f}x (%{customdata})<extra></extra>", showlegend=False))
    _break_even(fig)
    fig.update_yaxes(title="speedup over plain target decoding", range=[0, max(values + [1.0]) * 1.18])
    return _layout(fig, f"Speedup at K = {r.k}: measured and predicted", 320)


# ---------------------------------------------------------------- K advisor and sweep

def advisor_figure(advice: Sequence[KAdvice], trace_k: int) -> go.Figure:
    """Predicted speedup against K (both formulas); the best K by the refined one starred."""
    ks = [a.k for a in advice]
    best = best_k(advice)
    fig = go.Figure()
    for name, values in ((LEVIATHAN, [a.leviathan for a in advice]), (REFINED, [a.refined for a in advice])):
        fig.add_scatter(x=ks, y=values, mode="lines+markers", name=f"{name} prediction",
                        line=dict(color=COLOURS[name], dash=DASHES[name]),
                        marker=dict(symbol=SYMBOLS[name], size=9),
                        customdata=["fitted verify time" if a.extrapolated else "measured verify time" for a in advice],
                        hovertemplate=f"K=%{{x}}: %{{y:.3f}}x ({name}, %{{customdata}})<extra></extra>")
    # Every name is in the legend or under the axis: a label by the star sat between the two curves,
    # and one on the K line or the 1x line lands on whichever curve passes there.
    fig.add_scatter(x=[best.k], y=[best.refined], mode="markers", name=f"best K = {best.k}",
                    marker=dict(symbol="star", size=18, color=OKABE_ITO["vermillion"]),
                    hovertemplate="best K=%{x}: %{y:.3f}x<extra></extra>")
    fig.add_vline(x=trace_k, line=dict(color=COLOURS[PLAIN], dash="dot"))
    _break_even(fig)
    fig.update_xaxes(title="K (draft tokens per cycle)", tickvals=ks,
                     ticktext=[f"{k}<br>this trace" if k == trace_k else f"{k}" for k in ks])
    fig.update_yaxes(title="predicted speedup", rangemode="tozero")
    return _layout(fig, "K advisor: predicted speedup against K", 360, top=90)


def verify_steps_figure(cal: Calibration, advice: Sequence[KAdvice]) -> go.Figure:
    """Verify cost per width in target steps: the measured curve the K advisor picks K from."""
    steps = [t / cal.target_step_s for t in cal.verify_s]
    best = best_k(advice).k + 1 if advice else None
    fig = go.Figure(go.Bar(x=cal.verify_positions, y=steps, text=[f"{v:.2f}" for v in steps], textposition="outside",
                           marker=dict(color=[OKABE_ITO["vermillion"] if n == best else COLOURS[MEASURED]
                                              for n in cal.verify_positions],
                                       pattern=_hatch(["x" if n == best else "" for n in cal.verify_positions])),
                           name="measured verify cost", showlegend=False,
                           hovertemplate="%{x} positions: %{y:.2f} target steps<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(color=COLOURS[LEVIATHAN], dash="dash"), showlegend=True,
                  name="1 step: what Leviathan's formula assumes")  # in the legend: over the bars it would hide them
    title = "Verify cost per width, in target steps"
    if best is not None:
        title += f" (crossed bar: K+1 = {best}, the advisor's pick)"
    fig.update_xaxes(title="positions verified in one target forward (K+1)", dtick=1)
    fig.update_yaxes(title="t_verify(n) / t_step", rangemode="tozero")
    return _layout(fig, title, 320, top=90)


def sweep_figure(result: SweepResult) -> go.Figure:
    """Measured tokens/s and acceptance length per K against both predictions."""
    ks = [p.k for p in result.points]
    predicted = result.predicted_tokens_per_s()
    fig = make_subplots(rows=1, cols=2, subplot_titles=("tokens/s (decoding only)", "mean acceptance length"))
    fig.add_scatter(x=ks, y=[p.tokens_per_s for p in result.points], mode="markers", name=MEASURED,
                    marker=dict(color=COLOURS[MEASURED], size=11, symbol=SYMBOLS[MEASURED]),
                    hovertemplate="K=%{x}: %{y:.1f} tokens/s<extra></extra>", row=1, col=1)
    for name in (LEVIATHAN, REFINED):
        fig.add_scatter(x=ks, y=predicted[name.lower()], mode="lines+markers", name=f"{name} prediction",
                        line=dict(color=COLOURS[name], dash=DASHES[name]), marker=dict(symbol=SYMBOLS[name]),
                        hovertemplate=f"K=%{{x}}: %{{y:.1f}} tokens/s ({name})<extra></extra>", row=1, col=1)
    fig.add_hline(y=result.plain_tokens_per_s, line=dict(color=COLOURS[PLAIN], dash="dot"), row=1, col=1,
                  annotation_text=f"plain decoding {result.plain_tokens_per_s:.1f}/s", annotation_position="bottom right")
    fig.add_scatter(x=ks, y=[p.mean_acceptance_length for p in result.points], mode="markers",
                    name="measured acceptance length", showlegend=False,
                    marker=dict(color=COLOURS[MEASURED], size=11, symbol=SYMBOLS[MEASURED]),
                    hovertemplate="K=%{x}: %{y:.2f} tokens per cycle<extra></extra>", row=1, col=2)
    fig.add_scatter(x=ks, y=predicted["mean_acceptance_length"], mode="lines+markers",
                    name=f"E[tokens per cycle] at alpha = {result.alpha:.3f}",
                    line=dict(color=OKABE_ITO["reddish_purple"], dash="dot"), marker=dict(symbol="x"),
                    hovertemplate="K=%{x}: predicted %{y:.2f}<extra></extra>", row=1, col=2)
    fig.update_xaxes(title="K", dtick=1)
    return _layout(fig, "K sweep: the same prompt at several K", 420, top=130, legend_y=1.1)


# ---------------------------------------------------------------- two traces

def compare_acceptance_figure(labels: Sequence[str], stats: Sequence[TraceStats]) -> go.Figure:
    """Per-position acceptance and tokens-per-cycle fractions of two traces, side by side."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("per-position acceptance", "tokens committed per cycle"))
    for label, st, colour, pattern in zip(labels, stats, COMPARE_COLOURS, COMPARE_PATTERNS):
        marker = dict(color=colour, pattern=_hatch(pattern))
        fig.add_bar(x=list(range(1, st.k + 1)), y=st.acceptance["per_position_acceptance"], name=esc(label),
                    marker=marker, legendgroup=label, hovertemplate="position %{x}: %{y:.3f}<extra></extra>",
                    row=1, col=1)
        total = max(1, sum(st.tokens_per_cycle))  # the drafts, as the mean acceptance length counts them
        fig.add_bar(x=list(range(1, st.k + 2)), y=[c / total for c in st.tokens_per_cycle], name=esc(label),
                    marker=marker, legendgroup=label, showlegend=False,
                    hovertemplate="%{x} tokens: %{y:.3f}<extra></extra>", row=1, col=2)
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(title="fraction of drafts (cycles that drafted)", row=1, col=1)
    return _layout(fig, "Acceptance of the two traces", 380, top=110, legend_y=1.1, barmode="group")


# ---------------------------------------------------------------- race and explorer

def race_series(cycles: Sequence[dict], target_step_s: float) -> tuple[list[float], list[int], list[float], list[int]]:
    """Tokens done over wall time: speculative from the recorded cycles (decoding only, prefill left
    out on both sides), plain at one token per calibrated target step."""
    spec_t, spec_n, t, n = [0.0], [0], 0.0, 0
    for c in cycles:
        t += c["cycle_time_s"]
        n += len(c["committed_token_ids"])
        spec_t.append(t)
        spec_n.append(n)
    plain_n = list(range(0, n + 1))
    return spec_t, spec_n, [i * target_step_s for i in plain_n], plain_n


def race_figure(cycles: Sequence[dict], target_step_s: float) -> go.Figure:
    """Plain vs speculative decoding of the same number of tokens on one wall-clock axis."""
    spec_t, spec_n, plain_t, plain_n = race_series(cycles, target_step_s)
    fig = go.Figure()
    # each finishing time in its curve's legend entry: written by its line, the later one sat on the curves,
    # which end at the top right where both lines are
    fig.add_scatter(x=plain_t, y=plain_n, mode="lines", name=f"{PLAIN} (one target step per token): done at "
                    f"{plain_t[-1]:.2f} s", line=dict(color=COLOURS[PLAIN], dash="dot", width=3),
                    hovertemplate="plain: %{y} tokens after %{x:.3f} s<extra></extra>")
    fig.add_scatter(x=spec_t, y=spec_n, mode="lines+markers", name=f"speculative (this trace's cycles): done at "
                    f"{spec_t[-1]:.2f} s", line=dict(color=COLOURS[MEASURED], shape="hv", width=3), marker=dict(size=5),
                    hovertemplate="speculative: %{y} tokens after %{x:.3f} s<extra></extra>")
    for t, colour in ((spec_t[-1], COLOURS[MEASURED]), (plain_t[-1], COLOURS[PLAIN])):
        fig.add_vline(x=t, line=dict(color=colour, dash="dash", width=1))
    fig.update_xaxes(title="wall-clock seconds of decoding", rangemode="tozero")
    fig.update_yaxes(title="tokens generated", rangemode="tozero")
    return _layout(fig, f"The race: {spec_n[-1]} tokens, plain vs speculative", 360, top=90)


def explorer_figure(alpha: float, c: float, k: int, k_max: int, trace_point: tuple[int, float] | None,
                    trace_alpha: float, trace_c: float) -> go.Figure:
    """Predicted speedup against K at the chosen alpha and c (Leviathan et al.), the chosen K marked,
    and this trace's own measured speedup at its K beside its own prediction."""
    ks = list(range(1, k_max + 1))
    fig = go.Figure()
    fig.add_scatter(x=ks, y=[predicted_speedup(alpha, kk, c) for kk in ks], mode="lines+markers",
                    name=f"prediction at α={alpha:.2f}, c={c:.2f}", line=dict(color=COLOURS[LEVIATHAN], width=3),
                    hovertemplate="K %{x}: %{y:.2f}×<extra></extra>")
    fig.add_scatter(x=ks, y=[predicted_speedup(trace_alpha, kk, trace_c) for kk in ks], mode="lines",
                    name=f"prediction at this trace's α={trace_alpha:.2f}, c={trace_c:.2f}",
                    line=dict(color=COLOURS[REFINED], dash="dash", width=2), hovertemplate="K %{x}: %{y:.2f}×<extra></extra>")
    fig.add_scatter(x=[k], y=[predicted_speedup(alpha, k, c)], mode="markers", name=f"chosen K={k}",
                    marker=dict(symbol="diamond", size=14, color=COLOURS[LEVIATHAN], line=dict(width=2, color="white")),
                    hovertemplate="K %{x}: %{y:.2f}×<extra>chosen</extra>")
    if trace_point is not None:
        fig.add_scatter(x=[trace_point[0]], y=[trace_point[1]], mode="markers", name="this trace, measured",
                        marker=dict(symbol="star", size=18, color=COLOURS[MEASURED]),
                        hovertemplate="measured at K %{x}: %{y:.2f}×<extra></extra>")
    _break_even(fig)
    fig.update_xaxes(title="K (draft tokens per cycle)", dtick=1)
    fig.update_yaxes(title="speedup over plain decoding (×)", rangemode="tozero")
    return _layout(fig, "Explore: predicted speedup (1−α^(K+1)) / ((1−α)(Kc+1))", 380, top=100)
