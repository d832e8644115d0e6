"""The run's models and token texts: what every cycle kind and every caller shares.

- `Pair`: the target and what drafts for it (a draft model, or another drafter kind);
- `TokenTexts`: decoded single tokens, remembered over a run;
- `eos_ids_of`: the token ids that end a run, from the tokenizer and the generation config.
"""
from dataclasses import dataclass

from engine.drafters.base import Drafter
from engine.drafters.model import ModelDrafter
from engine.models.loading import LoadedModel


@dataclass
class Pair:
    """A target and what drafts for it. `draft` is the draft model, if the drafter has one
    that shares the target's token space; `drafter` defaults to drafting with it."""

    target: LoadedModel
    draft: LoadedModel | None
    eos_ids: set[int]
    drafter: Drafter | None = None

    def __post_init__(self) -> None:
        if self.drafter is None:
            if self.draft is None:
                raise ValueError("a pair needs a draft model or a drafter")
            self.drafter = ModelDrafter(self.draft)


class TokenTexts:
    """Decoded text of single token ids, remembered across a run."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.known: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        if token_id not in self.known:
            self.known[token_id] = self.tokenizer.decode([token_id])
        return self.known[token_id]

    def many(self, token_ids: list[int]) -> list[str]:
        return [self(t) for t in token_ids]


def eos_ids_of(model: LoadedModel) -> set[int]:
    ids = set()
    for source in (model.tokenizer.eos_token_id, getattr(model.model.generation_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(int(i) for i in source)
    return ids
