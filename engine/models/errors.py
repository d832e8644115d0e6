"""The errors a model raises while it loads: a leaf module, so that the GGUF modules and the
presets can raise them without importing loading.py (which imports gguf_linear.py when a
model asks for int4 weights). loading.py imports both names back, so
`from engine.models.loading import ModelLoadError` keeps working."""


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be loaded; the message says which and why."""


class TokenizerMismatchError(ValueError):
    """Draft and target do not share one token space."""


# Where the engine's own decoder (--decoder own, engine/models/llama.py) cannot apply to a whole run:
# refused before anything loads (engine/mode.py) and again by LoadedModel, whichever is asked second.
OWN_DECODER_TP = (
    "--decoder own runs unsharded models, and under --tp the target's shards run Hugging Face's tensor-parallel "
    "modules: drop one of the two")
