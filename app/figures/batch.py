"""A batched cycle as lanes: one lane per row, its draft positions accepted, rejected or never tested,
then the token the target added (resampled or bonus); an idle row is a grey lane that still takes its
slot in every forward. Input: a checked batch trace (engine/trace/batch_reader.py loads_batch_trace).

Plain functions, no Streamlit: `lane_cells` says what each lane shows (tests check it against the
engine's records), `lanes_figure` draws it. Request ids come from untrusted files: they reach Plotly
through esc().
"""
import plotly.graph_objects as go

from app.figures.style import (
    ACCEPTED,
    BONUS,
    DISCARDED,
    GRID,
    OKABE_ITO,
    REJECTED,
    RESAMPLED,
    STYLES,
    Style,
    cells,
    esc,
    figure,
    labels,
    legend_name,
)

IDLE = "idle"
IDLE_STYLE = Style("idle row (finished: fed a filler, appends nothing)", OKABE_ITO["grey"], "·", "circle-open", ".")
LANE_PX = 34


def lane_cells(row: dict, k: int) -> list[str]:
    """What one lane shows at draft positions 1..K and then the target's token: ACCEPTED up to the
    row's accepted count, then REJECTED and DISCARDED after it with a RESAMPLED token, or a BONUS
    token after K accepted. An idle row: IDLE everywhere."""
    if row["idle"]:
        return [IDLE] * (k + 1)
    a = row["num_accepted"]
    if a == k:
        return [ACCEPTED] * k + [BONUS]
    return [ACCEPTED] * a + [REJECTED] + [DISCARDED] * (k - a - 1) + [RESAMPLED]


def lane_name(row: dict, request_ids: dict[int, str]) -> str:
    who = "idle" if row["idle"] else esc(request_ids.get(row["request"], f"request {row['request'] + 1}"))
    return f"row {row['row']} · {who}"


def lane_hover(row: dict, position: int, kind: str, k: int, request_ids: dict[int, str]) -> str:
    where = "the target's token" if position == k + 1 else f"draft position {position}"
    if row["idle"]:
        return f"row {row['row']}: idle · {where} computed for nothing"
    t, d = row["target_cache_len"], row["draft_cache_len"]
    style = IDLE_STYLE if kind == IDLE else STYLES[kind]
    return (f"<b>{lane_name(row, request_ids)}</b> · {where}: {esc(style.label)}<br>"
            f"accepted {row['num_accepted']} of {k} · committed {row['committed']}<br>"
            f"target cache {t['before']} → {t['after_append']} → {t['after_rollback']}<br>"
            f"draft cache {d['before']} → {d['after_append']} → {d['after_rollback']}")


def request_cycle(batch: dict, cycle: int, request: int) -> int:
    """The request's own cycle number (in its trace) that batched cycle `cycle` ran."""
    return sum(1 for c in batch["cycles"][:cycle] for r in c["rows"] if not r["idle"] and r["request"] == request)


def lanes_figure(batch: dict, cycle: int, request_ids: dict[int, str] | None = None) -> go.Figure:
    """Cycle `cycle` of the batch, one lane per row (row 0 at the top)."""
    request_ids = request_ids or {}
    k = batch["header"]["settings"]["k"]
    c = batch["cycles"][cycle]
    rows = c["rows"]
    names = [lane_name(r, request_ids) for r in rows]
    kinds = [lane_cells(r, k) for r in rows]
    traces = []
    for kind in (ACCEPTED, REJECTED, DISCARDED, RESAMPLED, BONUS, IDLE):
        style = IDLE_STYLE if kind == IDLE else STYLES[kind]
        at = [(i, p) for i, lane in enumerate(kinds) for p, got in enumerate(lane) if got == kind]
        if not at:
            continue
        traces.append(cells(f"{style.mark} {style.label}" if kind == IDLE else legend_name(kind), style,
                            [names[i] for i, _ in at], [p + 0.5 for _, p in at], [1.0] * len(at),
                            [lane_hover(rows[i], p + 1, kind, k, request_ids) for i, p in at]))
    traces.append(labels([k + 1.75] * len(rows), names,
                         ["idle" if r["idle"] else f"+{r['committed']}" for r in rows], on_cells=False))
    ticks = list(range(1, k + 2))
    title = (f"Batched cycle {cycle}: {len(rows)} rows, {c['idle_rows']} idle · draft {c['draft_time_s'] * 1e3:.0f} ms, "
             f"verify {c['verify_time_s'] * 1e3:.0f} ms, bookkeeping {c['bookkeeping_time_s'] * 1e3:.0f} ms")
    return figure(traces, title, height=110 + LANE_PX * len(rows), barmode="overlay",
                  xaxis=dict(range=[0.4, k + 2.4], tickvals=ticks, ticktext=[str(t) for t in ticks[:-1]] + ["next"],
                             title=dict(text="draft position, then the target's token (right: tokens committed)"),
                             gridcolor=GRID),
                  yaxis=dict(autorange="reversed", categoryorder="array", categoryarray=names, title=None))
