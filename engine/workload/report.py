"""A workload's statistics (engine/workload/stats.py's dict) as plain text, for
`python -m engine stats FOLDER`.

Reads only the dict, so a saved statistics file prints the same as a fresh one. "-" stands
for a figure with nothing under it (None: no drafted token, no cycle, no calibration).

May import: the standard library only.
"""


def num(value: float | None, fmt: str = ".3f") -> str:
    return "-" if value is None else f"{value:{fmt}}"


def span(pair: list[float] | None, fmt: str = ".3f") -> str:
    """'[0.412, 0.530]', or '-' when no interval was computed."""
    return "-" if pair is None else f"[{pair[0]:{fmt}}, {pair[1]:{fmt}}]"


def intervals_of(group: dict) -> tuple[str, str]:
    iv = group["intervals"] or {}
    return span(iv.get("acceptance_rate")), span(iv.get("mean_acceptance_length"), ".2f")


def speed_words(group: dict) -> str:
    s = group["speedup"]
    if s is None:
        return "speedup: - (no calibration in the traces, or tree drafts)"
    advised = "decode plainly" if group["advised_k"] == 0 else f"K={group['advised_k']}"
    return (f"speedup at K={s['k']}: measured {s['measured']:.2f}x, Leviathan {s['leviathan']:.2f}x, "
            f"refined {s['refined']:.2f}x (alpha {s['alpha']:.3f}); best K {group['best_k']}, advised: {advised}")


def overall_lines(stats: dict) -> list[str]:
    g = stats["overall"]
    rate_iv, length_iv = intervals_of(g)
    confidence = f"{stats['bootstrap']['confidence']:.0%}"
    return [
        f"WORKLOAD: {stats['requests']} requests, K={stats['k']}",
        f"  cycles {g['cycles']}   drafted {g['draft_tokens']}   accepted {g['accepted_tokens']}   "
        f"generated {g['generated_tokens']}   tokens/s {num(g['tokens_per_s'], '.2f')} (over summed wall time)",
        f"  acceptance rate {num(g['acceptance_rate'])} {rate_iv}   mean acceptance length "
        f"{num(g['mean_acceptance_length'], '.2f')} {length_iv}   ({confidence} intervals resample requests)",
        f"  median request acceptance rate {num(stats['median_acceptance_rate'])}",
        f"  {speed_words(g)}",
    ]


def category_lines(stats: dict) -> list[str]:
    lines = ["BY CATEGORY",
             f"  {'category':<16} {'req':>4} {'cycles':>7} {'drafted':>8} {'accepted':>8} {'rate':>6} "
             f"{'rate interval':<17} {'length':>6} {'length interval':<14} {'tok/s':>7} {'best K':>6}"]
    for name, g in stats["categories"].items():
        rate_iv, length_iv = intervals_of(g)
        lines.append(f"  {name[:16]:<16} {g['requests']:>4} {g['cycles']:>7} {g['draft_tokens']:>8} "
                     f"{g['accepted_tokens']:>8} {num(g['acceptance_rate']):>6} {rate_iv:<17} "
                     f"{num(g['mean_acceptance_length'], '.2f'):>6} {length_iv:<14} "
                     f"{num(g['tokens_per_s'], '.2f'):>7} {num(g['best_k'], 'd'):>6}")
    return lines


def conditional_lines(group: dict) -> list[str]:
    lines = ["CONDITIONAL ACCEPTANCE BY POSITION (of the cycles that drafted position i and accepted all before it)",
             "  position  reached  accepted   rate"]
    lines += [f"  {row['position']:>8} {row['reached']:>8} {row['accepted']:>9} {num(row['rate']):>6}"
              for row in group["conditional_acceptance"]]
    return lines


def histogram_lines(group: dict) -> list[str]:
    total = max(1, sum(group["accepted_histogram"]))  # the drafts: a cycle that drafted nothing is not in it
    lines = ["DRAFT TOKENS ACCEPTED PER DRAFT (cycles that drafted)", "  accepted  drafts  share"]
    lines += [f"  {j:>8} {count:>7} {count / total:>6.3f}  {'#' * round(40 * count / total)}"
              for j, count in enumerate(group["accepted_histogram"])]
    return lines


def context_lines(stats: dict) -> list[str]:
    lines = ["ACCEPTANCE BY CONTEXT LENGTH (tokens before the cycle's first draft position)",
             "  context        requests  cycles  drafted  accepted   rate  length"]
    for b in stats["context_length"]:
        where = f"{b['low']}-{b['high'] - 1}" if b["high"] is not None else f"{b['low']}+"
        lines.append(f"  {where:<14} {b['requests']:>8} {b['cycles']:>7} {b['draft_tokens']:>8} "
                     f"{b['accepted_tokens']:>9} {num(b['acceptance_rate']):>6} "
                     f"{num(b['mean_acceptance_length'], '.2f'):>7}")
    return lines


def worst_request_lines(loss: dict) -> list[str]:
    lines = ["WORST REQUESTS (lowest acceptance rate; below = workload median - its rate)",
             "  id               category         rate  below  cycles  file"]
    lines += [f"  {r['id'][:16]:<16} {r['category'][:16]:<16} {num(r['acceptance_rate']):>5} "
              f"{num(r['below_median'], '+.3f'):>6} {r['cycles']:>7}  {r['file']}" for r in loss["worst_requests"]]
    return lines


def worst_cycle_lines(loss: dict) -> list[str]:
    lines = ["WORST CYCLES (most drafted tokens lost; ties: lowest p_target at the rejected token)",
             "  request          cycle  lost/drafted  rejected token          p_draft  p_target  file"]
    for c in loss["worst_cycles"]:
        token = "-" if c["text"] is None else f"{c['rejected_position']}: {c['text']!r}"
        lines.append(f"  {c['request'][:16]:<16} {c['cycle']:>5} {c['lost']:>6}/{c['drafted']:<6} {token[:22]:<22} "
                     f"{num(c['p_draft']):>8} {num(c['p_target']):>9}  {c['file']}")
    return lines


def rejected_lines(loss: dict) -> list[str]:
    r = loss["rejected_tokens"]
    lines = [f"REJECTED DRAFT TOKENS: {r['rejections']} rejections; mean p_draft {num(r['mean_p_draft'])}, "
             f"mean p_target {num(r['mean_p_target'])} at the rejected token"]
    if r["skipped_tree_requests"]:
        lines.append(f"  ({r['skipped_tree_requests']} tree requests skipped: a tree records no per-position tokens)")
    lines.append("  class         rejected  tested  rejected/tested")
    lines += [f"  {name:<13} {row['rejected']:>8} {row['tested']:>7} {num(row['rate']):>16}"
              for name, row in r["classes"].items()]
    top = ", ".join(f"{t['text']!r} x{t['count']}" for t in r["top_tokens"])
    lines.append(f"  most often rejected: {top or '-'}")
    return lines


def format_workload_stats(stats: dict) -> str:
    """The whole report, sections separated by blank lines."""
    overall, loss = stats["overall"], stats["loss"]
    sections = [overall_lines(stats), category_lines(stats), conditional_lines(overall), histogram_lines(overall),
                context_lines(stats), worst_request_lines(loss), worst_cycle_lines(loss), rejected_lines(loss)]
    return "\n\n".join("\n".join(line.rstrip() for line in lines) for lines in sections) + "\n"
