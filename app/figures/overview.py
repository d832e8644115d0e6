"""A trace at a glance: every cycle's outcome per position (the stepper's grid, where a click jumps
to a cycle), and where one cycle's wall time went.

Plain functions, no Streamlit: records in, a figure out.
"""
from typing import Sequence

import numpy as np
import plotly.graph_objects as go

from app.figures.derive import ACCEPTED, BONUS, DISCARDED, REJECTED, Overview
from app.figures.style import OKABE_ITO, STYLES, figure, legend_name, solid_pattern

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
