"""What the pages call a trace's models and the shape of its drafts.

A trace names a model shipped with the project by its folder (`assets/models/chat-draft`): a path,
which says where the weights are but not what the model is. The pages call such a model by its
preset and role ("chat draft") and keep the trace's own name for a tooltip. Plain text, no
Streamlit: the pages escape it (app.ui.safe.md) where it reaches Markdown.
"""
from dataclasses import dataclass

from app.figures.tree_record import is_tree_header, tree_words
from engine.trace import model_name
from engine.trace.schema import EAGLE, OTHER_TOKENIZER

SHIPPED = "assets/models/"  # how a trace names a model folder shipped with the project
DRAFT_ROLES = {EAGLE: "EAGLE head", OTHER_TOKENIZER: "other-tokenizer draft"}  # else "draft"


@dataclass(frozen=True)
class ModelName:
    label: str  # what the pages call the model
    source: str  # the trace's own name for it: a shipped model's folder, for a tooltip


def model_label(header: dict, role: str) -> ModelName:
    """The "target" or "draft" model of a trace: a shipped folder by its preset and role, any other
    name (a model's own, or a drafter without a model such as prompt lookup) as the trace gives it."""
    source = model_name(header, role)
    preset = header.get("preset")
    if not source.startswith(SHIPPED):
        return ModelName(source, source)
    drafter = header.get("drafter")
    kind = drafter.get("kind") if isinstance(drafter, dict) else None
    what = DRAFT_ROLES.get(kind, "draft") if role == "draft" else "target"
    owner = preset if isinstance(preset, str) and preset else source.removeprefix(SHIPPED).split("/")[0]
    return ModelName(f"{owner} {what}", source)


def models_help(header: dict) -> str:
    """Where the two models come from, for a tooltip beside their names."""
    target, draft = model_label(header, "target"), model_label(header, "draft")
    return f"Target: {target.source}. Draft: {draft.source}."


def shape_words(header: dict) -> str:
    """What one cycle drafts: K tokens in a row, or a tree by its shape, depth and size."""
    settings = header.get("settings") or {}
    if is_tree_header(header):
        return tree_words(settings["tree"])
    return f"K={settings.get('k')} draft tokens per cycle"


TREE_SPEEDUP = "none: tree runs are not calibrated"  # they time their cycles; plain decoding is what they lack


def example_label(name: str, row: dict) -> str:
    """Choose a trace's words for an example: its name, K (a tree's shape as it is) and measured speedup."""
    shape = row.get("K", "?")
    return f"{name} · {f'K={shape}' if isinstance(shape, int) else shape} · {row.get('measured speedup', '')}"
