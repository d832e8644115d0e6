"""How the chosen KV-cache layout holds the target's K/V at the verify (stage 2) and rollback (stage 5).

Plain functions: a trace's header and one cycle record in, Plotly figures out.
- dynamic: one contiguous strip; the rollback cuts its tail off.
- static: a fixed buffer with a write pointer; rejected K/V stay as greyed stale cells
  that the causal mask hides until the next append overwrites them.
- paged: the block table (logical block -> physical block id, `block_size` slots each)
  and the pool of numbered blocks, with the blocks this cycle allocated or returned to
  the free list.
Every drawn range is windowed, so a huge number in a trace never means a huge figure.
"""
from typing import Sequence

import plotly.graph_objects as go

from app.figures.caches import CACHE_CONTEXT
from app.figures.style import COMMITTED, OKABE_ITO, PROVISIONAL, ROLLED_BACK, STYLES, Style, cells, figure, labels, shown
from engine.stats.layouts import LayoutStats
from engine.trace.layout_checks import layout_of

STALE, EMPTY, FREE, ALLOCATED, FREED, HELD = "stale", "empty", "free", "allocated", "freed", "held"
FREED_SLOT = "freed slot"
LAYOUT_STYLES = {
    STALE: Style("stale: rejected K/V, masked", OKABE_ITO["grey"], "░", "square-open", "/"),
    EMPTY: Style("empty slot", "#DDDDDD", "·", "square-open", ""),
    FREE: Style("free block", "#DDDDDD", "·", "square-open", ""),
    HELD: Style("block in the table", OKABE_ITO["blue"], "▪", "square", ""),
    ALLOCATED: Style("allocated this cycle", OKABE_ITO["sky_blue"], "+", "cross", "."),
    FREED: Style("returned to the free list", OKABE_ITO["vermillion"], "↩", "x", "x"),
    FREED_SLOT: Style("slot of a block returned to the free list", OKABE_ITO["vermillion"], "↩", "x", "x"),
}
ALL_STYLES = {**STYLES, **LAYOUT_STYLES}
LAYOUT_WORDS = {"dynamic": "dynamic (growable tensors, crop the tail)",
                "static": "static (preallocated buffer, move the write position)",
                "paged": "paged (blocks from a pool, free whole blocks)"}
ROLLBACK_WORDS = {
    "dynamic": "The cache is a set of contiguous tensors (Hugging Face `DynamicCache`): the rollback slices "
               "their tail off, and the memory of the cut positions is gone.",
    "static": "The cache is one buffer preallocated for the whole run (gpt-fast, Hugging Face `StaticCache`): "
              "the rollback only moves the write position back. The rejected K/V stay in their slots, greyed "
              "below, but a query at position p attends to slots 0..p only, so they are never read, and the "
              "next cycle overwrites them.",
    "paged": "The cache is a block table over a pool of fixed-size blocks (vLLM PagedAttention): the rollback "
             "lowers the token count and returns every block that lies wholly past it to the free list. The "
             "partly filled block stays; its stale slots are overwritten by the next append.",
}
MAX_CELLS = 64  # slots drawn at most in one row
MAX_POOL = 96  # pool blocks drawn at most


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def name_of(key: str) -> str:
    return f"{ALL_STYLES[key].mark} {ALL_STYLES[key].label}"


def _row(key: str, y: str, xs: list[int], hover: list[str], text: list[str]) -> list[dict]:
    if not xs:
        return []
    return [cells(name_of(key), ALL_STYLES[key], [y] * len(xs), [x - 0.45 for x in xs], [0.9] * len(xs), hover),
            labels(xs, [y] * len(xs), text, size=10)]


def _text_at(texts: Sequence[str], p: int, limit: int = 5) -> str:
    return shown(texts[p], limit) if 0 <= p < len(texts) else ""


def moment(stage: int) -> str:
    """Stage 2 shows the cache after the verify's append, stage 5 after the rollback."""
    return "after_rollback" if stage >= 5 else "after_append"


def layout_figures(header: dict, c: dict, stage: int, texts: Sequence[str] = ()) -> list[go.Figure]:
    """The target cache in the trace's layout at `stage` (2: after the verify, 5: after the rollback)."""
    layout = layout_of(header)
    states = c.get("target_cache_layout_state")
    if layout["name"] == "static" and states:
        return [static_figure(layout, c, states, stage, texts)]
    if layout["name"] == "paged" and states:
        return [block_table_figure(layout, c, states, stage, texts), pool_figure(layout, states, stage)]
    return [dynamic_figure(c, stage, texts)]


# ---------------------------------------------------------------- dynamic: one growable strip

def dynamic_figure(c: dict, stage: int, texts: Sequence[str] = ()) -> go.Figure:
    lens = c["target_cache_len"]
    before, appended, after = lens["before"], lens["after_append"], lens["after_rollback"]
    first = max(0, before - CACHE_CONTEXT)
    end = min(appended, first + MAX_CELLS)
    rows = {COMMITTED: [], PROVISIONAL: [], ROLLED_BACK: []}
    for p in range(first, end):
        key = COMMITTED if p < (before if stage < 5 else after) else PROVISIONAL if stage < 5 else ROLLED_BACK
        rows[key].append(p)
    traces = [t for key, xs in rows.items() for t in _row(
        key, "tensor", xs, [f"slot {p}: K/V of {_text_at(texts, p, 40)} · {ALL_STYLES[key].label}" for p in xs],
        [("✂" if key == ROLLED_BACK and p == after else "") + _text_at(texts, p) for p in xs])]
    title = (f"Dynamic cache (target): tensors grew {before} → {appended} positions" if stage < 5 else
             f"Dynamic cache (target): crop cuts the tensors {appended} → {after}; "
             f"{plural(appended - after, 'cut slot')} gone from memory")
    return _strip(traces, title, first, end, marker=after if stage >= 5 else None, marker_text="✂ crop")


def _strip(traces: list[dict], title: str, first: int, end: int, marker: int | None = None,
           marker_text: str = "") -> go.Figure:
    shapes, notes = [], []
    if marker is not None:
        shapes.append(dict(type="line", x0=marker - 0.5, x1=marker - 0.5, y0=-0.6, y1=0.6,
                           line=dict(color=OKABE_ITO["vermillion"], width=3)))
        notes.append(dict(x=marker - 0.5, y=0.75, text=marker_text, showarrow=False,
                          font=dict(color=OKABE_ITO["vermillion"])))
    skipped = f" (slots 0–{first - 1}: committed, not drawn)" if first else ""
    return figure(traces, title, 200, barmode="overlay", shapes=shapes, annotations=notes,
                  yaxis=dict(fixedrange=True), xaxis=dict(title=dict(text="slot" + skipped),
                                                          range=[first - 0.5, max(end, first + 1) + 0.5],
                                                          fixedrange=True))


# ---------------------------------------------------------------- static: a buffer and a write pointer

def static_cells(layout: dict, c: dict, states: dict, stage: int) -> dict[str, list[int]]:
    """Slot index lists per kind for the drawn window of the buffer."""
    before = c["target_cache_len"]["before"]
    write = states[moment(stage)]["write_position"]
    stale_end = write + states[moment(stage)]["stale_slots"]
    first = max(0, before - CACHE_CONTEXT)
    end = min(layout["capacity"], first + MAX_CELLS, max(stale_end, write) + CACHE_CONTEXT)
    out = {COMMITTED: [], PROVISIONAL: [], STALE: [], EMPTY: []}
    for p in range(first, end):
        if p < write:
            out[PROVISIONAL if stage < 5 and p >= before else COMMITTED].append(p)
        else:
            out[STALE if p < stale_end else EMPTY].append(p)
    return out


def static_figure(layout: dict, c: dict, states: dict, stage: int, texts: Sequence[str] = ()) -> go.Figure:
    s = states[moment(stage)]
    kinds = static_cells(layout, c, states, stage)
    provisional_end = c["target_cache_len"]["after_append"]
    traces = []
    for key, xs in kinds.items():
        text = [_text_at(texts, p) if key != STALE or p < provisional_end else "old" for p in xs]
        text = ["" if key == EMPTY else t for t in text]
        hover = [f"slot {p} · {ALL_STYLES[key].label}" + (": never attended (masked by position)"
                                                           if key in (STALE, EMPTY) else "") for p in xs]
        traces += _row(key, "buffer", xs, hover, text)
    drawn = [p for xs in kinds.values() for p in xs] or [0]
    write = s["write_position"]
    title = (f"Static cache (target): {layout['capacity']} slots preallocated; write position "
             f"{states['before']['write_position']} → {write}" if stage < 5 else
             f"Static cache (target): rollback moves the write position {states['after_append']['write_position']} "
             f"→ {write}; {plural(s['stale_slots'], 'stale slot')} keep rejected K/V, masked until overwritten")
    return _strip(traces, title, min(drawn), max(drawn) + 1, marker=write, marker_text="▼ write position")


# ---------------------------------------------------------------- paged: block table and pool

def table_text(table: list[int], keep: int = 6) -> str:
    """A block table as text, its head elided when long."""
    return str(table) if len(table) <= keep else "[…, " + ", ".join(map(str, table[-keep:])) + "]"


def block_table_figure(layout: dict, c: dict, states: dict, stage: int, texts: Sequence[str] = ()) -> go.Figure:
    """The sequence's logical blocks, each labelled with its physical block id, slot by slot."""
    size, s = layout["block_size"], states[moment(stage)]
    appended = states["after_append"]
    table = appended["block_table"] if stage >= 5 else s["block_table"]  # stage 5 still draws the freed blocks
    n_tokens, kept_blocks = s["num_tokens"], len(states["after_rollback"]["block_table"])
    before = c["target_cache_len"]["before"]
    first_block = max(0, (before - CACHE_CONTEXT) // size)
    last_block = min(len(table), first_block + max(1, MAX_CELLS // size))
    rows = {COMMITTED: [], PROVISIONAL: [], STALE: [], FREED_SLOT: [], EMPTY: []}
    for p in range(first_block * size, last_block * size):
        if stage >= 5 and p // size >= kept_blocks:
            rows[FREED_SLOT].append(p)
        elif p < n_tokens:
            rows[PROVISIONAL if stage < 5 and p >= before else COMMITTED].append(p)
        elif stage >= 5 and p < appended["num_tokens"]:
            rows[STALE].append(p)  # rejected K/V in the kept partial block: past num_tokens, overwritten next
        else:
            rows[EMPTY].append(p)
    traces = []
    for key, xs in rows.items():
        hover = [f"position {p} → block {table[p // size]}, slot {p % size} · {ALL_STYLES[key].label}" for p in xs]
        traces += _row(key, "slots", xs, hover, [_text_at(texts, p) if key != EMPTY else "" for p in xs])
    heads = [dict(x=b * size + (size - 1) / 2, y=0.62, showarrow=False,
                  text=f"logical {b} → <b>block {table[b]}</b>" + (" ↩ freed" if stage >= 5 and b >= kept_blocks else ""))
             for b in range(first_block, last_block)]
    bounds = [dict(type="line", x0=b * size - 0.5, x1=b * size - 0.5, y0=-0.5, y1=0.5, line=dict(width=2))
              for b in range(first_block, last_block + 1)]
    title = (f"Paged cache (target): block table {table_text(states['before']['block_table'])} → "
             f"{table_text(s['block_table'])}, {n_tokens} positions in {len(s['block_table'])} blocks of {size}"
             if stage < 5 else
             f"Paged cache (target): rollback to {n_tokens} positions keeps {kept_blocks} blocks "
             + ("(the partial one too) " if n_tokens % size else "")
             + f"and frees {len(states['blocks_freed'])}: {states['blocks_freed']}")
    lo, hi = first_block * size, max(last_block, first_block + 1) * size
    return figure(traces, title, 220, barmode="overlay", annotations=heads, shapes=bounds,
                  yaxis=dict(fixedrange=True, range=[-0.6, 0.9]),
                  xaxis=dict(title=dict(text="sequence position (block boundaries drawn)"), range=[lo - 0.5, hi - 0.5],
                             fixedrange=True))


def pool_cells(layout: dict, states: dict, stage: int) -> dict[str, list[int]]:
    """Physical block ids per kind: in this sequence's table, just allocated, just freed, free."""
    s = states[moment(stage)]
    held, fresh, freed = set(s["block_table"]), set(states["blocks_allocated"]), set(states["blocks_freed"])
    out = {HELD: [], ALLOCATED: [], FREED: [], FREE: []}
    for b in range(min(layout["pool_blocks"], MAX_POOL)):
        if stage >= 5 and b in freed:
            out[FREED].append(b)
        elif b in held:
            out[ALLOCATED if b in fresh else HELD].append(b)
        else:
            out[FREE].append(b)
    return out


def pool_figure(layout: dict, states: dict, stage: int) -> go.Figure:
    kinds = pool_cells(layout, states, stage)
    s = states[moment(stage)]
    traces = []
    for key, xs in kinds.items():
        traces += _row(key, "pool", xs, [f"physical block {b} · {ALL_STYLES[key].label}" for b in xs],
                       [str(b) for b in xs])
    more = f" (first {MAX_POOL} of {layout['pool_blocks']} drawn)" if layout["pool_blocks"] > MAX_POOL else ""
    title = (f"Block pool: {s['blocks_used']} of {layout['pool_blocks']} blocks used "
             f"({s['blocks_used'] / layout['pool_blocks']:.0%}), {s['blocks_free']} on the free list{more}")
    return figure(traces, title, 170, barmode="overlay", yaxis=dict(fixedrange=True),
                  xaxis=dict(title=dict(text="physical block id"), range=[-0.5, min(layout["pool_blocks"], MAX_POOL) - 0.5],
                             fixedrange=True))


# ---------------------------------------------------------------- over the whole run (statistics page)

def memory_figure(ls: LayoutStats) -> go.Figure:
    """K/V slots held by the target after each verify, and (paged) unused slots in held blocks after rollback."""
    m = ls.target
    x = list(range(len(m.per_cycle_held)))
    traces = [dict(type="scatter", x=x, y=m.per_cycle_held, mode="lines+markers", name="slots held after the verify",
                   line=dict(color=OKABE_ITO["blue"]), marker=dict(symbol="square"))]
    if ls.name == "paged":
        traces.append(dict(type="bar", x=x, y=m.per_cycle_unused, name="unused slots in held blocks (fragmentation)",
                           marker=dict(color=OKABE_ITO["vermillion"], pattern=dict(shape="x"))))
    title = {"dynamic": "Dynamic: memory follows the attended length",
             "static": f"Static: the whole {m.peak_slots_held}-slot buffer is held from the start",
             "paged": f"Paged: memory grows a block ({ls.block_size} slots) at a time; "
                      f"mean {m.unused_slots_mean:.1f} slots unused after rollback"}[ls.name]
    return figure(traces, title, 280, xaxis=dict(title=dict(text="cycle")),
                  yaxis=dict(title=dict(text="K/V slots (target)"), rangemode="tozero"))


# ---------------------------------------------------------------- the rollback page: corrupting vs harmless stale K/V

BUG_STATUS = {"in place": COMMITTED, "stale": "bug stale", "shifted": "bug shifted"}
LAYOUT_STYLES["bug stale"] = Style("rejected K/V inside the attended range (read!)", OKABE_ITO["vermillion"], "✗", "x", "x")
LAYOUT_STYLES["bug shifted"] = Style("right token, shifted position", OKABE_ITO["orange"], "↔", "diamond", "/")
ALL_STYLES.update(LAYOUT_STYLES)
BUG_ROW, STATIC_ROW = "keeps rejected K/V (bug)", "static cache (correct)"
CELL_HALF = 0.45  # a pointer line's half height, in rows: just past a cell's (cells() draws them 0.8 high)
STALE_ROWS_RANGE = (-1.0, 2.0)  # the two rows (0 and 1) and a band for words above and below them


def stale_comparison_figure(bug_status: Sequence[str], bug_attention_on_stale: float, write_position: int,
                            stale_slots: int, static_attention_on_stale: float, title_cycle: int) -> go.Figure:
    """Both caches after one cycle: where the stale K/V sit relative to what the next query reads.

    bug_status: the broken run's target cells, "in place" / "stale" / "shifted" (engine.teaching.runs);
    the static run: slots before write_position attended, then stale_slots of rejected K/V.
    """
    end = max(len(bug_status), write_position + stale_slots)
    first = max(0, end - MAX_CELLS)
    rows: dict[str, list[tuple[str, int]]] = {}
    for p in range(first, len(bug_status)):
        rows.setdefault(BUG_STATUS.get(bug_status[p], COMMITTED), []).append((BUG_ROW, p))
    for p in range(first, write_position + stale_slots):
        rows.setdefault(COMMITTED if p < write_position else STALE, []).append((STATIC_ROW, p))
    traces = []
    for key, cells_ in rows.items():
        ys, xs = [y for y, _ in cells_], [p for _, p in cells_]
        hover = [f"{y}, slot {p}: {ALL_STYLES[key].label}" for y, p in cells_]
        traces += [cells(name_of(key), ALL_STYLES[key], ys, [x - 0.45 for x in xs], [0.9] * len(xs), hover),
                   labels(xs, ys, [ALL_STYLES[key].mark for _ in xs], size=10)]
    pointers = [(BUG_ROW, len(bug_status), f"length {len(bug_status)}: everything left of it is read"),
                (STATIC_ROW, write_position, f"write position {write_position}: the mask hides what is right of it")]
    shapes = [dict(type="line", x0=x - 0.5, x1=x - 0.5, y0=i - CELL_HALF, y1=i + CELL_HALF, yref="y",
                   line=dict(color=OKABE_ITO["vermillion"], width=3)) for i, (_, x, _) in enumerate(pointers)]
    # Each pointer's words in the free band on the far side of its own row (below the bug's, the bottom
    # row; above the static cache's, the top row): beside the row's middle they sat on the cells.
    notes = [dict(x=x - 0.5, y=i + (CELL_HALF + 0.05 if i else -CELL_HALF - 0.05), yref="y", text=text,
                  showarrow=False, xanchor="right", yanchor="bottom" if i else "top", font=dict(size=11))
             for i, (_, x, text) in enumerate(pointers)]
    title = (f"After cycle {title_cycle}: the bug's target puts {bug_attention_on_stale:.1%} of its attention on "
             f"rejected K/V; the static cache's stale slots get {static_attention_on_stale:.1%}")
    return figure(traces, title, 300, top=90, barmode="overlay", shapes=shapes, annotations=notes,
                  yaxis=dict(categoryorder="array", categoryarray=[BUG_ROW, STATIC_ROW], fixedrange=True,
                             range=list(STALE_ROWS_RANGE)),
                  xaxis=dict(title=dict(text="cache slot"), range=[first - 0.5, end + 0.5], fixedrange=True))
