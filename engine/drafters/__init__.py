"""Drafters: what proposes the tokens the target verifies (see base.Drafter)."""
from .base import CatchUp, Drafter, Proposal, one_hot_rows
from .model import ModelDrafter
from .other_tokenizer import SAMPLING_REFUSED, OtherTokenizerDrafter
from .prompt_lookup import PromptLookupDrafter, find_match

from ..trace import DRAFTER_KINDS

__all__ = ["CatchUp", "Drafter", "Proposal", "one_hot_rows", "ModelDrafter", "OtherTokenizerDrafter",
           "PromptLookupDrafter", "find_match", "SAMPLING_REFUSED", "DRAFTER_KINDS"]
