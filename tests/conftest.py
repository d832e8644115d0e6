# The repository root is importable through pyproject.toml's pytest setting `pythonpath = ["."]`.
import os
import tempfile
from pathlib import Path

import pytest
import torch

import engine  # noqa: F401  (sets the offline default before transformers loads)
from tests.live_vllm import ngram_server  # noqa: F401, E402 - the live vLLM fixture, shared by its test files

# Tiny models run fastest on one thread, and CI has only two cores. SPECLAB_TEST_THREADS=2 runs the
# suite on two torch threads instead: it must pass either way (README, "the whole test suite").
torch.set_num_threads(int(os.environ.get("SPECLAB_TEST_THREADS", "1")))
# Per-machine measurements (engine/models/linear_paths.py) go to a folder of this test session's,
# never the user's ~/.cache: a test run neither reads nor leaves a machine's real curve.
os.environ["SPECLAB_LINEAR_PATHS"] = str(Path(tempfile.mkdtemp(prefix="speclab-test-")) / "linear-paths.json")


# ---------------------------------------------------------------- app tests: real traces from tiny models


@pytest.fixture(scope="session")
def example_traces(tmp_path_factory) -> dict:
    """Two real traces from tests/tiny.py models, written once per test session.

    'sampled': the 2-layer target with a different 1-layer draft (rejections and resamples);
    'same-model': the target as its own draft (every draft accepted: bonus tokens, draft catch-up).
    """
    from engine.config import SpecSettings
    from engine.cycle.pair import Pair
    from engine.run import run_to_trace
    from tests.tiny import tiny_pair

    folder = tmp_path_factory.mktemp("traces")
    pair = tiny_pair()
    paths = {"sampled": folder / "sampled.jsonl", "same-model": folder / "same-model.jsonl"}
    run_to_trace(pair, "the cat sat", SpecSettings(k=4, max_new_tokens=28, seed=1), paths["sampled"])
    run_to_trace(Pair(pair.target, pair.target, set()), "the dog ran", SpecSettings(k=3, max_new_tokens=12, seed=2),
                 paths["same-model"])
    return paths
