"""Step through a trace: one cycle at a time, each cycle in five stages."""
import time

import streamlit as st

from app.figures import derive
from app.figures import layouts as figures_layouts
from app.figures.acceptance import (
    STEPPER_COLUMNS,
    STEPPER_GREEDY_COLUMNS,
    TEST_TABLE_WIDTHS,
    acceptance_figure,
    position_rows,
    resample_figure,
)
from app.figures.caches import cache_figure
from app.figures.cycle import cycle_figure, text_figure
from app.figures.explain import STAGES, stage_caption
from app.figures.overview import cycle_time_figure, overview_figure
from app.figures.slower import SlowerRun, why_slower
from app.figures.style import STAGE_CHART_KEY, STYLES
from app.figures.tree import TREE_CHART_KEYS, root_text, stage_figures, stage_order
from app.figures.tree_captions import tree_stage_caption, tree_summary, tried_rows
from app.figures.tree_record import is_tree_header, tree_words
from app.ui import state
from app.ui.first_result import first_result
from app.ui.names import model_label, models_help
from app.ui.pages import TRACE_SOURCE
from app.ui.safe import markdown_table, md
from app.ui.widgets import chart, plot, shared_chart, shared_figures
from app.views.sections import stepper_drafter
from engine.stats.analysis import TraceStats
from engine.stats.quiet import loud_cycles, median_cycle_s, quiet_words
from engine.trace import Trace
from engine.trace.layout_checks import layout_of
from engine.trace.schema import DRAFT_MODEL

SPEEDS = {"2 s/step": 2.0, "1 s/step": 1.0, "0.4 s/step": 0.4}


# ---------------------------------------------------------------- per-trace data (cached)

def slower_note(stats: TraceStats) -> str:
    """Said up front, in one line, when the open trace ran slower than plain decoding would have."""
    r = stats.speed
    return (f"This run was **slower** than plain decoding: {r.measured:.2f}× its speed (middle half "
            f"{r.measured_spread.low:.2f}–{r.measured_spread.high:.2f}×).")


def slower_why(stats: TraceStats) -> str:
    """Why the open trace ran slower (behind the note's "Why?", so the stage's chart stays on screen)."""
    run = SlowerRun.of_report(stats.speed, stats.acceptance["mean_acceptance_length"])
    return (f"It is still a correct run to step through. {why_slower(run)} **Statistics and speed** shows which K "
            f"would pay off, and the example traces include faster pairs.")


@st.cache_data(max_entries=state.DERIVED_KEPT, ttl=state.CACHE_TTL_S, show_spinner=False)
def derived(key: str, _trace: Trace) -> tuple[list[derive.TokenInfo], list[int], derive.Overview]:
    """Token table, token counts per cycle and the overview grid; computed once per trace."""
    return derive.token_table(_trace), derive.tokens_through(_trace), derive.overview(_trace)


# ---------------------------------------------------------------- moving (callbacks run before the script)

def move(delta: int) -> None:
    cycle, stage = state.step()
    state.set_step(cycle + delta, stage)


def jump(cycle: int) -> None:
    state.set_step(cycle, state.step()[1])


def step_stage(delta: int) -> None:
    """One stage forward or back, crossing into the next or previous cycle."""
    cycle, stage = state.step()
    stage += delta
    if stage > 5:
        cycle, stage = cycle + 1, 1
    elif stage < 1:
        cycle, stage = cycle - 1, 5
    if 0 <= cycle < len(state.current_trace().cycles):
        state.set_step(cycle, stage)


def at_end() -> bool:
    cycle, stage = state.step()
    return cycle >= len(state.current_trace().cycles) - 1 and (stage == 5 or st.session_state.get("play_by") == "cycles")


def from_widget(widget_key: str, target: str) -> None:
    cycle, stage = state.step()
    value = st.session_state[widget_key]
    state.set_step(value if target == "cycle" else cycle, value if target == "stage" else stage)


def from_overview() -> None:
    """A click on the all-cycles grid selects a marker; jump to its cycle."""
    points = st.session_state["overview"].selection.points
    if points:
        jump(int(points[0]["x"]))


# ---------------------------------------------------------------- controls

def nav_buttons(cycle: int, last: int) -> list:
    """First / previous / next / last and the cycle slider. Left/Right are Streamlit's own
    button shortcuts (st.button(shortcut=...)): they ignore keys typed into inputs, and a
    focused slider keeps its arrow keys."""
    cols = st.columns([1.15, 1.5, 1.15, 1.1, 2.9, 1.05, 1.4], vertical_alignment="center")
    cols[0].button("« First", key="nav_first", on_click=jump, args=(0,), disabled=cycle == 0, width="stretch")
    cols[1].button("‹ Previous", key="nav_prev", on_click=move, args=(-1,), disabled=cycle == 0,
                   shortcut="Left", help="Previous cycle (← key)", width="stretch")
    cols[2].button("Next ›", key="nav_next", on_click=move, args=(1,), disabled=cycle == last,
                   shortcut="Right", help="Next cycle (→ key)", width="stretch")
    cols[3].button("Last »", key="nav_last", on_click=jump, args=(last,), disabled=cycle == last, width="stretch")
    if last > 0:
        st.session_state["cycle_slider"] = cycle
        cols[4].slider("Cycle", 0, last, key="cycle_slider", on_change=from_widget, args=("cycle_slider", "cycle"),
                       label_visibility="collapsed")
    return cols[5:]  # where the play toggle and its speed go: one row fewer on a projector


def stage_controls(stage: int):
    """The stage buttons; returns the column beside them, where the play controls go."""
    cols = st.columns([1.1, 5.8, 1.1, 2.2], vertical_alignment="center")
    cols[0].button("◁ Stage", key="stage_prev", on_click=step_stage, args=(-1,), width="stretch",
                   help="Previous stage (into the previous cycle from stage 1)")
    st.session_state["stage_select"] = stage
    cols[1].segmented_control("Stage", list(STAGES), format_func=STAGES.get, key="stage_select", required=True,
                              on_change=from_widget, args=("stage_select", "stage"), label_visibility="collapsed")
    cols[2].button("Stage ▷", key="stage_next", on_click=step_stage, args=(1,), width="stretch",
                   help="Next stage (into the next cycle after stage 5)")
    return cols[3]


def play_controls(cols: list) -> float | None:
    """Play/pause, speed and what a step is, in three columns of the control rows; returns seconds
    per step while playing."""
    if st.session_state.pop("_play_reached_end", False):
        st.session_state["playing"] = False  # set before the toggle exists in this run, as Streamlit requires
    playing = cols[0].toggle("Play", key="playing")
    speed = cols[1].selectbox("Speed", list(SPEEDS), index=1, key="play_speed", label_visibility="collapsed",
                              help="Time per step while playing. The address bar always links to this trace, "
                                   "cycle and stage: copy it to share this view.")
    cols[2].radio("Play by", ["stages", "cycles"], key="play_by", horizontal=True, label_visibility="collapsed")
    return SPEEDS[speed] if playing else None


def play_ticker(seconds: float) -> None:
    """While playing, a fragment reruns every `seconds` and advances one step."""
    st.session_state["_tick_from_full_run"] = True

    @st.fragment(run_every=seconds)
    def tick() -> None:
        if st.session_state.pop("_tick_from_full_run", False):
            return  # the full run that drew the page: wait for the timer
        # A timer tick that arrived while the page was still being drawn runs right after it: without this,
        # that step showed for a blink (seen: stage 2 for 0.15 s at 1 s/step) and the page skipped ahead
        if time.monotonic() - st.session_state.get("_stepped_at", 0.0) < seconds / 2:
            return
        st.session_state["_stepped_at"] = time.monotonic()
        if at_end():
            st.session_state["_play_reached_end"] = True
        elif st.session_state.get("play_by") == "cycles":
            move(1)
        else:
            step_stage(1)
        st.rerun()

    tick()


# ---------------------------------------------------------------- the view

COMPACT = """<style>
[data-testid="stMainBlockContainer"] { padding-top: 4rem; }  /* just under the toolbar (3.75rem) */
[data-testid="stMainBlockContainer"] h1 { font-size: 1.9rem; padding: 0 0 0.2rem 0; }
[data-testid="stMainBlockContainer"] h3 { font-size: 1.3rem; padding: 0.2rem 0 0 0; }
</style>"""  # a projector (1366x768) shows the stage's chart under the controls without scrolling


def rank_layout_words(tp: dict) -> str:
    """Where a tensor-parallel run's ranks ran, host by host (a host with many ranks in one range)."""
    hosts: dict[str, list[dict]] = {}
    for r in tp["ranks"]:
        hosts.setdefault(r["host"], []).append(r)

    def on_host(ranks: list[dict]) -> str:
        if len(ranks) <= 4:
            return ", ".join(f"rank {r['rank']} {r['device']}" for r in ranks)
        return f"ranks {ranks[0]['rank']}–{ranks[-1]['rank']} on {ranks[0]['device']} … {ranks[-1]['device']}"
    places = "; ".join(f"{host}: {on_host(ranks)}" for host, ranks in hosts.items())
    return (f"Target sharded over {tp['tp_size']} ranks by tensor parallelism ({tp['backend']}), "
            f"drafter on rank {tp.get('drafter_rank', 0)} · {places}")


def header(trace: Trace) -> None:
    h = trace.header
    s = h["settings"]
    st.html(COMPACT)
    st.title("Speculative decoding, one cycle at a time")
    done = "" if trace.complete else " · incomplete run (no summary)"
    drafter = trace.drafter_kind
    via = "" if drafter == DRAFT_MODEL else f" ({md(drafter)})"
    tree = is_tree_header(h)
    shape = md(tree_words(s['tree'])) if tree else f"K={s['k']}"
    st.caption(f"Target **{md(model_label(h, 'target').label)}** · draft **{md(model_label(h, 'draft').label)}**{via} · "
               f"{shape} · temperature {s['temperature']} · top-k {s['top_k']} · top-p {s['top_p']} · seed {s['seed']} · "
               f"{len(trace.cycles)} cycles{done}", help=md(models_help(h)))
    if h.get("tensor_parallel"):
        st.caption(md(rank_layout_words(h["tensor_parallel"])))
    loud = quiet_words(trace)  # a busy recording machine: its speed is not the method's
    stats = None if tree else state.current_stats()  # engine/stats reads a chain's per-position fields
    speed = stats.speed if stats is not None and trace.cycles else None
    if loud is not None:
        st.warning(f"**Timings not trustworthy.** {loud} Step through it for the tokens and the caches; take "
                   "speeds from a quiet trace.", icon=":material/timer_off:")
    elif speed is not None and speed.measured < 1:
        note, why = st.columns([0.88, 0.12], vertical_alignment="center")
        note.warning(slower_note(stats), icon=":material/trending_down:")
        why.popover("Why?", width="stretch").markdown(slower_why(stats))


# Widths that fit every header and value in the right column at 1366x768 (app/figures/acceptance.py says how).
TABLE_COLUMNS = {name: (st.column_config.NumberColumn if name == "pos" else st.column_config.TextColumn)(name, width=width)
                 for name, width in TEST_TABLE_WIDTHS.items()}


def token_strip(c: dict, k: int, stage: int) -> str:
    """The cycle's draft tokens as one line of escaped Markdown, revealed stage by stage like the cycle figure:
    p_draft, then p_target (stage 2), the test's marks (stage 3), what is committed (stage 4).
    It needs no chart code, so it shows as soon as the page does (app/ui/first_result.py)."""
    outcomes = derive.position_outcomes(c, k)
    cells = []
    for i in range(k):
        numbers = f"p_draft {derive.prob_text(c['p_draft'][i])}" + (
            f", p_target {derive.prob_text(c['p_target'][i])}" if stage >= 2 else "")
        mark = f" {STYLES[outcomes[i]].mark}" if stage >= 3 else ""
        cells.append(f"{i + 1} **{md(derive.visible_text(c['draft_token_texts'][i]))}**{mark} ({numbers})")
    line = (f"**Drafted** ({derive.whitespace_legend()}): "
            + (" · ".join(cells) if cells else "nothing (no proposal this cycle)"))
    if stage >= 4:  # the trace's committed texts: the accepted drafts, then the resampled or bonus token
        *kept, last = [f"**{md(derive.visible_text(t))}**" for t in c["committed_token_texts"]]
        bonus = c["bonus_token_id"] is not None
        mark = STYLES[derive.BONUS if bonus else derive.RESAMPLED].mark
        how = "bonus" if bonus else f"at position {c['rejected_position']}"
        line += f" → **committed ({len(c['committed_token_texts'])}):** " + " ".join(kept + [f"{mark} {last} ({how})"])
    return line


def step_heading(cycle: int, stage: int) -> None:
    """The step's heading, and the address bar set to the same step in the same moment: written before
    the page's controls, the URL ran a step ahead of the heading while the rest of the page was drawn,
    and a reader comparing the two while playing saw them disagree."""
    st.subheader(f"Cycle {cycle} · stage {STAGES[stage]}")
    state.write_url()


def stage_chart(trace: Trace, c: dict, k: int, stage: int, greedy: bool):
    """The figure a stage is about: the draft (1), the test's probabilities (2, 3), the resample or
    bonus (4), the caches after the rollback (5)."""
    if stage == 1:
        return cycle_figure(c, k, stage, greedy)
    if stage <= 3:
        return acceptance_figure(c, k, stage, greedy)
    if stage == 4:
        return resample_figure(c, k)
    return cache_figure(c, stage, derive.sequence_texts(trace, c), trace.drafter_kind, derive.own_prompt(trace))


def cycle_view(trace: Trace, cycle: int, stage: int) -> None:
    """The stage's explanation and its chart first, side by side where the chart is narrow enough,
    so that both fit under the controls at 1366x768; the cycle as a whole and the rest below."""
    trace_key = state.current_key()  # each figure is built once per trace, step and theme, for every session
    tokens, ends, _ = derived(trace_key, trace)
    c = trace.cycles[cycle]
    k = derive.proposals(c)  # K for a draft model; prompt lookup may propose fewer
    greedy = trace.header["settings"]["temperature"] == 0
    step_heading(cycle, stage)
    first_result().caption(token_strip(c, k, stage))  # caption-sized: it leaves the stage's chart on screen
    words = md(stage_caption(c, k, stage, trace.header.get("faults"), greedy, trace.drafter_kind, derive.own_prompt(trace),
                             trace.is_vllm_capture, trace.header.get("drafter")))
    if stage in (1, 5):  # the cycle figure and the caches need the page's width
        st.info(words, icon=":material/lightbulb:")
        shared_chart((trace_key, "stage", cycle, stage), lambda: stage_chart(trace, c, k, stage, greedy),
                     key=STAGE_CHART_KEY)
    else:
        explain, shown = st.columns([0.4, 0.6])
        explain.info(words, icon=":material/lightbulb:")
        with shown:
            shared_chart((trace_key, "stage", cycle, stage), lambda: stage_chart(trace, c, k, stage, greedy),
                         key=STAGE_CHART_KEY)
    if stage == 1:  # prompt lookup / other tokenizer / EAGLE head: where the proposal came from
        stepper_drafter.show_provenance([t.text for t in tokens[: c["committed_len_before"]]], c, trace.drafter_kind)
    else:
        shared_chart((trace_key, "cycle", cycle, stage), lambda: cycle_figure(c, k, stage, greedy))
    if stage == 3:  # the test table: every header and value fits its column
        st.caption("The test, position by position (the target's argmax, compared with each draft token):"
                   if greedy else "The test, position by position (u is drawn only up to the first rejection):")
        table_col, _ = st.columns([1.16, 0.84])
        table_col.dataframe(position_rows(c, k, STEPPER_GREEDY_COLUMNS if greedy else STEPPER_COLUMNS), hide_index=True,
                            column_config=TABLE_COLUMNS, key="test_table")
    if stage >= 4:  # the test that led to the resample or bonus
        left, _ = st.columns([0.6, 0.4])
        with left:
            shared_chart((trace_key, "test", cycle, stage), lambda: acceptance_figure(c, k, stage, greedy))
    if stage != 5:
        shared_chart((trace_key, "caches", cycle, stage),
                     lambda: cache_figure(c, stage, derive.sequence_texts(trace, c), trace.drafter_kind,
                                          derive.own_prompt(trace)))
    shared_chart((trace_key, "cycle_time", cycle), lambda: cycle_time_figure(
        c, median_cycle_s(trace), c["cycle"] in loud_cycles(trace)), key="cycle_time")
    if stage in (2, 5):  # the verify appends to the target's cache, the rollback trims it: in the trace's layout
        for i, fig in enumerate(shared_figures((trace_key, "layouts", cycle, stage), lambda: figures_layouts.layout_figures(
                trace.header, c, stage, derive.sequence_texts(trace, c)))):
            chart(fig, key=f"layout_{i}")
    shown_until = ends[cycle] if stage >= 4 else c["committed_len_before"]
    shared_chart((trace_key, "text", cycle, stage >= 4),
                 lambda: text_figure(tokens[:shown_until], cycle if stage >= 4 else None))


def tree_cycle_view(trace: Trace, cycle: int, stage: int) -> None:
    """A tree cycle (draft trees): the tree, its attention mask and the cache compaction in place of the
    chain's per-position charts, the stage's figure first; the time bar and the text as for a chain."""
    tokens, ends, _ = derived(state.current_key(), trace)
    c = trace.cycles[cycle]
    root = root_text(trace, c)
    layout = layout_of(trace.header)["name"]
    step_heading(cycle, stage)
    first_result().caption("**Tree:** " + md(tree_summary(c, root)))
    st.info(md(tree_stage_caption(c, stage, root, layout)), icon=":material/lightbulb:")
    figs = shared_figures((state.current_key(), "tree", cycle, stage, layout),
                          lambda: [f for _, f in stage_figures(c, root, stage, layout)])
    for name, fig in zip(stage_order(stage), figs, strict=True):
        plot(fig, key=TREE_CHART_KEYS[name])
        if name == "tree" and stage == 3:  # the walk's numbers, try by try
            st.caption("The walk, in the order tried (r[t]: the token's probability in the residual when it was tried):")
            st.markdown(markdown_table(tried_rows(c)))
    chart(cycle_time_figure(c, median_cycle_s(trace), c["cycle"] in loud_cycles(trace)), key="cycle_time")
    if stage in (2, 5) and layout != "dynamic":  # where the static buffer's write position or the block table went
        texts = derive.sequence_texts(trace, c, compacted=stage == 5)
        for i, fig in enumerate(figures_layouts.layout_figures(trace.header, c, stage, texts)):
            chart(fig, key=f"layout_{i}")
    shown_until = ends[cycle] if stage >= 4 else c["committed_len_before"]
    chart(text_figure(tokens[:shown_until], cycle if stage >= 4 else None))


def overview(trace: Trace, cycle: int) -> None:
    trace_key = state.current_key()
    _, _, ov = derived(trace_key, trace)
    shared_chart((trace_key, "overview", cycle), lambda: overview_figure(
        ov, len(trace.cycles), cycle, loud_cycles(trace)), key="overview", on_select=from_overview, selection_mode="points")


def no_trace() -> None:
    st.title("Speculative decoding, one cycle at a time")
    folder = state.traces_dir()
    st.warning(f"No trace is open: there is no bundled example trace (`*.jsonl`) in {md(state.shown_paths(str(folder)))}. "
               "Open **Choose a trace** to start a live run or upload a trace.", icon=":material/folder_open:")
    st.page_link(TRACE_SOURCE, label="Choose a trace", icon=":material/folder_open:")


def main() -> None:
    trace = state.current_trace()
    if trace is None:
        no_trace()
        return
    header(trace)
    if not trace.cycles:
        st.warning("This trace has no cycles to show.")
        return
    last = len(trace.cycles) - 1
    toggle_col, speed_col = nav_buttons(state.step()[0], last)
    seconds = play_controls([toggle_col, speed_col, stage_controls(state.step()[1])])
    cycle, stage = state.step()
    if is_tree_header(trace.header):
        tree_cycle_view(trace, cycle, stage)
    else:
        cycle_view(trace, cycle, stage)
    overview(trace, cycle)
    if seconds:
        play_ticker(seconds)


main()
