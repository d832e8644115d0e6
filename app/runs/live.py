"""A live run from the app: pick a model pair and settings, watch the cycles arrive.

Models load once per process (st.cache_resource): every session and rerun shares them.
The run itself goes on a worker thread (app/ui/jobs.py), so the page stays usable; the text
and the latest cycles arrive as the page polls it. It writes a normal trace file under
runs/live/, so it opens in the stepper and its link can be shared like any other trace.
"""
import os
import time
import uuid
from dataclasses import dataclass, replace
from typing import Callable

import streamlit as st

from app.figures.derive import visible_text
from app.ui import jobs, operator, state
from app.ui.pages import STEPPER
from app.ui.safe import md
from engine.config import SettingsError, SpecSettings
from engine.cycle.pair import Pair
from engine.drafters.registry import DRAFTERS, DrafterOptions
from engine.mode import RunMode
from engine.models.loading import ModelLoadError, TokenizerMismatchError
from engine.models.presets import DEFAULT_PRESET, PRESETS, default_drafter
from engine.run import load_pair, load_preset, load_with_drafter, run_advised, run_to_trace
from engine.stats.plan import PILOT_TOKENS, KPlan
from engine.trace.schema import (
    EAGLE,
    LAYOUTS,
    MAX_BLOCK_SIZE,
    MAX_K,
    MAX_NEW_TOKENS,
    OTHER_TOKENIZER,
    SUFFIX,
    TARGET_WEIGHTS,
    WEIGHTS_FLOAT32,
    WEIGHTS_INT4,
    WEIGHTS_INT4_A8,
)

CUSTOM = "custom"  # the pair is given as two model folders (or hub ids)
ALLOW_CUSTOM = "SPECLAB_CUSTOM_MODELS"  # "1": visitors may name model folders on this server
LOAD_ERRORS = (ModelLoadError, TokenizerMismatchError, ValueError, OSError)  # SettingsError is a ValueError


# What the form says under a drafter choice (the labels themselves: engine/drafters/registry.py).
DRAFTER_CAPTIONS = {
    OTHER_TOKENIZER: "The draft proposes in its own tokens; their text is re-encoded with the target's tokenizer. "
                     "Runs only at temperature 0: a ratio test needs the draft's probability of each target token.",
    EAGLE: "One decoder layer reads the target's top feature of the last committed token with the next "
           "token's embedding and predicts the next feature; the target's own output layer gives q. "
           "Its own KV cache is the \"EAGLE head\" row of the KV strip. "
           "With a custom pair, the draft field names the head's folder.",
    SUFFIX: "No model: proposes the most frequent continuation of the last tokens, in this request's text or in "
            "the outputs of earlier live runs with the same options (kept while the app runs). Exact at any "
            "temperature, like prompt lookup.",
}


@st.cache_resource(max_entries=4, show_spinner=False)
def cached_preset(name: str, drafter: DrafterOptions = DrafterOptions(), target_weights: str = WEIGHTS_FLOAT32) -> Pair:
    return load_preset(name, drafter=drafter, target_weights=target_weights)


@st.cache_resource(max_entries=4, show_spinner=False)
def cached_pair(target: str, draft: str, drafter: DrafterOptions = DrafterOptions(),
                target_weights: str = WEIGHTS_FLOAT32) -> Pair:
    if DRAFTERS[drafter.kind].needs.same_tokens:  # the pair's own draft model: the draft field
        return load_pair(target, draft, target_weights=target_weights)
    return load_with_drafter(target, drafter, target_weights=target_weights)


WEIGHTS_LABELS = {WEIGHTS_FLOAT32: "float32 (the model as loaded)",
                  WEIGHTS_INT4: "int4 (the GGUF file's 4-bit blocks, as stored)",
                  WEIGHTS_INT4_A8: "int4-a8 (the same blocks, 8-bit activations)"}
WEIGHTS_CAPTION = ("int4 runs the target's linear layers on its GGUF file's Q4_1 blocks (a Q8_0 output layer), "
                   "float32 activations, on the CPU: about a sixth of the bytes per step. Its logits differ from "
                   "float32's only in rounding, yet it is its own target: the trace says which one it followed. "
                   "int4-a8 also rounds each block of 32 activations to 8 bits, as llama.cpp does, so the products "
                   "run in integer instructions: faster, and further from float32.")


def apply_preset_defaults() -> None:
    """When the preset changes, fill in its prompt, temperature, chat-template choice and default
    drafter (two model folders: a draft model)."""
    name = st.session_state["live_preset"]
    preset = PRESETS.get(name)
    st.session_state["live_drafter"] = default_drafter(name if preset else "")
    if preset:
        st.session_state.update(live_prompt=preset.example_prompt, live_temperature=preset.default_temperature,
                                live_chat=preset.use_chat_template)


def init_defaults() -> None:
    if "live_preset" not in st.session_state:
        st.session_state["live_preset"] = DEFAULT_PRESET
        apply_preset_defaults()


def settings_inputs() -> dict:
    """The sampling settings as typed; SpecSettings checks their ranges."""
    cols = st.columns(6)
    return dict(
        k=cols[0].number_input("K (draft tokens per cycle)", 1, MAX_K, 4, key="live_k"),
        temperature=cols[1].number_input("Temperature (0 = greedy)", 0.0, 100.0, step=0.1, key="live_temperature"),
        top_k=cols[2].number_input("Top-k (0 = off)", 0, 1_000_000, 0, key="live_top_k"),
        top_p=cols[3].number_input("Top-p (1 = off)", 0.01, 1.0, 1.0, step=0.05, key="live_top_p"),
        seed=cols[4].number_input("Seed", 0, 2**31 - 1, 0, key="live_seed"),
        max_new_tokens=cols[5].number_input("Max new tokens", 1, MAX_NEW_TOKENS, 64, key="live_max_new"),
    )


LAYOUT_LABELS = {"dynamic": "dynamic: growable tensors, crop the tail (HF DynamicCache)",
                 "static": "static: preallocated buffer, move the write position (gpt-fast, HF StaticCache)",
                 "paged": "paged: blocks from a pool, free whole blocks (vLLM PagedAttention)"}


def cache_inputs() -> dict:
    """The KV-cache layout both models write into, and the paged layout's block size."""
    cols = st.columns([3, 1])
    layout = cols[0].selectbox("KV-cache layout", LAYOUTS, format_func=LAYOUT_LABELS.get, key="live_cache_layout")
    block = cols[1].number_input("Block size (paged)", 1, MAX_BLOCK_SIZE, 16, key="live_block_size",
                                 disabled=layout != "paged", help="Small blocks such as 4 make the block table readable")
    return {"cache_layout": layout, "block_size": block}


def run_form() -> None:
    if operator.read_only():
        st.info(operator.READ_ONLY_WORDS, icon=":material/lock:")
        return
    init_defaults()
    options = [*PRESETS, CUSTOM] if custom_allowed() else list(PRESETS)
    st.selectbox("Model pair", options, key="live_preset", on_change=apply_preset_defaults,
                 format_func=lambda n: f"{n}: {PRESETS[n].description}" if n in PRESETS else "custom: two model folders or ids")
    target = draft = ""
    if st.session_state["live_preset"] == CUSTOM:
        cols = st.columns(2)
        target = cols[0].text_input("Target model (folder or id)", key="live_target")
        draft = cols[1].text_input("Draft model (folder or id)", key="live_draft")
    drafter = drafter_inputs(st.session_state["live_preset"], draft.strip())
    weights = st.radio("Target weights", TARGET_WEIGHTS, format_func=WEIGHTS_LABELS.get, key="live_target_weights",
                       horizontal=True, help=WEIGHTS_CAPTION)
    st.text_area("Prompt", key="live_prompt", height=80)
    values = settings_inputs()
    values.update(cache_inputs())
    chat = st.checkbox("Wrap the prompt in the chat template (if the tokenizer has one)", key="live_chat")
    st.checkbox("Insist on this K (skip the K advisor)", key=INSIST_K, help=INSIST_HELP)
    st.caption("Models load once per server process, so the first run of a pair takes longer. "
               "Local model folders work offline; the run is saved under runs/live/ and opens in the stepper.")
    if st.button("Run", key="live_run", type="primary"):
        try:
            settings = SpecSettings(**{k: (v if k == "cache_layout" else float(v) if k in ("temperature", "top_p") else int(v))
                                       for k, v in values.items()})
        except SettingsError as err:
            st.error(md(str(err)))
            settings = None
        if settings is not None and drafter is not None:
            run(st.session_state["live_preset"], target.strip(), draft.strip(), st.session_state["live_prompt"],
                settings, chat, drafter, weights)
    show_run()


def load_or_error(preset: str | None, target: str = "", draft: str = "", whose: str = "the models",
                  drafter: DrafterOptions = DrafterOptions(), target_weights: str = WEIGHTS_FLOAT32) -> Pair | None:
    """The one place a page loads a pair: a preset by name, else two folders (or a target and a
    model-free drafter); behind a spinner, cached per server process; an error shown (None
    returned) if it cannot be loaded. A read-only server loads none."""
    if operator.read_only():
        st.info(operator.READ_ONLY_WORDS, icon=":material/lock:")
        return None
    try:
        with st.spinner("Loading models (once per server process)…"):
            if preset:
                return cached_preset(preset, drafter, target_weights)
            return cached_pair(target, draft, drafter, target_weights)
    except LOAD_ERRORS as err:
        st.error(f"Could not load {whose}: {md(state.shown_paths(str(err)))}", icon=":material/error:")
        return None


def drafter_inputs(preset: str, draft: str) -> DrafterOptions | None:
    """The drafter and the options of it the form offers; None (with the reason shown) if they do not fit."""
    kind = st.radio("Drafter", list(DRAFTERS), format_func=lambda k: DRAFTERS[k].label, key="live_drafter",
                    horizontal=True)
    spec = DRAFTERS[kind]
    offered = [flag for flag in spec.flags if flag.label]
    values = {}
    if offered:
        cols = st.columns(len(offered))
        values = {flag.field: int(col.number_input(flag.label, flag.low, flag.high, flag.default, key=f"live_{flag.field}"))
                  for col, flag in zip(cols, offered)}
    if kind in DRAFTER_CAPTIONS:
        st.caption(DRAFTER_CAPTIONS[kind])
    own_draft = (draft or None) if preset == CUSTOM and spec.needs.own_draft else None  # else: cached_pair's draft
    try:
        return DrafterOptions(kind, draft_model=own_draft, **values)
    except SettingsError as err:
        st.error(md(str(err)))
        return None


def custom_allowed() -> bool:
    """Whoever runs the server decides whether visitors may load models from folders on it."""
    return os.environ.get(ALLOW_CUSTOM) == "1"


def load_models(preset: str, target: str, draft: str, drafter: DrafterOptions = DrafterOptions(),
                target_weights: str = WEIGHTS_FLOAT32) -> Pair | None:
    if preset == CUSTOM and not custom_allowed():
        st.error(f"This server runs the presets only (its operator can allow model folders with {ALLOW_CUSTOM}=1).")
        return None
    if preset == CUSTOM and not (target and (draft or DRAFTERS[drafter.kind].needs.draft is None)):
        st.error("Type both a target and a draft model (local folders work offline).")
        return None
    return load_or_error(None if preset == CUSTOM else preset, target, draft, drafter=drafter,
                         target_weights=target_weights)


def run(preset: str, target: str, draft: str, prompt: str, settings: SpecSettings, chat: bool,
        drafter: DrafterOptions = DrafterOptions(), target_weights: str = WEIGHTS_FLOAT32) -> None:
    """Load the pair here (once per process, behind a spinner), then run on a worker thread."""
    spec = DRAFTERS[drafter.kind]
    if not spec.samples and settings.temperature != 0:
        st.error(md(f"Set the temperature to 0: {spec.refusal}."), icon=":material/error:")
        return
    pair = load_models(preset, target, draft, drafter, target_weights)
    if pair is None:
        return
    known = None if preset == CUSTOM else preset
    start_run(LIVE_JOB, f"Live run on {known or 'the custom pair'}", pair, prompt, settings, known, chat, keep_finished,
              advised=not st.session_state.get(INSIST_K, False))


# ---------------------------------------------------------------- the run on a worker thread (app/ui/jobs.py)

LIVE_JOB = "live-run"  # the job name of the Live run tab
INSIST_K = "live_insist_k"  # session_state: run at the form's K whatever the advisor says
INSIST_HELP = ("Without this, the run first measures this machine (each verify width's cost and a "
               f"{PILOT_TOKENS}-token pilot for alpha) and runs the K the advisor picks, or decodes plainly "
               "(K=0) when no K beats plain decoding here.")
FINISHED = "live_finished"  # session_state: (LiveOutput, error opening it) of the last live run
SHOWN_ROWS = 8  # the latest cycles in the table under the text


@dataclass(frozen=True)
class LiveOutput:
    """What a run has produced so far, as plain data the worker hands to the page."""
    file: str  # the trace's file name under runs/live/ ("" until the run has ended)
    text: str  # the committed text so far
    rows: tuple[dict, ...]  # the latest cycles, one row each
    cycles: int
    tokens: int
    advice: str = ""  # the K advisor's words, when it chose K (engine/stats/plan.py)
    plain_tokens_per_s: float | None = None  # set when the advisor said K=0 and the run decoded plainly


class CycleWatch:
    """Runs on the worker thread: turns each recorded cycle into progress and a new LiveOutput."""

    def __init__(self, max_new_tokens: int, report: jobs.Report) -> None:
        self.max_new_tokens, self.report = max_new_tokens, report
        self.rows: list[dict] = []
        self.pieces: list[str] = []
        self.cycles = self.tokens = 0

    def on_cycle(self, rec: dict) -> None:
        self.cycles += 1
        self.tokens += len(rec["committed_token_ids"])
        self.pieces += rec["committed_token_texts"]
        self.rows.append({"cycle": rec["cycle"], "accepted": f"{rec['num_accepted']} of {len(rec['draft_token_ids'])}",
                          "outcome": "bonus" if rec["bonus_token_id"] is not None else f"rejected at {rec['rejected_position']}",
                          "committed": " ".join(visible_text(t) for t in rec["committed_token_texts"])})
        self.report(min(1.0, self.tokens / self.max_new_tokens),
                    f"cycle {rec['cycle']}, {self.tokens} of at most {self.max_new_tokens} tokens", self.output(""))

    def output(self, file: str) -> LiveOutput:
        return LiveOutput(file, "".join(self.pieces), tuple(self.rows[-SHOWN_ROWS:]), self.cycles, self.tokens)


def start_run(name: str, label: str, pair: Pair, prompt: str, settings: SpecSettings, preset: str | None,
              chat: bool, on_done: Callable[[LiveOutput], None], stem: str = "live", calibrate: bool = True,
              advised: bool = False) -> bool:
    """Start run_to_trace on a worker thread, writing a new file under runs/live/; False if this
    session is busy. Live runs record step times (calibrate) for the statistics page. With
    `advised`, the K advisor picks K on this machine first (engine.run.run_advised), K=0 included.
    Every trace records its cycles' times, so the run has the server to itself (app/ui/job_queue.py)."""
    out = state.runs_dir() / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}.jsonl"

    def work(report: jobs.Report) -> LiveOutput:
        watch = CycleWatch(settings.max_new_tokens, report)
        if not advised:
            run_to_trace(pair, prompt, settings, out, RunMode(calibrate=calibrate), preset=preset, chat_template=chat,
                         on_cycle=watch.on_cycle)
            return watch.output(out.name)
        report(0.0, "measuring this machine and a short pilot for the K advisor")
        done = run_advised(pair, prompt, settings, out, preset=preset, chat_template=chat, on_cycle=watch.on_cycle)
        if done.plan.plain:
            return LiveOutput("", done.text, (), 0, done.tokens, done.plan.sentence, done.tokens / done.decode_s)
        return replace(watch.output(out.name), advice=advised_words(done.plan))

    return jobs.start(name, label, work, on_done, alone=True) is not None  # its trace records times


def advised_words(plan: KPlan) -> str:
    """What the page says of a run whose K the advisor chose."""
    alpha = f"pilot alpha {plan.alpha:.2f} ± {plan.alpha_error:.2f}"
    if plan.k == plan.requested_k:
        return f"The K advisor kept K={plan.k} ({alpha}). {plan.sentence}"
    return f"The K advisor chose K={plan.k} instead of {plan.requested_k} ({alpha}). {plan.sentence}"


def keep_finished(result: LiveOutput) -> None:
    """On the script thread: open the new trace (the sidebar names it on the rerun) and keep the output.
    A plainly decoded run wrote no trace: the open trace stays as it was."""
    error = state.set_current(state.TraceRef("run", result.file)) if result.file else None
    st.session_state[FINISHED] = (result, error)


def show_output(result: LiveOutput) -> None:
    """The text so far and the latest cycles (drawn while the run goes, and after it)."""
    st.code(result.text, language=None, wrap_lines=True)  # st.code shows text, never HTML
    if result.rows:
        st.dataframe(list(result.rows), hide_index=True)


def show_run() -> None:
    """The Live run tab's job: progress and the output so far while it runs, then the result."""
    jobs.show(LIVE_JOB, show_output)
    if jobs.running(LIVE_JOB) or FINISHED not in st.session_state:
        return
    result, error = st.session_state[FINISHED]
    if error:
        st.error(f"The run finished but its trace could not be opened: {md(error)}", icon=":material/error:")
        return
    if result.plain_tokens_per_s is not None:
        st.info(f"Decoded plainly: {result.tokens} tokens at {result.plain_tokens_per_s:.1f} tokens/s, and no trace "
                f"was written. {md(result.advice)} To speculate anyway, tick **Insist on this K**.",
                icon=":material/speed:")
        show_output(result)
        return
    if result.advice:
        st.info(md(result.advice), icon=":material/tune:")
    st.success(f"Finished: {result.cycles} cycles, {result.tokens} tokens, saved to "
               f"{md(state.shown_paths(str(state.runs_dir() / result.file)))}.")
    st.page_link(STEPPER, label="Step through this run", icon=":material/play_circle:")
    show_output(result)
