"""The Workload page's views of one workload (and of a second one beside it, every table and chart
showing both): categories with their intervals, positions and context length, every request, the
batch lanes; a "Why?" beside every speedup below 1 (app/figures/slower.py, as the stepper's).

Numbers: engine/workload/stats.py (the same as `python -m engine stats FOLDER --json`); figures:
app/figures/workload.py; where the loss is: app/views/sections/workload_loss.py. Every request and
cycle links into the stepper. Tables keep to a few columns, so they fit the page at 1366x768.
"""
import zlib

import streamlit as st

from app.figures import batch as batch_figs
from app.figures import workload as figs
from app.figures.slower import SlowerRun, why_slower
from app.figures.workload import fmt
from app.ui import workloads
from app.ui.pages import STEPPER
from app.ui.safe import markdown_table, md
from app.ui.widgets import chart
from engine.trace import TraceError


def headline(stats: dict) -> str:
    o = stats["overall"]
    iv = o.get("intervals") or {}
    rate, length = iv.get("acceptance_rate"), iv.get("mean_acceptance_length")
    parts = [f"**{stats['requests']}** requests, **{o['cycles']}** cycles",
             f"draft acceptance rate **{fmt(o['acceptance_rate'])}**"
             + (f" (95% interval over requests {rate[0]:.3f}–{rate[1]:.3f})" if rate else ""),
             f"mean acceptance length **{fmt(o['mean_acceptance_length'], 2)}**"
             + (f" ({length[0]:.2f}–{length[1]:.2f})" if length else "")]
    if o.get("tokens_per_s"):
        parts.append(f"**{o['tokens_per_s']:.1f}** tokens/s over the requests' wall time")
    if o.get("speedup"):
        parts.append(f"measured speedup **{o['speedup']['measured']:.2f}×** over plain decoding "
                     f"(Leviathan predicts {o['speedup']['leviathan']:.2f}×; advisor's best K {o['best_k']})")
    return "This workload: " + " · ".join(parts)


def slower(group: dict) -> bool:
    """Whether a group measured a speedup below 1 (slower than plain decoding)."""
    return bool(group.get("speedup")) and group["speedup"]["measured"] < 1


def why_text(group: dict) -> str:
    """The stepper's explanation (app/figures/slower.py), from a group's pooled numbers."""
    return why_slower(SlowerRun.of_speedup(group["speedup"], group["mean_acceptance_length"]))


def headline_row(slot, stats: dict) -> None:
    """The headline into the page's first-result container, with a "Why?" beside a speedup below 1."""
    if not slower(stats["overall"]):
        slot.markdown(headline(stats))
        return
    text, why = slot.columns([0.9, 0.1], vertical_alignment="center")
    text.markdown(headline(stats))
    why.popover("Why?", width="stretch").markdown(why_text(stats["overall"]))


def speed_whys(stats: dict) -> None:
    """One "Why?" under a table for each of its speedups below 1, every group's reasons inside."""
    slow = {name: g for name, g in figs.groups(stats).items() if slower(g)}
    if slow:
        st.popover(f"Why? ({len(slow)} of the speedups in this table are below 1×)").markdown("\n\n".join(
            f"**{md(name)}** ({g['speedup']['measured']:.2f}×): {why_text(g)}" for name, g in slow.items()))


def sides(stats: dict, other: dict | None, labels: tuple[str, str]) -> list[tuple[dict, str]]:
    """(statistics, name) of the one workload, or of both; a second one's tables are headed by its name."""
    return [(stats, labels[0])] if other is None else [(stats, labels[0]), (other, labels[1])]


def named(label: str, other: dict | None) -> None:
    if other is not None:
        st.markdown(f"**{md(label)}**")


def categories_tab(stats: dict, other: dict | None, labels: tuple[str, str]) -> None:
    metric = st.radio("Measure", list(figs.METRICS), format_func=lambda m: figs.METRICS[m], horizontal=True,
                      key="wl_metric")
    chart(figs.category_figure(stats, metric, other, labels), key="wl_categories_chart")
    st.caption("Each interval resamples whole requests (a bootstrap): requests, not cycles, are the independent "
               "unit, so a category whose requests disagree gets a wide interval.")
    for s, label in sides(stats, other, labels):
        named(label, other)
        st.markdown(markdown_table(category_rows(s)))
        speed_whys(s)


def category_rows(stats: dict) -> list[dict]:
    rows = []
    for name, g in figs.groups(stats).items():
        iv = (g.get("intervals") or {}).get("acceptance_rate")
        rows.append({"category": name, "requests": g["requests"], "cycles": g["cycles"],
                     "accepted / drafted": f"{g['accepted_tokens']}/{g['draft_tokens']}",
                     "acceptance rate (95% interval)": fmt(g["acceptance_rate"])
                     + ("" if not iv else f" ({iv[0]:.3f}–{iv[1]:.3f})"),
                     "mean acceptance length": fmt(g["mean_acceptance_length"], 2),
                     "tokens/s": fmt(g.get("tokens_per_s"), 1),
                     "measured speedup": "–" if not g.get("speedup") else f"{g['speedup']['measured']:.2f}×",
                     "advisor's best K": "–" if g.get("best_k") is None else g["best_k"]})
    return rows


def positions_tab(stats: dict, other: dict | None, labels: tuple[str, str]) -> None:
    if other is None:
        names = sorted(stats["categories"])
        key = f"wl_lines_{zlib.crc32('|'.join(names).encode())}"  # a workload with other categories starts afresh
        shown = st.multiselect(f"Categories drawn (up to {len(figs.LINES)}, one colour each; all requests always)",
                               names, default=figs.default_lines(stats), max_selections=len(figs.LINES), key=key)
        chart(figs.conditional_figure(stats, shown), key="wl_conditional_chart")
        rows = {name: stats["categories"][name] for name in shown} | {figs.OVERALL: stats["overall"]}
    else:
        found = list(dict.fromkeys([*figs.groups(stats), *figs.groups(other)]))
        group = st.selectbox("Group", found, index=found.index(figs.OVERALL), key="wl_compare_group")
        chart(figs.conditional_figure(stats, [group], other, labels), key="wl_conditional_chart")
        rows = {f"{label} · {group}": figs.groups(s)[group] for s, label in sides(stats, other, labels)
                if group in figs.groups(s)}
    st.caption("Each cell: the rate (accepted / cycles that reached the position). A position a cycle did not "
               "draft (an adaptive drafter proposed fewer) is not counted: unobserved, not rejected.")
    st.markdown(markdown_table(figs.position_rows(rows)))
    chart(figs.histogram_figure(stats, other, labels), key="wl_histogram_chart")


def context_tab(stats: dict, other: dict | None, labels: tuple[str, str]) -> None:
    chart(figs.context_figure(stats, other, labels), key="wl_context_chart")
    for s, label in sides(stats, other, labels):
        named(label, other)
        st.markdown(markdown_table([
            {"context (tokens)": figs.bin_name(b), "requests": b["requests"], "cycles": b["cycles"],
             "accepted / drafted": f"{b['accepted_tokens']}/{b['draft_tokens']}",
             "acceptance rate": fmt(b["acceptance_rate"]), "mean acceptance length": fmt(b["mean_acceptance_length"], 2)}
            for b in s["context_length"]]))


def requests_tab(choice: tuple[str, str], stats: dict) -> None:
    """Every request, and a way to open any of its cycles in this session."""
    rows = stats["per_request"]
    st.markdown(markdown_table([
        {"request": workloads.link(r["id"], choice, r["file"]), "category": r["category"],
         "cycles": r["cycles"], "acceptance rate": fmt(r["acceptance_rate"]),
         "mean acceptance length": fmt(r["mean_acceptance_length"], 2), "tokens/s": fmt(r["tokens_per_s"], 1),
         "accepted per cycle": " ".join(map(str, r["accepted_per_cycle"]))} for r in rows], raw=("request",)))
    open_here(choice, rows)


def open_here(choice: tuple[str, str], rows: list[dict]) -> None:
    """Open a request at a cycle in this session (the links above open a new tab)."""
    by_id = {r["id"]: r for r in rows}
    cols = st.columns([3, 1, 2], vertical_alignment="bottom")
    rid = cols[0].selectbox("Request", list(by_id), key="wl_open_request",
                            format_func=lambda r: f"{r} ({by_id[r]['category']})")
    last = max(0, by_id[rid]["cycles"] - 1) if rid else 0
    # one key per request: a cycle kept from a longer request must not exceed this one's last
    cycle = cols[1].number_input("Cycle", 0, last, 0, key=f"wl_open_cycle_{list(by_id).index(rid) if rid else 0}")
    if cols[2].button("Open in the stepper", key="wl_open", icon=":material/play_circle:", disabled=rid is None):
        error = workloads.open_request(choice, by_id[rid]["file"], int(cycle), 1)
        if error:
            st.error(md(error), icon=":material/error:")
        else:
            st.switch_page(STEPPER, query_params=workloads.request_query(choice, by_id[rid]["file"], int(cycle)))


def batch_tab(choice: tuple[str, str]) -> None:
    """A batched workload's cycles as lanes (app/figures/batch.py), one row per lane, and each lane's
    request opened in the stepper at the cycle it ran there."""
    workload = workloads.load(choice)
    try:
        batch = workload.batch_trace()
    except TraceError as err:
        st.error(f"The batch trace could not be read: {md(str(err))}", icon=":material/error:")
        return
    if batch is None:
        st.info("This workload ran one request at a time. The bundled ones with \"batch-4\" in their name ran four "
                "at a time; run your own with `python -m engine run --prompts FILE --batch B --out FOLDER` and "
                "upload its zip to see its rows share each cycle.")
        return
    if not batch["cycles"]:
        st.info("The batch ran no cycle.")
        return
    ids = {e.index: e.id for e in workload.entries}
    cycle = st.slider("Batched cycle", 0, len(batch["cycles"]) - 1, 0, key="wl_batch_cycle")
    chart(batch_figs.lanes_figure(batch, cycle, ids), key="wl_batch_lanes")
    c = batch["cycles"][cycle]
    st.markdown(md(f"{batch['header']['rows']} rows, capacity {batch['header']['capacity']} positions per row. "
                   f"Idle rows this cycle: {c['idle_rows']} (each still costs its slot in every forward)."))
    files = {e.index: e.file for e in workload.entries}
    lines = []
    for r in c["rows"]:
        if r["idle"]:
            continue
        own_cycle = batch_figs.request_cycle(batch, cycle, r["request"])
        lines.append(f"- row {r['row']}: " + workloads.link(ids[r["request"]], choice, files[r["request"]], own_cycle)
                     + f" (its cycle {own_cycle})")
    st.markdown("\n".join(lines))
