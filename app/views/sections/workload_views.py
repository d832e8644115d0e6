"""The Workload page's views of one workload (and of a second one beside it): categories with their
intervals, positions and cycles, context length, where the loss is, and every request.

Numbers: engine/workload/stats.py (the same as `python -m engine stats FOLDER --json`); figures:
app/figures/workload.py. Every request, cycle and rejected token links into the stepper.
"""
import streamlit as st

from app.figures import batch as batch_figs
from app.figures import workload as figs
from app.figures.workload import fmt
from app.ui import workloads
from app.ui.pages import STEPPER
from app.ui.safe import markdown_table, md
from app.ui.widgets import chart
from engine.trace import TraceError

TEST_STAGE = 3  # the stepper's stage that shows the acceptance test of each position


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


def categories_tab(stats: dict, other: dict | None, labels: tuple[str, str]) -> None:
    metric = st.radio("Measure", list(figs.METRICS), format_func=lambda m: figs.METRICS[m], horizontal=True,
                      key="wl_metric")
    chart(figs.category_figure(stats, metric, other, labels), key="wl_categories_chart")
    st.caption("Each interval resamples whole requests (a bootstrap): requests, not cycles, are the independent "
               "unit, so a category whose requests disagree gets a wide interval.")
    st.markdown(markdown_table(category_rows(stats)))


def category_rows(stats: dict) -> list[dict]:
    rows = []
    for name, g in figs.groups(stats).items():
        iv = g.get("intervals") or {}
        rows.append({"category": name, "requests": g["requests"], "cycles": g["cycles"],
                     "drafted": g["draft_tokens"], "accepted": g["accepted_tokens"],
                     "acceptance rate": fmt(g["acceptance_rate"]),
                     "95% interval": "–" if not iv.get("acceptance_rate") else
                     f"{iv['acceptance_rate'][0]:.3f}–{iv['acceptance_rate'][1]:.3f}",
                     "mean acceptance length": fmt(g["mean_acceptance_length"], 2),
                     "tokens/s": fmt(g.get("tokens_per_s"), 1),
                     "measured speedup": "–" if not g.get("speedup") else f"{g['speedup']['measured']:.2f}×",
                     "advisor's best K": "–" if g.get("best_k") is None else g["best_k"]})
    return rows


def positions_tab(stats: dict, other: dict | None, labels: tuple[str, str]) -> None:
    chart(figs.conditional_figure(stats), key="wl_conditional_chart")
    st.caption("A position a cycle did not draft (an adaptive drafter proposed fewer) is not counted: unobserved, "
               "not rejected.")
    chart(figs.histogram_figure(stats, other, labels), key="wl_histogram_chart")


def context_tab(stats: dict, other: dict | None, labels: tuple[str, str]) -> None:
    chart(figs.context_figure(stats, other, labels), key="wl_context_chart")
    st.markdown(markdown_table([{"context (tokens)": figs.bin_name(b), "requests": b["requests"], "cycles": b["cycles"],
                                 "acceptance rate": fmt(b["acceptance_rate"]),
                                 "mean acceptance length": fmt(b["mean_acceptance_length"], 2)}
                                for b in stats["context_length"]]))


def loss_tab(choice: tuple[str, str], stats: dict) -> None:
    loss = stats["loss"]
    st.subheader("Requests furthest below the median")
    st.markdown(markdown_table([
        {"request": workloads.link(r["id"], choice, r["file"]), "category": r["category"],
         "acceptance rate": fmt(r["acceptance_rate"]), "below the median": f"{r['below_median']:+.3f}",
         "cycles": r["cycles"]} for r in loss["worst_requests"]], raw=("request",)))
    st.subheader("Cycles that lost the most draft tokens")
    st.markdown(markdown_table([
        {"cycle": workloads.link(f"{c['request']} · cycle {c['cycle']}", choice, c["file"], c["cycle"], TEST_STAGE),
         "lost / drafted": f"{c['lost']}/{c['drafted']}", "rejected token": c["text"] or "–",
         "p_draft": fmt(c["p_draft"]), "p_target": fmt(c["p_target"]), "context": c["committed_len_before"]}
        for c in loss["worst_cycles"]], raw=("cycle",)))
    rejected_section(choice, loss["rejected_tokens"], stats)


def rejected_section(choice: tuple[str, str], rejected: dict, stats: dict) -> None:
    st.subheader(f"Rejected draft tokens ({rejected['rejections']})")
    if not rejected["rejections"]:
        st.info("No draft token was rejected (or every request drafted trees, whose nodes are not tested one by one).")
        return
    st.markdown(markdown_table([
        {"token": t["text"], "class": t["class"], "rejected": t["count"],
         "where": " ".join(workloads.link(f"{e['request']}·{e['cycle']}", choice, e["file"], e["cycle"], TEST_STAGE)
                           for e in t["examples"])} for t in rejected["top_tokens"]], raw=("where",)))
    st.markdown(markdown_table([{"token class": name, "rejected": c["rejected"], "tested": c["tested"],
                                 "rejected / tested": fmt(c["rate"])} for name, c in rejected["classes"].items()]))
    chart(figs.rejection_figure(stats), key="wl_rejection_chart")


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
    rid = cols[0].selectbox("Request", list(by_id), key="wl_open_request")
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
