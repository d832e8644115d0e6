"""A tree trace's statistics as plain text, for `python -m engine stats TREE.jsonl`.

The numbers are engine/stats/trees.py's, the ones the app's statistics page shows for a tree trace.
"""
from engine.stats.layouts import layout_lines, layout_stats
from engine.stats.paths import weights_words
from engine.stats.trees import TREE_DEFINITIONS, TreeStats, tree_label, tree_stats
from engine.trace import Trace, model_name
from engine.trace.metrics import TOKENS_PER_S


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def shape_lines(trace: Trace, ts: TreeStats) -> list[str]:
    return [f"TREE: {tree_label(ts.shape)}   max depth {ts.max_depth}",
            f"  target: {model_name(trace.header, 'target')}   draft: {model_name(trace.header, 'draft')}",
            f"  target weights: {weights_words(trace.header)}",
            f"  cycles: {ts.num_cycles}   nodes per cycle: mean {ts.nodes_mean:.2f}, min {ts.nodes_min}, "
            f"max {ts.nodes_max}"]


def acceptance_lines(ts: TreeStats) -> list[str]:
    return [
        "TREE ACCEPTANCE",
        f"  tokens per cycle: {ts.tokens_per_cycle:.3f}   {TREE_DEFINITIONS['tokens_per_cycle']}",
        "  acceptance by depth: " + " ".join(f"{d}: {p:.3f}" for d, p in enumerate(ts.acceptance_by_depth, start=1)),
        f"      {TREE_DEFINITIONS['acceptance_by_depth']}",
        f"  accepted / drafted nodes: {ts.acceptance_rate:.3f}   {TREE_DEFINITIONS['acceptance_rate']}",
    ]


def histogram_lines(ts: TreeStats) -> list[str]:
    lines = ["TOKENS COMMITTED PER CYCLE (accepted nodes + 1)", "  tokens  cycles  share"]
    total = max(1, ts.num_cycles)
    lines += [f"  {n:>6}  {count:>6}  {count / total:>5.3f}"
              for n, count in enumerate(ts.tokens_per_cycle_counts, start=1)]
    return lines


def walk_lines(ts: TreeStats) -> list[str]:
    total = max(1, ts.num_cycles)
    accepted = max(1, sum(ts.rank_counts))
    ranks = "  ".join(f"{r}: {n} ({n / accepted:.0%})" for r, n in enumerate(ts.rank_counts, start=1)) or "none accepted"
    return [
        "WHERE THE WALK ENDED AND WHICH CHILD IT TOOK",
        f"  next token: bonus {ts.bonus_cycles} ({ts.bonus_cycles / total:.0%}), residual {ts.residual_cycles} "
        f"({ts.residual_cycles / total:.0%})",
        f"      {TREE_DEFINITIONS['next_token']}",
        f"  accepted nodes by sibling rank: {ranks}",
        f"      {TREE_DEFINITIONS['sibling_rank']}",
        f"  cycles saved by a later sibling: {ts.saved_cycles} of {ts.num_cycles} ({ts.saved_cycles / total:.0%})"
        f"   {TREE_DEFINITIONS['saved_cycles']}",
    ]


def cost_lines(ts: TreeStats) -> list[str]:
    lines = ["TREE COST (medians over cycles, middle half in brackets)",
             f"  draft forwards per cycle: {ts.draft_forwards:.2f}   catch-up in {ts.catch_up_share:.0%} of cycles",
             f"      {TREE_DEFINITIONS['draft_forwards']}",
             "  verify by width (root + nodes):"]
    lines += [f"    {w.width:>3} positions: {ms(w.verify_s.median)} ({ms(w.verify_s.low)}-{ms(w.verify_s.high)}), "
              f"{w.cycles} cycles" for w in ts.verify_by_width]
    lines += [f"  cycle: {ms(ts.cycle_s.median)} ({ms(ts.cycle_s.low)}-{ms(ts.cycle_s.high)})",
              f"  decoding tokens/s: {ts.tokens_per_s:.1f}   ({TOKENS_PER_S})",
              "  speedup over plain decoding: not computed (tree runs record no step-time calibration yet); "
              "compare with a chain run of the same pair on the app's statistics page"]
    return lines


def summary_lines(trace: Trace) -> list[str]:
    """The report's last line, for chain and tree traces alike: what the run made, or that it did not finish."""
    if not trace.summary:
        return ["INCOMPLETE trace: no summary (the run did not finish)"]
    return [f"generated tokens: {trace.summary['num_generated']}   end-to-end tokens/s: "
            f"{trace.summary['tokens_per_s']:.1f}   stop: {trace.summary['stop_reason']}"]


def format_tree_stats(trace: Trace) -> str:
    ts = tree_stats(trace)
    sections = [shape_lines(trace, ts), acceptance_lines(ts), histogram_lines(ts), walk_lines(ts)]
    if ts.num_cycles:
        sections.append(cost_lines(ts))
    sections.append(layout_lines(layout_stats(trace)))
    sections.append(summary_lines(trace))
    return "\n\n".join("\n".join(lines) for lines in sections)
