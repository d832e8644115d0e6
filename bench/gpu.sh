#!/usr/bin/env bash
# The speed benchmark and the correctness checks on a CUDA GPU, for the presets named
# (default: both). Results land beside the CPU ones: bench/results/speed-<preset>-cuda.{json,md}
# and bench/results/gpu-checks.json.
#   bash bench/gpu.sh                      # both presets
#   bash bench/gpu.sh tiny-shakespeare     # one
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
REPEATS=${REPEATS:-3}
presets=("$@")
[ ${#presets[@]} -eq 0 ] && presets=(tiny-shakespeare chat)
for preset in "${presets[@]}"; do
  case $preset in
    chat) tokens=48 ;;
    *) tokens=160 ;;
  esac
  $PY bench/speed.py --preset "$preset" --device cuda --dtype "${DTYPE:-bfloat16}" --name "$preset-cuda" --max-new-tokens $tokens --repeats "$REPEATS"
  $PY bench/gpu_checks.py --preset "$preset"
done
