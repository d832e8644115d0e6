"""The verify pass's tree attention mask of one tree cycle: who attends to whom.

Plain functions, no Streamlit: a tree cycle record in, a figure out.
"""
from typing import Sequence

import numpy as np
import plotly.graph_objects as go

from app.figures.style import INK, OKABE_ITO, figure, shown, tint
from app.figures.tree_record import ancestors_or_self, parents_of


def tree_mask(parents: Sequence[int]) -> list[list[bool]]:
    """(N+1) x (N+1): row 0 the root's query, row 1+i node i's; column 0 the root's key slot (L),
    column 1+j node j's (L+1+j). A node attends to the root, its ancestors and itself; the root
    to itself. (Every query also attends to the whole prefix, slots 0..L-1.)"""
    n = len(parents)
    rows = [[True] + [False] * n]
    for i in range(n):
        seen = set(ancestors_or_self(parents, i))
        rows.append([True] + [j in seen for j in range(n)])
    return rows


def _mask_reason(row: int, col: int, attends: bool, parents: Sequence[int]) -> str:
    if col == 0:
        return "attends: every query sees the prefix"
    if col == 1:
        return "attends: the root (the last committed token)" if row > 0 else "attends: itself"
    if row == 0:
        return "masked: the root comes before every node"
    if not attends:
        return "masked: another branch (not an ancestor)"
    return "attends: itself" if col - 2 == row - 1 else "attends: an ancestor"


def _mask_hover(row: int, col: int, attends: bool, full: list[str], nodes: list[dict], parents: Sequence[int]) -> str:
    """One cell: query `row` (0 the root, 1+i node i) against key column `col` (0 the prefix, 1 the root, 2+j node j)."""
    query = "root" if row == 0 else f"node {row - 1}"
    position = "L" if row == 0 else f"L+{nodes[row - 1]['depth']}"
    key = "the prefix (slots 0 to L-1)" if col == 0 else "the root" if col == 1 else f"node {col - 2} <b>{full[col - 1]}</b>"
    return f"query {query} <b>{full[row]}</b> at position {position} → key {key}<br>{_mask_reason(row, col, attends, parents)}"


def tree_mask_figure(c: dict, root_text: str = "") -> go.Figure:
    """The verify pass's attention mask as a grid: one row per query (the root, then the nodes, each
    at position L + its depth), one column per key slot (the whole prefix as one column, the root,
    the nodes). A filled cell with ● attends; an empty one is masked."""
    tree = c["tree"]
    nodes, parents = tree["nodes"], parents_of(tree)
    n, L = len(nodes), c["target_cache_len"]["before"]
    mask = tree_mask(parents)
    z = np.asarray([[1] + [int(v) for v in row] for row in mask])  # (N+1, N+2): prefix column first
    small = n <= 12
    chars = 8 if small else 6
    toks = [shown(nd["text"], chars) for nd in nodes]
    root = shown(root_text or "root", chars)
    col_names = [f"prefix ({L} slot{'' if L == 1 else 's'})", f"root {root}"] + [f"{j} {t}" for j, t in enumerate(toks)]
    row_names = [f"root {root} @L"] + [f"{i} {t} @L+{nd['depth']}" for i, (t, nd) in enumerate(zip(toks, nodes))]
    full = [shown(root_text or "root")] + [shown(nd["text"]) for nd in nodes]
    hover = [[_mask_hover(r, k, bool(z[r, k]), full, nodes, parents) for k in range(n + 2)] for r in range(n + 1)]
    marks = np.where(z == 1, "●", "")
    trace = dict(type="heatmap", z=z, x=np.arange(n + 2), y=np.arange(n + 1), zmin=0, zmax=1, showscale=False,
                 colorscale=[[0, tint(OKABE_ITO["grey"], 0.85)], [1, tint(OKABE_ITO["blue"], 0.45)]],
                 xgap=1, ygap=1, text=marks, texttemplate="%{text}", textfont=dict(color=INK, size=12 if n <= 32 else 8),
                 hovertext=np.asarray(hover), hovertemplate="%{hovertext}<extra></extra>")
    tick = 12 if n <= 16 else 10 if n <= 32 else 8
    row_px = 26 if n <= 32 else 15
    return figure([trace], f"Cycle {c['cycle']}: the tree attention mask of the verify pass (● attends; a node sees "
                           "the prefix, its ancestors and itself)", 150 + row_px * (n + 1) + (0 if small else 60),
                  top=64, xaxis=dict(tickvals=list(range(n + 2)), ticktext=col_names, tickangle=0 if small else -90,
                                     tickfont=dict(size=tick), side="top", fixedrange=True, showgrid=False),
                  yaxis=dict(tickvals=list(range(n + 1)), ticktext=row_names, tickfont=dict(size=tick),
                             range=[n + 0.5, -0.5], fixedrange=True, showgrid=False),
                  margin=dict(l=10, r=10, t=64 + (40 if small else 90), b=10))
