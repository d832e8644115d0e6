"""The Workload page's "Where the loss is" tab: the requests furthest below the median, the cycles
that lost the most draft tokens, and the rejected draft tokens by text and by class.

At temperature 0 each model puts all its probability on its own choice, so every rejection reads
p_draft 1 and p_target 0: the tab shows the token the target chose beside each rejected one instead
of those probabilities (and no p_target-against-p_draft scatter, which would be one dot).

Numbers: engine/workload/loss.py. Token texts show as the stepper shows them (app/figures/derive.py
visible_text: · a space, ↵ a newline), escaped by app/ui/safe.py. Every cycle links into the stepper.
"""
import streamlit as st

from app.figures import workload as figs
from app.figures.derive import visible_text
from app.figures.workload import fmt
from app.ui import workloads
from app.ui.safe import markdown_table
from app.ui.widgets import chart

TEST_STAGE = 3  # the stepper's stage that shows the acceptance test of each position
VISIBLE = "A token's spaces show as · and its line breaks as ↵, as in the stepper."
ONE_HOT = ("Temperature 0: each model puts all its probability on its own choice, so every rejected token has "
           "p_draft 1 and p_target 0. What tells the cycles apart is the token the target chose instead.")


def token(text: str | None) -> str:
    return "–" if text is None else visible_text(text)


def loss_tab(choice: tuple[str, str], stats: dict) -> None:
    loss = stats["loss"]
    greedy = loss["rejected_tokens"]["greedy"]
    worst_requests(choice, loss["worst_requests"], stats["median_acceptance_rate"])
    worst_cycles(choice, loss["worst_cycles"], greedy)
    rejected_section(choice, loss["rejected_tokens"], stats)


def worst_requests(choice: tuple[str, str], rows: list[dict], median: float | None) -> None:
    st.subheader("Requests furthest below the median")
    st.caption(f"The median request's acceptance rate is {fmt(median)}; \"rate − median\" is each request's "
               "rate minus it (negative: below the median).")
    st.markdown(markdown_table([
        {"request": workloads.link(r["id"], choice, r["file"]), "category": r["category"],
         "acceptance rate": fmt(r["acceptance_rate"]),
         "rate − median": "–" if r["below_median"] is None else f"{-r['below_median']:+.3f}",
         "cycles": r["cycles"]} for r in rows], raw=("request",)))


def worst_cycles(choice: tuple[str, str], rows: list[dict], greedy: bool) -> None:
    st.subheader("Cycles that lost the most draft tokens")
    st.caption(ONE_HOT + " " + VISIBLE if greedy else VISIBLE)
    table = []
    for c in rows:
        row = {"cycle": workloads.link(f"{c['request']} · cycle {c['cycle']}", choice, c["file"], c["cycle"],
                                       TEST_STAGE),
               "lost / drafted": f"{c['lost']}/{c['drafted']}", "rejected draft token": token(c["text"])}
        if greedy:
            row["the target's token"] = token(c["target_text"])
        else:
            row |= {"p_draft": fmt(c["p_draft"]), "p_target": fmt(c["p_target"])}
        table.append(row | {"context": c["committed_len_before"]})
    st.markdown(markdown_table(table, raw=("cycle",)))


def where(choice: tuple[str, str], examples: list[dict]) -> str:
    return " ".join(workloads.link(f"{e['request']}·{e['cycle']}", choice, e["file"], e["cycle"], TEST_STAGE)
                    for e in examples)


def rejected_section(choice: tuple[str, str], rejected: dict, stats: dict) -> None:
    st.subheader(f"Rejected draft tokens ({rejected['rejections']})")
    if not rejected["rejections"]:
        st.info("No draft token was rejected (or every request drafted trees, whose nodes are not tested one by one).")
        return
    st.markdown(markdown_table([
        {"token": token(t["text"]), "class": t["class"], "rejected": t["count"], "where": where(choice, t["examples"])}
        for t in rejected["top_tokens"]], raw=("where",)))
    st.markdown(markdown_table([{"token class": name, "rejected": c["rejected"], "tested": c["tested"],
                                 "rejected / tested": fmt(c["rate"])} for name, c in rejected["classes"].items()]))
    if rejected["greedy"]:
        st.subheader("The draft's token against the target's")
        st.caption("Each rejected draft token beside the token the target committed in its place, most frequent "
                   "first (at temperature 0 a p_target-against-p_draft chart would be one dot at (1, 0)).")
        st.markdown(markdown_table([
            {"rejected draft token": token(t["text"]), "the target's token": token(t["target_text"]),
             "times": t["count"], "where": where(choice, t["examples"])} for t in rejected["top_pairs"]],
            raw=("where",)))
    else:
        chart(figs.rejection_figure(stats), key="wl_rejection_chart")
