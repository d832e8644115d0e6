"""Step through a trace: one cycle at a time, each cycle in five stages."""
import streamlit as st

from app import derive, drafter_view, figures, figures_layouts, state
from app.explain import STAGES, stage_caption
from app.safe import md
from engine.trace import Trace

SPEEDS = {"slow (2 s)": 2.0, "normal (1 s)": 1.0, "fast (0.4 s)": 0.4}


# ---------------------------------------------------------------- per-trace data (cached)

@st.cache_data(max_entries=8, show_spinner=False)
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

def nav_buttons(cycle: int, last: int) -> None:
    """First / previous / next / last and the cycle slider. Left/Right are Streamlit's own
    button shortcuts (st.button(shortcut=...)): they ignore keys typed into inputs, and a
    focused slider keeps its arrow keys."""
    cols = st.columns([1.1, 1.3, 1.1, 1.1, 5.4])
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


def stage_controls(stage: int) -> None:
    cols = st.columns([1, 6, 1])
    cols[0].button("◁ Stage", key="stage_prev", on_click=step_stage, args=(-1,), width="stretch",
                   help="Previous stage (into the previous cycle from stage 1)")
    st.session_state["stage_select"] = stage
    cols[1].segmented_control("Stage", list(STAGES), format_func=STAGES.get, key="stage_select", required=True,
                              on_change=from_widget, args=("stage_select", "stage"), label_visibility="collapsed")
    cols[2].button("Stage ▷", key="stage_next", on_click=step_stage, args=(1,), width="stretch",
                   help="Next stage (into the next cycle after stage 5)")


def play_controls() -> float | None:
    """Play/pause and speed; returns seconds per step while playing."""
    cols = st.columns([1, 2, 2, 5], vertical_alignment="center")
    if st.session_state.pop("_play_reached_end", False):
        st.session_state["playing"] = False  # set before the toggle exists in this run, as Streamlit requires
    playing = cols[0].toggle("Play", key="playing")
    speed = cols[1].selectbox("Speed", list(SPEEDS), index=1, key="play_speed", label_visibility="collapsed")
    cols[2].radio("Play by", ["stages", "cycles"], key="play_by", horizontal=True, label_visibility="collapsed")
    cols[3].caption("The address bar always links to this trace, cycle and stage: copy it to share this view.")
    return SPEEDS[speed] if playing else None


def play_ticker(seconds: float) -> None:
    """While playing, a fragment reruns every `seconds` and advances one step."""
    st.session_state["_tick_from_full_run"] = True

    @st.fragment(run_every=seconds)
    def tick() -> None:
        if st.session_state.pop("_tick_from_full_run", False):
            return  # the full run that drew the page: wait for the timer
        if at_end():
            st.session_state["_play_reached_end"] = True
        elif st.session_state.get("play_by") == "cycles":
            move(1)
        else:
            step_stage(1)
        st.rerun()

    tick()


# ---------------------------------------------------------------- the view

def header(trace: Trace) -> None:
    h = trace.header
    s = h["settings"]
    st.title("Speculative decoding, one cycle at a time")
    done = "" if trace.complete else " · incomplete run (no summary)"
    drafter = trace.drafter_kind
    via = "" if drafter == "model" else f" ({md(drafter)})"
    st.caption(f"Target **{md(h['target']['name'])}** · draft **{md(h['draft']['name'])}**{via} · K={s['k']} · "
               f"temperature {s['temperature']} · top-k {s['top_k']} · top-p {s['top_p']} · seed {s['seed']} · "
               f"{len(trace.cycles)} cycles{done}")


def chart(fig, key: str | None = None, **kwargs):
    return st.plotly_chart(fig, key=key, config={"displaylogo": False}, **kwargs)


def sequence_texts(tokens: list[derive.TokenInfo], c: dict) -> list[str]:
    """Token text at each sequence position: committed so far, then this cycle's drafts."""
    return [t.text for t in tokens[: c["committed_len_before"]]] + list(c["draft_token_texts"])


def test_table(c: dict, k: int) -> list[dict]:
    outcomes = derive.position_outcomes(c, k)
    return [{"pos": i + 1, "draft token": derive.visible_text(c["draft_token_texts"][i]),
             "p_target": c["p_target"][i], "p_draft": c["p_draft"][i], "min(1, ratio)": c["accept_prob"][i],
             "u": c["u"][i] if i < len(c["u"]) else None,
             "result": f"{figures.STYLES[outcomes[i]].mark} {outcomes[i]}"} for i in range(k)]


TABLE_COLUMNS = {"pos": st.column_config.NumberColumn("pos", width=40),
                 "draft token": st.column_config.TextColumn("draft token", width="small"),
                 **{name: st.column_config.NumberColumn(name, format="%.4f", width="small")
                    for name in ("p_target", "p_draft", "min(1, ratio)", "u")}}


def cycle_view(trace: Trace, cycle: int, stage: int) -> None:
    tokens, ends, _ = derived(state.current_key(), trace)
    c = trace.cycles[cycle]
    k = derive.proposals(c)  # K for a draft model; prompt lookup may propose fewer
    st.subheader(f"Cycle {cycle} · stage {STAGES[stage]}")
    st.info(md(stage_caption(c, k, stage, trace.header.get("faults"))), icon=":material/lightbulb:")
    chart(figures.cycle_figure(c, k, stage))
    if stage == 1:  # prompt lookup / other tokenizer: where the proposal came from
        drafter_view.show_provenance([t.text for t in tokens[: c["committed_len_before"]]], c)
    left, right = st.columns(2)
    with left:
        if stage >= 2:
            chart(figures.acceptance_figure(c, k, stage))
    with right:
        if stage >= 4:
            chart(figures.resample_figure(c, k))
        elif stage == 3:
            st.caption("The test, position by position (u is drawn only up to the first rejection):")
            st.dataframe(test_table(c, k), hide_index=True, column_config=TABLE_COLUMNS)
    chart(figures.cache_figure(c, stage, sequence_texts(tokens, c)))
    if stage in (2, 5):  # the verify appends to the target's cache, the rollback trims it: in the trace's layout
        for i, fig in enumerate(figures_layouts.layout_figures(trace.header, c, stage, sequence_texts(tokens, c))):
            chart(fig, key=f"layout_{i}")
    shown_until = ends[cycle] if stage >= 4 else c["committed_len_before"]
    chart(figures.text_figure(tokens[:shown_until], cycle if stage >= 4 else None))


def overview(trace: Trace, cycle: int) -> None:
    _, _, ov = derived(state.current_key(), trace)
    chart(figures.overview_figure(ov, len(trace.cycles), cycle), key="overview", on_select=from_overview,
          selection_mode="points")


def no_trace() -> None:
    st.title("Speculative decoding, one cycle at a time")
    folder = state.traces_dir()
    st.warning(f"No trace is open: there is no bundled example trace (`*.jsonl`) in {md(str(folder))}. "
               "Open **Choose a trace** to start a live run or upload a trace.", icon=":material/folder_open:")
    st.page_link("views/trace_source.py", label="Choose a trace", icon=":material/folder_open:")


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
    nav_buttons(state.step()[0], last)
    stage_controls(state.step()[1])
    seconds = play_controls()
    cycle, stage = state.step()
    state.write_url()
    cycle_view(trace, cycle, stage)
    overview(trace, cycle)
    if seconds:
        play_ticker(seconds)


main()
