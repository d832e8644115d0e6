"""Which model pair the live teaching pages run on, and its prompt.

The pages run real models, so they prefer the small byte-level tiny-shakespeare pair
(fast on a CPU). Tests and screenshots inject a pair of saved model folders through
SPECLAB_TEACHING_PAIR (a folder holding target/ and draft/, and optionally prompt.txt),
so they never depend on trained assets. Models load once per server process through
the live-run page's st.cache_resource loaders, so every page shares them.
"""
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from app.runs import live
from app.ui.safe import md
from engine.cycle.pair import Pair
from engine.models.presets import PRESETS, SMOLLM2_PACKAGE
from engine.run import encode_prompt

ENV_PAIR = "SPECLAB_TEACHING_PAIR"


@dataclass(frozen=True)
class PairChoice:
    key: str  # names the pair in cache keys and the selectbox
    label: str
    preset: str | None  # a preset name, or None for folders
    target: str = ""
    draft: str = ""
    prompt: str = ""
    chat: bool = False


def _env_choice() -> PairChoice | None:
    folder = os.environ.get(ENV_PAIR)
    if not folder:
        return None
    path = Path(folder)
    prompt_file = path / "prompt.txt"
    prompt = prompt_file.read_text(encoding="utf-8") if prompt_file.is_file() else "The"
    return PairChoice(f"folders:{path}", f"{path.name}: injected test pair", None,
                      str(path / "target"), str(path / "draft"), prompt)


def _preset_ready(name: str) -> bool:
    """Without loading anything: are the preset's files (or its package) there?"""
    preset = PRESETS[name]
    if not (preset.draft_folder() / "config.json").is_file():
        return False
    if name == "chat":  # the target is converted from a GGUF in a package on first use
        return importlib.util.find_spec(SMOLLM2_PACKAGE) is not None
    return (preset.target_folder() / "config.json").is_file()


def choices() -> list[PairChoice]:
    """Injected pair first, then the presets that are present, fastest first."""
    found = [c for c in [_env_choice()] if c]
    for name in ("tiny-shakespeare", "chat"):
        if name in PRESETS and _preset_ready(name):
            p = PRESETS[name]
            found.append(PairChoice(f"preset:{name}", f"{name}: {p.description}", name,
                                    prompt=p.example_prompt, chat=p.use_chat_template))
    return found


def choose(prefix: str) -> PairChoice | None:
    """A model-pair selector that loads nothing (stored results need no models); None until a
    custom pair names both folders."""
    options = choices()
    labels = {c.key: c.label for c in options} | {live.CUSTOM: "custom: two model folders"}
    key = st.selectbox("Model pair", list(labels), format_func=labels.get, key=f"{prefix}_pair",
                       help="The tiny-shakespeare pair is the fastest; the chat pair is a real 135M model.")
    if key != live.CUSTOM:
        return next(c for c in options if c.key == key)
    cols = st.columns(2)
    target = cols[0].text_input("Target model folder", key=f"{prefix}_target").strip()
    draft = cols[1].text_input("Draft model folder", key=f"{prefix}_draft").strip()
    if not (target and draft):
        st.info("Type both folders to load a custom pair.")
        return None
    return PairChoice(f"folders:{target}|{draft}", "custom", None, target, draft, "The")


def pick(prefix: str) -> tuple[PairChoice, Pair] | None:
    """A model-pair selector; returns the loaded pair, or None (with a message) if there is none."""
    choice = choose(prefix)
    pair = load(choice) if choice else None
    return (choice, pair) if pair else None


def load(choice: PairChoice) -> Pair | None:
    return live.load_or_error(choice.preset, choice.target, choice.draft)


def encode(pair: Pair, choice: PairChoice, prompt: str) -> list[int] | None:
    """Prompt token ids, or None with an error shown."""
    try:
        return encode_prompt(pair.target.tokenizer, prompt, choice.chat)
    except ValueError as err:
        st.error(md(str(err)))
        return None


def texts_of(pair: Pair, ids) -> dict[int, str]:
    """Decoded text of each id (the figures escape it)."""
    tok = pair.target.tokenizer
    return {int(i): tok.decode([int(i)]) for i in ids}
