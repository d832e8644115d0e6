"""Figures of a tree trace's statistics, and of a chain and a tree run of one pair.

engine/stats/trees.py computes every number; these functions only draw them (no Streamlit).
The statistics page's conventions (app/figures/stats.py): Okabe-Ito colours, and the two runs
also differ by pattern or marker, so colour is never the only cue. Run labels are escaped:
an uploaded trace's name reaches them.
"""
import plotly.graph_objects as go

from app.figures.stats import COMPARE_COLOURS, COMPARE_PATTERNS, _hatch, _layout, _ms
from app.figures.style import OKABE_ITO, esc
from engine.stats.trees import ChainTreeComparison, RunSide, TreeStats

TREE_COLOUR, CHAIN_COLOUR = COMPARE_COLOURS  # the tree first: it is the open trace
TREE_PATTERN, CHAIN_PATTERN = COMPARE_PATTERNS


def _sides(ts: TreeStats, comparison: ChainTreeComparison | None) -> list[tuple[RunSide | None, str, str, str]]:
    """(side, label, colour, pattern) for the tree and, when compared, the chain. side None: the tree alone."""
    if comparison is None:
        return [(None, "tree", TREE_COLOUR, TREE_PATTERN)]
    return [(comparison.tree, comparison.tree.label, TREE_COLOUR, TREE_PATTERN),
            (comparison.chain, comparison.chain.label, CHAIN_COLOUR, CHAIN_PATTERN)]


def acceptance_depth_figure(ts: TreeStats, comparison: ChainTreeComparison | None = None) -> go.Figure:
    """Acceptance by depth (the tree) beside acceptance by position (the chain): the same survival count,
    so the bars answer 'how often did a cycle get at least d tokens from the draft?'."""
    fig = go.Figure()
    for side, label, colour, pattern in _sides(ts, comparison):
        values = ts.acceptance_by_depth if side is None else side.acceptance
        what = "position" if side is not None and side is comparison.chain else "depth"
        fig.add_bar(x=list(range(1, len(values) + 1)), y=values, name=esc(f"{label}: by {what}"),
                    marker=dict(color=colour, pattern=_hatch(pattern)),
                    hovertemplate=f"{what} %{{x}}: %{{y:.3f}}<extra>{esc(label)}</extra>")
    fig.update_xaxes(title="depth d of the tree · position i of the chain", dtick=1)
    fig.update_yaxes(title="fraction of cycles reaching it", range=[0, 1.05])
    return _layout(fig, "Acceptance by depth and by position", 340, top=90, barmode="group")


def tokens_distribution_figure(ts: TreeStats, comparison: ChainTreeComparison | None = None) -> go.Figure:
    """Share of cycles committing n tokens (accepted + 1), with the mean in each series' name."""
    fig = go.Figure()
    for side, label, colour, pattern in _sides(ts, comparison):
        counts = ts.tokens_per_cycle_counts if side is None else side.tokens_per_cycle_counts
        mean = ts.tokens_per_cycle if side is None else side.tokens_per_cycle
        total = max(1, sum(counts))
        fig.add_bar(x=list(range(1, len(counts) + 1)), y=[c / total for c in counts], customdata=counts,
                    name=esc(f"{label} (mean {mean:.3f})"),  # as the headline, metric and table print it
                    marker=dict(color=colour, pattern=_hatch(pattern)),
                    hovertemplate=f"%{{x}} tokens: %{{y:.3f}} (%{{customdata}} cycles)<extra>{esc(label)}</extra>")
    fig.update_xaxes(title="tokens committed in one cycle (accepted + 1)", dtick=1)
    fig.update_yaxes(title="fraction of cycles")
    return _layout(fig, "Tokens per cycle", 340, top=90, barmode="group")


def verify_width_figure(ts: TreeStats, comparison: ChainTreeComparison | None = None) -> go.Figure:
    """Median verify pass against its width (root + nodes), the middle half as error bars; the chain's
    narrower pass beside it when compared."""
    widths = ts.verify_by_width
    fig = go.Figure()
    fig.add_scatter(x=[w.width for w in widths], y=[_ms(w.verify_s.median) for w in widths], mode="markers",
                    name="tree: median verify", marker=dict(color=TREE_COLOUR, size=11, symbol="circle"),
                    customdata=[w.cycles for w in widths],
                    error_y=dict(type="data", symmetric=False,
                                 array=[_ms(w.verify_s.high - w.verify_s.median) for w in widths],
                                 arrayminus=[_ms(w.verify_s.median - w.verify_s.low) for w in widths]),
                    hovertemplate="%{x} positions: %{y:.2f} ms (%{customdata} cycles)<extra>tree</extra>")
    if comparison is not None:
        c = comparison.chain
        fig.add_scatter(x=[c.verify_width], y=[_ms(c.verify_s.median)], mode="markers", name=esc(f"{c.label}: median verify"),
                        marker=dict(color=CHAIN_COLOUR, size=13, symbol="diamond-open"),
                        error_y=dict(type="data", symmetric=False, array=[_ms(c.verify_s.high - c.verify_s.median)],
                                     arrayminus=[_ms(c.verify_s.median - c.verify_s.low)]),
                        hovertemplate=f"%{{x}} positions: %{{y:.2f}} ms<extra>{esc(c.label)}</extra>")
    fig.update_xaxes(title="positions in the verify pass (N + 1)", rangemode="tozero")
    fig.update_yaxes(title="ms", rangemode="tozero")
    return _layout(fig, "What a verify pass cost, by its width", 340, top=90)


def sibling_rank_figure(ts: TreeStats) -> go.Figure:
    """Accepted nodes by their place among their siblings: every bar past the first is a token
    the draft did not rank first."""
    ranks = list(range(1, len(ts.rank_counts) + 1))
    colours = [OKABE_ITO["blue"] if r == 1 else OKABE_ITO["bluish_green"] for r in ranks]
    fig = go.Figure(go.Bar(x=ranks, y=ts.rank_counts, marker=dict(color=colours, pattern=_hatch(
                               ["" if r == 1 else "/" for r in ranks])), showlegend=False,
                           hovertemplate="child %{x} of its parent: %{y} accepted nodes<extra></extra>"))
    fig.update_xaxes(title="rank of the accepted child among its siblings (1 = the draft's first choice)", dtick=1)
    fig.update_yaxes(title="accepted nodes", rangemode="tozero")
    saved = f"{ts.saved_cycles} of {ts.num_cycles} cycles took a later sibling somewhere on their path"
    return _layout(fig, esc(f"Which child the walk accepted: {saved}"), 320)
