"""The Diagnose page's sources: a bundled case, one of this server's live diagnoses, or a new live one.

A live diagnosis runs `engine diagnose` (app/runs/diagnose.py) on a shipped pair with a few requests
per category of the bundled prompt set, optionally with one mis-setting planted (the draft without
the chat template, the draft ignoring top-k/top-p, an EAGLE-3 head without its auxiliary states, K far
too deep) to watch the diagnosis find it.
It waits in the server's queue like every live run (alone: its baseline records step times).
"""
import time
import uuid

import streamlit as st

from app.ui import diagnoses, jobs, state
from app.ui.safe import md
from app.ui.widgets import remembered_pick
from engine.config import SettingsError, SpecSettings
from engine.drafters.registry import DRAFTERS, DrafterOptions, check_before_loading
from engine.trace.schema import (
    DRAFT_FILTERS_TEMPERATURE,
    DRAFT_MODEL,
    DRAFT_PROMPT_RAW,
    EAGLE,
    EAGLE3,
    EAGLE3_TOP,
    MAX_K,
    PROMPT_LOOKUP,
)
from engine.workload.prompts import BUNDLED_PROMPT_SET, read_prompts

PROMPT_SET = BUNDLED_PROMPT_SET
LIVE_JOB = "diagnose-run"
SHOW_REPORT = "_diagnose_show_report"  # session_state: a live diagnosis has just ended: open its report
MAX_LIVE_PER_CATEGORY = 2  # every arm runs every request: a live diagnosis is 6-9 workloads
MAX_LIVE_TOKENS = 24
DEEP_K = 16  # "K far too deep": past where any shipped draft's acceptance has died out
NONE, RAW, FILTERS, AUX, DEEP = "none", "raw", "filters", "aux", "deep"
PLANTS = {NONE: "none: the settings as given",
          RAW: "the draft reads the prompt without the chat template",
          FILTERS: "the draft ignores top-k/top-p (samples at the temperature only)",
          AUX: "the EAGLE-3 head reads the target's top layer, not its auxiliary layers",
          DEEP: f"K far too deep (K={DEEP_K})"}
LIVE_DRAFTERS = (DRAFT_MODEL, PROMPT_LOOKUP, EAGLE, EAGLE3)  # those that sample: the experiments change the temperature


def choose() -> tuple[str, str] | None:
    """The diagnosis the page shows: picked from the list (a request of a bundled arm opened in the
    stepper brings its case), or a finished live one."""
    ref = state.current_ref()
    came_from = (diagnoses.case_of(state.parse_request_name(ref.name)[:2])  # back from a request's trace
                 if ref is not None and ref.kind == "workload" else None)
    return remembered_pick("Diagnosis", diagnoses.listed(), remember=diagnoses.OPEN, key="diagnose_pick",
                           words=diagnoses.words, came_from=came_from, empty="No diagnosis here yet: run one live, below.")


def live_form() -> None:
    """A small live diagnosis on a shipped pair."""
    from engine.models.presets import PRESETS  # imports torch: only once the live form is open

    categories = sorted({r.category for r in read_prompts(PROMPT_SET)})
    st.markdown("Runs the baseline (your settings), then one arm per experiment, each changing one thing "
                "on the same requests and seeds. Plant a mis-setting to watch the diagnosis find it.")
    with st.form("diagnose_live"):
        cols = st.columns(3)
        preset = cols[0].selectbox("Pair", sorted(PRESETS), key="dg_preset")
        drafter = cols[1].selectbox("Drafter", LIVE_DRAFTERS, format_func=lambda k: DRAFTERS[k].label, key="dg_drafter")
        plant = cols[2].selectbox("Plant a mis-setting", list(PLANTS), format_func=PLANTS.get, key="dg_plant")
        cols = st.columns(5)
        k = cols[0].number_input("K", 1, MAX_K, 4, key="dg_k")
        temperature = cols[1].number_input("Temperature", 0.0, 2.0, 0.7, step=0.1, key="dg_temperature")
        top_p = cols[2].number_input("Top-p (1 = off)", 0.05, 1.0, 0.9, step=0.05, key="dg_top_p")
        per = cols[3].number_input("Requests per category", 1, MAX_LIVE_PER_CATEGORY, 1, key="dg_per")
        tokens = cols[4].number_input("New tokens each", 4, MAX_LIVE_TOKENS, 16, key="dg_tokens")
        chosen = st.multiselect("Categories", categories, default=categories[:3], key="dg_categories")
        go = st.form_submit_button("Run this diagnosis live", type="primary")
    if go:
        start_live(preset, drafter, plant, int(k), float(temperature), float(top_p), int(per), int(tokens), chosen)
    job = jobs.show(LIVE_JOB)
    if job is not None and job.running:
        st.caption("Each arm is kept as a live workload as it finishes; the page shows the diagnosis when it ends.")


def planted(plant: str, preset: str, drafter: str, k: int, temperature: float, top_p: float) -> tuple[DrafterOptions, int]:
    """The drafter options and K with the mis-setting planted; SettingsError where it cannot show."""
    from engine.models.presets import PRESETS

    if plant in (RAW, FILTERS) and drafter != DRAFT_MODEL:
        raise SettingsError("only a draft model has a prompt and a distribution of its own to mis-set: "
                            "pick the draft model, or plant K far too deep")
    if plant == AUX:
        if drafter != EAGLE3:
            raise SettingsError("only an EAGLE-3 head reads the target's auxiliary layers: pick the EAGLE-3 head")
        return DrafterOptions(kind=EAGLE3, eagle3_features=EAGLE3_TOP), k
    if plant == RAW:
        if not PRESETS[preset].use_chat_template:
            raise SettingsError(f"the {preset} pair renders no chat template, so a draft without it reads what "
                                "the target reads: pick the chat pair")
        return DrafterOptions(draft_prompt=DRAFT_PROMPT_RAW), k
    if plant == FILTERS:
        if temperature == 0 or top_p >= 1.0:
            raise SettingsError("a draft that ignores top-p differs only when sampling (temperature > 0) with "
                                "top-p below 1")
        return DrafterOptions(draft_filters=DRAFT_FILTERS_TEMPERATURE), k
    return DrafterOptions(kind=drafter), DEEP_K if plant == DEEP else k


def start_live(preset: str, drafter: str, plant: str, k: int, temperature: float, top_p: float, per: int,
               tokens: int, categories: list[str]) -> None:
    if not categories:
        st.error("Pick at least one category.")
        return
    requests = [r for r in read_prompts(PROMPT_SET) if r.category in categories]
    requests = [r for c in categories for r in [q for q in requests if q.category == c][:per]]
    from engine.models.presets import PRESETS

    try:
        options, k = planted(plant, preset, drafter, k, temperature, top_p)
        settings = SpecSettings(k=k, temperature=temperature, top_p=top_p, max_new_tokens=tokens, trace_top_k=3)
        check_before_loading(options, settings, PRESETS[preset], None)
    except SettingsError as err:
        st.error(md(str(err)), icon=":material/error:")
        return
    from app.runs import diagnose as live  # loads torch: only when a live diagnosis starts
    load = live.loader(preset)
    name = f"diagnose-{preset}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"

    def on_done(choice) -> None:
        st.session_state[diagnoses.OPEN] = choice
        st.session_state[SHOW_REPORT] = True  # the page opens the report tab before drawing the tabs
        st.session_state.pop("diagnose_pick", None)

    label = f"Live diagnosis on {preset} ({len(requests)} requests" + ("" if plant == NONE else f"; planted: {PLANTS[plant]}")
    jobs.start(LIVE_JOB, label + ")",
               lambda report: live.run(load, preset, options, settings, requests, name, report), on_done, alone=True)
