"""The statistics page's Batch size tab: goodput against batch size, where speculation stops paying (the
crossover), the K advisor's choice per batch size, and acceptance against B beside the speedup against B.
From the shipped benchmarks (app/runs/batch_bench.py), or from a sweep measured now on the open trace's
pair (engine/stats/batch_sweep.py, in a background job). Figures: app/figures/batch_goodput.py.
"""
import streamlit as st

from app.figures.batch_goodput import acceptance_speedup_figure, advisor_rows, goodput_figure
from app.runs.batch_bench import shipped_sweeps
from app.ui import jobs
from app.ui.safe import md
from app.ui.widgets import chart
from app.views.sections.statistics_speed import trace_pair
from app.views.sections.statistics_widgets import start_at
from engine.config import SettingsError, SpecSettings
from engine.models.machine import cpu_model
from engine.stats.batch_results import BatchSweep, crossover_words
from engine.trace import Trace

BATCH_SWEEPS = "batch_sweeps"  # session_state: {trace key: (machine, BatchSweep) measured now}
NOW = "measured now on this server"
SHOW_NOW = "batch_show_now"  # session_state: a sweep just finished, so the next run opens it
LIVE_BATCHES, LIVE_KS = [1, 2, 4, 8, 16], [1, 2, 3, 4, 5, 6]
LIVE_MAX_REQUESTS = 32
WIDGETS = ("batch_choice", "batch_sizes", "batch_ks", "batch_requests", "batch_max_new")  # kept across tabs


def draw(trace: Trace, key: str) -> None:
    st.write("Serving engines speculate over a batch of requests. Each cycle verifies B × (K+1) positions in one "
             "target forward: nearly free at B = 1, where a step is bound by reading the weights, and more and more "
             "like K+1 plain steps as the batch makes the forward compute-bound. Acceptance does not move with B, "
             "so it cannot say when to stop speculating; goodput (committed tokens per second over all rows) can.")
    choices = sweep_choices(trace, key)
    if choices:
        labels = list(choices)
        start_at("batch_choice", labels[0])
        if st.session_state.pop(SHOW_NOW, False) or st.session_state["batch_choice"] not in choices:
            st.session_state["batch_choice"] = labels[0]  # a sweep just measured, or the chosen file went
        chosen = st.selectbox("Sweep", labels, key="batch_choice")
        machine, sweep = choices[chosen]
        show_sweep(sweep, machine)
    else:
        st.info("No batch benchmark is shipped with this copy. Run `python -m bench.batch`, or measure below.")
    for why in shipped_sweeps().skipped:
        st.caption(f"Left out: {md(why)}")
    st.divider()
    measure_section(trace, key)


def sweep_choices(trace: Trace, key: str) -> dict[str, tuple[str, BatchSweep]]:
    """The sweep measured now (if any), then the shipped ones, the open trace's preset first."""
    choices = {}
    live = st.session_state.get(BATCH_SWEEPS, {}).get(key)
    if live is not None:
        choices[f"{live[1].preset}: {NOW}"] = live
    preset = trace.header.get("preset")
    shipped = sorted(shipped_sweeps().sweeps, key=lambda s: (s.sweep.preset != preset, -s.sweep.requests, s.file))
    for s in shipped:
        choices[s.label] = (s.machine, s.sweep)
    return choices


def show_sweep(sweep: BatchSweep, machine: str) -> None:
    sizes = [s.batch for s in sweep.sizes]
    st.markdown(f"**{md(sweep.preset)}** on {md(machine)}: {md(crossover_words(sweep))} "
                f"(B = {', '.join(map(str, sizes))}; alpha {sweep.alpha:.3f} at B = 1).")
    chart(goodput_figure(sweep), key="fig_batch_goodput")
    st.caption("Goodput counts decoding only: every request's prompt is read once, alone, before either method "
               "starts, at the same cost for both. Each batch size runs the same requests in batches of B, greedy, "
               "so every method commits the same tokens. The star is the advisor's choice: the K whose predicted "
               "goodput, from this machine's forwards timed at B, is highest, or plain decoding.")
    chart(acceptance_speedup_figure(sweep), key="fig_batch_accept")
    st.dataframe(advisor_rows(sweep), hide_index=True, height="content", key="batch_table")
    st.caption("Tokens/s over all rows, decoding only. **gain**: the best K over plain batched decoding. **idle "
               "rows**: row slots of the best K's cycles spent on rows that had finished (a static batch runs until "
               "its slowest row is done). **predicted**: the cost model's goodput for the advisor's choice, from "
               "this machine's forwards timed at B and each request's acceptance. One run per batch size: treat "
               "differences of a few percent as noise. vLLM #26504 saw the same shape on a GPU: acceptance "
               "0.86–0.91 from batch 1 to 32 while speculation went from +23% to −16%.")


# ---------------------------------------------------------------- a sweep measured now

def measure_section(trace: Trace, key: str) -> None:
    st.markdown("**Measure on this server now** (the open trace's pair, the bundled prompt set, greedy). "
                "A batch size of B runs the requests B at a time: plain batched decoding, then each K.")
    start_at("batch_sizes", [1, 2, 4])
    start_at("batch_ks", [1, 2, 4])
    start_at("batch_requests", 8)
    start_at("batch_max_new", 16)
    cols = st.columns([2, 2, 1, 1])
    batches = cols[0].multiselect("Batch sizes", LIVE_BATCHES, key="batch_sizes")
    ks = cols[1].multiselect("K values", LIVE_KS, key="batch_ks")
    requests = cols[2].number_input("Requests", 1, LIVE_MAX_REQUESTS, key="batch_requests")
    max_new = cols[3].number_input("New tokens", 1, 128, key="batch_max_new")
    if st.button("Run the batch sweep", key="batch_run", type="primary", disabled=not (batches and ks)):
        start_batch_sweep(trace, key, sorted(batches), sorted(ks), int(requests), int(max_new))
    jobs.show(f"batch:{key}")


def start_batch_sweep(trace: Trace, key: str, batches: list[int], ks: list[int], requests: int, max_new: int) -> None:
    pair = trace_pair(trace.header)  # never a model the trace names: its preset, or the operator's pair
    if pair is None:
        return
    from engine.workload.run import bundled_prompt_ids  # torch; loaded when a sweep starts

    try:
        prompts = bundled_prompt_ids(pair, requests, SpecSettings(k=max(ks), max_new_tokens=max_new))
    except SettingsError as err:  # a request too long for this pair (PromptFileError)
        st.error(md(str(err)))
        return
    preset = str(trace.header.get("preset") or "this server's pair")
    jobs.start(f"batch:{key}", f"batch sweep over B = {', '.join(map(str, batches))}",
               lambda report: run_sweep(pair, prompts, batches, ks, max_new, preset, report),
               lambda result: keep_sweep(key, result), alone=True, kind="batch-sweep")


def keep_sweep(key: str, result: tuple[str, BatchSweep]) -> None:
    """Store the sweep and show it first on the next run (the selectbox is drawn by then; it cannot change now)."""
    st.session_state.setdefault(BATCH_SWEEPS, {})[key] = result
    st.session_state[SHOW_NOW] = True


def run_sweep(pair, prompts, batches, ks, max_new, preset, report) -> tuple[str, BatchSweep]:
    from engine.stats.batch_sweep import batch_sweep

    machine = cpu_model()
    return machine, batch_sweep(pair, prompts, batches, ks, max_new, preset, machine, on_progress=report)
