"""The errors a model raises while it loads: a leaf module, so that the GGUF modules and the
presets can raise them without importing loading.py (which imports gguf_linear.py when a
model asks for int4 weights). loading.py imports both names back, so
`from engine.models.loading import ModelLoadError` keeps working."""


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be loaded; the message says which and why."""


class TokenizerMismatchError(ValueError):
    """Draft and target do not share one token space."""
