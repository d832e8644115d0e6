"""Drafters: what proposes the tokens the target verifies (see base.Drafter).

May import: engine.config, engine.trace, engine.models and engine.kv; never engine.cycle,
which imports this package.
"""
from engine.drafters.base import CatchUp, Drafter, Proposal, one_hot_rows
from engine.drafters.eagle import EagleDrafter, EagleHead, load_head
from engine.drafters.model import ModelDrafter
from engine.drafters.other_tokenizer import SAMPLING_REFUSED, OtherTokenizerDrafter
from engine.drafters.prompt_lookup import PromptLookupDrafter, find_match

from engine.trace.format import DRAFTER_KINDS

__all__ = ["CatchUp", "Drafter", "Proposal", "one_hot_rows", "ModelDrafter", "EagleDrafter", "EagleHead", "load_head", "OtherTokenizerDrafter",
           "PromptLookupDrafter", "find_match", "SAMPLING_REFUSED", "DRAFTER_KINDS"]
