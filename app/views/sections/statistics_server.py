"""The statistics page's "Your server" tab: a vLLM, SGLang or TensorRT-LLM server's metrics,
uploaded or pasted, explained beside the open trace.

Every number comes from engine/servers/ (the same code as `python -m engine metrics`). The
input is untrusted: it is size-checked before it is decoded, every reader error is one line,
and every text from it reaches the page through md() or markdown_table().
"""
import streamlit as st

from app.ui.pages import DIAGNOSE
from app.ui.safe import markdown_table, md
from engine.servers.explain import ServerReport, advice_words, calibrated_costs, comparison_rows, entered_costs, explain
from engine.servers.read import decode, read_texts
from engine.servers.server_metrics import MAX_INPUT_BYTES, ServerMetricsError, check_text_size, shown
from engine.stats.analysis import DEFINITIONS, TraceStats

PASTE, FILES = "server_paste", "server_files"  # widget keys
FROM_TRACE, ENTERED = "the open trace's calibration", "values I enter"
LOW_ACCEPTANCE = 0.5  # a server that accepts under half its draft tokens is pointed at the Diagnose page


def inputs() -> list[str]:
    """The uploaded files' text (one, or two scrapes) or else the pasted text; [] when none."""
    files = st.file_uploader("Metrics file(s): a /metrics scrape (two, for the time between), a get_metrics() "
                             "dump, a log, /server_info or TensorRT-LLM's /metrics JSON",
                             accept_multiple_files=True, key=FILES, max_upload_size=max(1, MAX_INPUT_BYTES // 2**20))
    pasted = st.text_area("…or paste it here", key=PASTE, height=150)
    if files:
        if len(files) > 2:
            raise ServerMetricsError("give one file, or two scrapes of one server")
        return [decode(f.getvalue(), f.name) for f in files]
    if pasted.strip():
        check_text_size(pasted, "the pasted text")
        return [pasted]
    return []


def cost_inputs(trace: TraceStats, k: int | None):
    """Costs entered by the user, or the open trace's calibration."""
    choices = ([FROM_TRACE] if trace.calibration is not None else []) + [ENTERED]
    pick = st.radio("c and the verify cost from", choices, horizontal=True, key="server_cost_source")
    if pick == FROM_TRACE and k:
        return calibrated_costs(trace.calibration, k)
    left, right = st.columns(2)
    c = left.number_input("c (draft step / target step)", min_value=0.001, max_value=10.0, value=0.1,
                          step=0.01, format="%.3f", key="server_c")
    v = right.number_input("verify pass over K+1 positions, in target steps", min_value=0.1, max_value=50.0,
                           value=1.0, step=0.1, key="server_verify")
    return entered_costs(c, v)


def draw(trace: TraceStats) -> None:
    st.caption(f"Reads vLLM, SGLang and TensorRT-LLM's speculative-decoding metrics (at most "
               f"{MAX_INPUT_BYTES // 2**20} MiB) and puts them in this project's terms, beside the open trace.")
    try:
        texts = inputs()
        if not texts:
            st.info("Upload or paste a server's metrics to see them explained.")
            return
        record = read_texts(texts)
    except ServerMetricsError as err:
        st.error(md(str(err)), icon=":material/error:")
        return
    k = record.k
    if k is None:
        k = int(st.number_input("K (this input does not say)", min_value=1, max_value=64, value=4, key="server_k"))
    report = explain(record, k, cost_inputs(trace, k))
    show(report, trace)


def show(r: ServerReport, trace: TraceStats) -> None:
    m = r.metrics
    st.markdown(f"**{md(m.source)}** · method {md(m.method or 'not in the input')} · K = {r.k}")
    cols = st.columns(3)
    cols[0].metric("Draft acceptance rate", shown(r.acceptance_rate))
    cols[0].caption(DEFINITIONS["acceptance_rate"])
    cols[1].metric("Mean acceptance length", shown(r.mean_acceptance_length))
    cols[1].caption(DEFINITIONS["mean_acceptance_length"])
    cols[2].metric("alpha (server)", shown(r.alpha))
    cols[2].caption(md(r.alpha_how))
    if r.nothing_drafted:
        st.markdown(f"**Per-position acceptance**: {shown(r.per_position)}")
    elif r.per_position:
        st.markdown("**Per-position acceptance**: " + " · ".join(
            f"{i}: {p:.3f}" for i, p in enumerate(r.per_position, start=1)))
    if not r.nothing_drafted and r.expected_tokens is not None and r.mean_acceptance_length is not None:
        st.markdown(f"Tokens per cycle: the geometric model predicts **{r.expected_tokens:.3f}**, "
                    f"the server saw **{r.mean_acceptance_length:.3f}**.")
    if r.leviathan is not None:
        st.markdown(f"Predicted speedup: Leviathan et al. **{r.leviathan:.2f}×**, refined **{r.refined:.2f}×** "
                    f"({md(r.costs.source)}).")
        st.markdown(md(advice_words(r) or ""))
    if not r.nothing_drafted and r.acceptance_rate is not None and r.acceptance_rate < LOW_ACCEPTANCE:
        st.markdown(f"**Low acceptance**: this server accepts {r.acceptance_rate:.3f} of its draft tokens, under "
                    f"{LOW_ACCEPTANCE:g}. A mis-set draft (another chat rendering, top-k/top-p ignored, K far too "
                    "deep) or a pair that simply disagrees can cause it; paired runs that each change one "
                    "thing tell them apart.")
        st.page_link(DIAGNOSE, label="Why is acceptance low? Diagnose a pair by experiment",
                     icon=":material/troubleshoot:")
    st.markdown("**What limits this server**")
    for text in r.limits:
        st.markdown("- " + md(text))
    for note in [*m.notes, *r.derived]:
        st.caption(md(note))
    st.markdown("**Beside the open trace**")
    st.markdown(markdown_table(comparison_rows(r, trace)))
