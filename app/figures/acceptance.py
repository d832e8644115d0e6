"""The test, position by position, and what comes after it: the stepper's charts of stages 2 to 4.

- acceptance_figure: p_target against p_draft per drafted position, then the test's marks
  (min(1, ratio) and the draw u, or the target's argmax for a greedy cycle);
- position_rows: the same test as a table, one row per position, in the columns a page names
  (the stepper's and the walkthrough's columns differ, so each page keeps what it shows);
- resample_figure: the residual at a rejection, or the target's distribution the bonus came from.

Plain functions, no Streamlit: a cycle record in, a figure or table rows out.
"""
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import plotly.graph_objects as go

from app.figures.derive import (
    DISCARDED,
    REJECTED,
    RESAMPLED,
    cycle_drafter,
    position_outcomes,
    prob_text,
    visible_text,
)
from app.figures.style import (
    ACCEPT_COLOUR,
    GRID,
    NOT_DRAWN,
    OKABE_ITO,
    P_DRAFT_COLOUR,
    P_TARGET_COLOUR,
    RESIDUAL_COLOUR,
    STAGE_CHART_PX,
    STYLES,
    U_COLOUR,
    figure,
    probability_axis,
    shown,
    solid_pattern,
)
from engine.trace.schema import EAGLE

# ---------------------------------------------------------------- the test, per position

WIDE_MARK_MAX_K = 4  # up to this K, the min(1, ratio) mark spans both bars of its position


def wide_marks(k: int) -> bool:
    """Is a position's slot in a half-width figure wide enough for a 46 px min(1, ratio) mark?"""
    return k <= WIDE_MARK_MAX_K


def position_ticks(c: dict, k: int, stage: int) -> list[str]:
    outcomes = position_outcomes(c, k)
    ticks = []
    for i in range(k):
        if k > 4:  # many positions: the number and the mark; the hover has the token and the rest
            ticks.append(f"{i + 1}" + (f"<br>{STYLES[outcomes[i]].mark}" if stage >= 3 else ""))
            continue
        tick = f"{i + 1}: {shown(c['draft_token_texts'][i], 8)}"
        if stage >= 3:
            tick += f"<br>{STYLES[outcomes[i]].mark} {outcomes[i].split(' ')[0]}"
        ticks.append(tick)
    return ticks


def target_argmax(c: dict, i: int) -> dict | None:
    """The target's most likely token at draft position i+1 (from the trace's top list)."""
    top = c["target_top"][i] if i < len(c["target_top"]) else []
    return top[0] if top else None


def acceptance_figure(c: dict, k: int, stage: int = 3, greedy: bool = False) -> go.Figure:
    """Grouped bars p_target vs p_draft per drafted position; from stage 3 also
    min(1, p_target/p_draft) (a bar-wide line) and the draw u (a diamond) where tested.
    Greedy (temperature 0): no u at all; the test is whether the draft token is the target's
    argmax, so the target's top probability is marked instead."""
    ticks = position_ticks(c, k, stage)
    fade = [0.35 if o == DISCARDED and stage >= 3 else 1.0 for o in position_outcomes(c, k)]
    # No values printed on the bars: two neighbours' values ran into each other ("1.0001.000") and into
    # the test's marks. The cycle figure above and the stage-3 table print them; the hover has them too.
    tokens = np.asarray([shown(t) for t in c["draft_token_texts"]])
    traces = [
        dict(type="bar", x=ticks, y=c["p_target"], name="p_target (target model)", customdata=tokens,
             marker=dict(color=P_TARGET_COLOUR, opacity=fade),
             hovertemplate="<b>%{customdata}</b>: p_target %{y:.4f}<extra></extra>"),
        dict(type="bar", x=ticks, y=c["p_draft"], customdata=tokens,
             name="p_draft (EAGLE head)" if cycle_drafter(c) == EAGLE else "p_draft (draft model)",
             marker=dict(color=P_DRAFT_COLOUR, opacity=fade, pattern=solid_pattern("/")),
             hovertemplate="<b>%{customdata}</b>: p_draft %{y:.4f}<extra></extra>"),
    ]
    if stage >= 3:
        traces += _argmax_marks(c, k, ticks) if greedy else _acceptance_marks(c, ticks, wide_marks(k))
    if stage < 3:  # the test itself is drawn from stage 3 on
        title = "Verify: both models' probability of each draft token"
    else:
        title = ("Greedy test: keep while draft = target's argmax" if greedy else
                 "Test: keep while u < min(1, p_target / p_draft)")
    return figure(traces, title, STAGE_CHART_PX, top=96, barmode="group", bargap=0.3, yaxis=probability_axis(),
                  xaxis=dict(type="category"))


def _acceptance_marks(c: dict, ticks: list[str], wide: bool) -> list[dict]:
    tested = ticks[: len(c["u"])]  # u is drawn only up to the first rejection; the rest: "not drawn"
    return [
        dict(type="scatter", x=ticks, y=c["accept_prob"], mode="markers", name="min(1, p_target/p_draft)",
             marker=dict(symbol="line-ew-open", size=46 if wide else 16, color=ACCEPT_COLOUR,
                         line=dict(width=4, color=ACCEPT_COLOUR)),
             hovertemplate="acceptance probability %{y:.4f}<extra></extra>"),
        dict(type="scatter", x=tested, y=c["u"], mode="markers", name="u (uniform draw)",
             marker=dict(symbol="diamond", size=12, color=U_COLOUR, line=dict(width=1, color=GRID)),
             hovertemplate="u %{y:.4f}<extra></extra>"),  # values in the hover and the table, never on the bars
    ]


def _argmax_marks(c: dict, k: int, ticks: list[str]) -> list[dict]:
    tops = [target_argmax(c, i) for i in range(k)]
    tested = min(k, c["num_accepted"] + 1)
    return [dict(type="scatter", x=ticks[:tested], y=[t["p"] if t else None for t in tops[:tested]], mode="markers",
                 name="target's most likely token (argmax)",
                 customdata=np.asarray([shown(t["text"]) if t else "?" for t in tops[:tested]]),
                 marker=dict(symbol="line-ew-open", size=16, color=ACCEPT_COLOUR, line=dict(width=4, color=ACCEPT_COLOUR)),
                 hovertemplate="target's argmax <b>%{customdata}</b> (p %{y:.4f})<extra></extra>")]


# ---------------------------------------------------------------- the test as a table

@dataclass(frozen=True)
class PositionColumn:
    """One column of the per-position test table: its header and how a cell is read off the record."""

    header: str
    cell: Callable[[dict, int], object]  # (cycle record, draft position 0..K-1) -> the cell's value


def position_outcome(c: dict, i: int) -> str:
    """ACCEPTED, REJECTED or DISCARDED: what the test did with draft position i+1."""
    return position_outcomes(c, i + 1)[i]


def u_text(c: dict, i: int) -> str:
    """The draw u at position i+1, or NOT_DRAWN after the first rejection (never None)."""
    return prob_text(c["u"][i]) if i < len(c["u"]) else NOT_DRAWN


def argmax_text(c: dict, i: int) -> str:
    """The target's argmax at a tested position of a greedy cycle; NOT_DRAWN where nothing was tested."""
    top = target_argmax(c, i)
    return visible_text(top["text"]) if top and i <= c["num_accepted"] else NOT_DRAWN


def result_words(c: dict, i: int) -> str:
    """The outcome in words, read off the draws: a position without a u was never tested."""
    if i >= len(c["u"]):
        return "discarded (not tested)"
    return "accepted" if i < c["num_accepted"] else "rejected"


POS = PositionColumn("pos", lambda c, i: i + 1)
POSITION = PositionColumn("position", lambda c, i: i + 1)
DRAFT_TOKEN = PositionColumn("draft token", lambda c, i: visible_text(c["draft_token_texts"][i]))
# The stepper's numbers are text, printed as its captions print them (derive.prob_text; an undrawn u reads
# NOT_DRAWN in a column of text); the walkthrough's
# are numbers rounded to 4 places, as st.table shows them.
P_TARGET_TEXT = PositionColumn("p_target", lambda c, i: prob_text(c["p_target"][i]))
P_DRAFT_TEXT = PositionColumn("p_draft", lambda c, i: prob_text(c["p_draft"][i]))
RATIO_TEXT = PositionColumn("min(1, ratio)", lambda c, i: prob_text(c["accept_prob"][i]))
P_TARGET_ROUNDED = PositionColumn("p_target", lambda c, i: round(c["p_target"][i], 4))
P_DRAFT_ROUNDED = PositionColumn("p_draft", lambda c, i: round(c["p_draft"][i], 4))
RATIO_ROUNDED = PositionColumn("min(1, p_target/p_draft)", lambda c, i: round(c["accept_prob"][i], 4))
U = PositionColumn("u", u_text)
TARGET_ARGMAX = PositionColumn("target's argmax", argmax_text)
RESULT_MARK = PositionColumn("result", lambda c, i: f"{STYLES[position_outcome(c, i)].mark} "
                                                    f"{position_outcome(c, i).split(' ')[0]}")
RESULT_WORDS = PositionColumn("result", result_words)

# The columns each page shows: the stepper's stage-3 table (sampled or greedy) and the walkthrough's.
STEPPER_COLUMNS = (POS, DRAFT_TOKEN, P_TARGET_TEXT, P_DRAFT_TEXT, RATIO_TEXT, U, RESULT_MARK)
STEPPER_GREEDY_COLUMNS = (POS, DRAFT_TOKEN, P_TARGET_TEXT, P_DRAFT_TEXT, TARGET_ARGMAX, RESULT_MARK)
WALKTHROUGH_COLUMNS = (POSITION, DRAFT_TOKEN, P_TARGET_ROUNDED, P_DRAFT_ROUNDED, RATIO_ROUNDED, U, RESULT_WORDS)
# Pixel widths of the stepper's stage-3 test table (app/views/stepper.py): each header and value, NOT_DRAWN
# included, fits in Source Sans 14 px with the table's 8 px padding either side; about 500 px in all, the
# width of the stepper's right column at 1366x768 (tests/test_browser_projector.py measures them).
TEST_TABLE_WIDTHS = {"pos": 38, "draft token": 86, "p_target": 68, "p_draft": 60, "min(1, ratio)": 92,
                     "u": 78, "target's argmax": 110, "result": 86}


def position_rows(c: dict, k: int, columns: Sequence[PositionColumn]) -> list[dict]:
    """The test, one row per draft position 1..K, a cell per column in `columns`: each page names the
    columns it shows (STEPPER_COLUMNS, STEPPER_GREEDY_COLUMNS, WALKTHROUGH_COLUMNS)."""
    return [{column.header: column.cell(c, i) for column in columns} for i in range(k)]


# ---------------------------------------------------------------- resample or bonus

def unique_labels(texts: list[str], ids: list[int]) -> list[str]:
    """Category labels; two tokens that decode alike get their ids added."""
    names = [shown(t, 12) for t in texts]
    return [f"{n} #{i}" if names.count(n) > 1 else n for n, i in zip(names, ids)]


RESIDUAL_BARS = 5  # tokens shown at a rejection: the rejected draft, the resampled one, the residual's largest


def residual_bars(c: dict) -> list[dict]:
    """What the residual chart shows: the rejected draft token and the resampled token, always,
    then the residual's largest entries; never a token with nothing to draw (all three ~0)."""
    j = c["rejected_position"]
    rejected_id = c["draft_token_ids"][j - 1]
    entries = {e["token_id"]: dict(e) for e in c["residual_top"]}
    rejected = entries.pop(rejected_id, None) or {
        "token_id": rejected_id, "text": c["draft_token_texts"][j - 1], "p_target": c["p_target"][j - 1],
        "p_draft": c["p_draft"][j - 1], "residual": 0.0}  # the draft over-proposed it: no residual mass
    sampled = entries.pop(c["resampled_token_id"], None)  # never the rejected token: its residual is 0
    shown_ = [dict(rejected, role="rejected")] + ([dict(sampled, role="resampled")] if sampled else [])
    rest = sorted(entries.values(), key=lambda e: -e["residual"])
    shown_ += [dict(e, role="") for e in rest if max(e["residual"], e["p_target"], e["p_draft"]) >= 0.005]
    return shown_[:RESIDUAL_BARS]


def resample_figure(c: dict, k: int) -> go.Figure:
    """At a rejection: p_target, p_draft and the residual of the rejected draft token, the resampled
    token and the residual's other large entries; at a full accept: the target's distribution at K+1
    that the bonus token was drawn from."""
    if c["rejected_position"] is None:
        return _bonus_figure(c, k)
    entries = residual_bars(c)
    chosen = c["resampled_token_id"]
    marks = {"rejected": f"{STYLES[REJECTED].mark} rejected", "resampled": f"{STYLES[RESAMPLED].mark} resampled"}
    names = [f"{shown(e['text'], 8)}<br>{marks[e['role']]}" if e["role"] else shown(e["text"], 8) for e in entries]
    names = [f"{n} #{e['token_id']}" if names.count(n) > 1 else n for n, e in zip(names, entries)]
    edge = [3 if e["token_id"] == chosen else 0 for e in entries]
    full = np.asarray([shown(e["text"]) for e in entries])
    traces = [dict(type="bar", x=names, y=[e[field] for e in entries], name=name, customdata=full,
                   marker=dict(color=colour, pattern=solid_pattern(pattern),
                               line=dict(width=edge, color=OKABE_ITO["vermillion"])),
                   hovertemplate=f"<b>%{{customdata}}</b>: {name} %{{y:.4f}}<extra></extra>")
              for field, name, colour, pattern in (
                  ("p_target", "p_target", P_TARGET_COLOUR, ""), ("p_draft", "p_draft", P_DRAFT_COLOUR, "/"),
                  ("residual", "norm(max(0, p_target − p_draft))", RESIDUAL_COLOUR, "x"))]
    return figure(traces, f"Resample at position {c['rejected_position']} from the residual",
                  STAGE_CHART_PX, top=96, barmode="group", bargap=0.25, yaxis=probability_axis(), xaxis=dict(type="category"))


def _bonus_figure(c: dict, k: int) -> go.Figure:
    entries, chosen = c["target_top"][k], c["bonus_token_id"]
    ids = [e["token_id"] for e in entries]
    names = unique_labels([e["text"] for e in entries], ids)
    traces = [dict(type="bar", x=names, y=[e["p"] for e in entries], name=f"p_target at position K+1={k + 1}",
                   marker=dict(color=P_TARGET_COLOUR, line=dict(width=[3 if i == chosen else 0 for i in ids],
                                                               color=OKABE_ITO["vermillion"])),
                   hovertemplate="p_target %{y:.4f}<extra>%{x}</extra>")]
    marks = [_sampled_mark(names[ids.index(chosen)], "★ bonus")] if chosen in ids else []
    return figure(traces, f"Bonus: drawn from the target at position K+1={k + 1}", STAGE_CHART_PX, top=96, bargap=0.25,
                  yaxis=probability_axis(), xaxis=dict(type="category"), annotations=marks)


def _sampled_mark(label: str, word: str) -> dict:
    return dict(x=label, y=1.04, text=f"<b>{word}</b>", showarrow=False, font=dict(color=OKABE_ITO["vermillion"]))
