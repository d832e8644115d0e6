"""A live vLLM for the tests that need one: one n-gram server per test process (each of the suite's
workers starts its own the first time a test asks, so at most two run at once on CI's two workers),
started on 127.0.0.1 and a free port, stopped by its process id when the process's tests end.

Where the vLLM environment is missing the tests skip, unless SPECLAB_REQUIRE_VLLM=1 (scripts/test.sh
sets it after making the environment): then a missing server is a failure, never a silent skip.
"""
import os

import pytest

from engine.models.presets import smollm2_folder
from engine.servers.launch import NGRAM_K3, start_vllm, vllm_env, vllm_python


def require_vllm_env() -> None:
    if vllm_python() is None:
        if os.environ.get("SPECLAB_REQUIRE_VLLM") == "1":
            pytest.fail(f"SPECLAB_REQUIRE_VLLM=1 but no vLLM environment at {vllm_env()}")
        pytest.skip(f"no vLLM environment at {vllm_env()} (bash scripts/vllm_env.sh makes it)")


@pytest.fixture(scope="session")
def ngram_server(tmp_path_factory):
    """vLLM serving the chat target's plain copy with n-gram speculation at K=3, n-grams of 2 to 4."""
    require_vllm_env()
    server = start_vllm(smollm2_folder(), NGRAM_K3, model_name="smollm2",
                        log=tmp_path_factory.mktemp("vllm") / "server.log")
    yield server
    server.stop()
