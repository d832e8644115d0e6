#!/usr/bin/env bash
# Everything a GPU session runs, per preset: the correctness checks (bench/gpu_checks.py: the
# reference path, then the fast path per capture mode against the CPU reference) and the fast-path
# benchmark (bench/fast_bench.py: methods a, b, c, d, d', e; float32 and bfloat16; T = 0 and 1).
# Results: bench/results/gpu-checks.json and bench/results/fast-<preset>.{json,md}.
#   bash bench/gpu.sh tiny-shakespeare     # one preset per call keeps each call well under 10 minutes
#   bash bench/gpu.sh chat
#   DRY_RUN=1 OUT=/tmp/x bash bench/gpu.sh tiny-shakespeare   # the CPU, tiny sizes: tries every command
# Knobs: REPEATS (3), CAPTURES (graph,none; add compile to check torch.compile too), K_TINY (5),
# K_CHAT (4), STAGE (all | checks | bench), SPEED=1 also runs the reference engine's bench/speed.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
REPEATS=${REPEATS:-3}
OUT=${OUT:-bench/results}
STAGE=${STAGE:-all}
presets=("$@")
[ ${#presets[@]} -eq 0 ] && presets=(tiny-shakespeare chat)
if [ -n "${DRY_RUN:-}" ]; then
  device=(--device cpu --dry-run)
else
  device=(--device cuda)
fi
mkdir -p "$OUT"
for preset in "${presets[@]}"; do
  case $preset in
    chat) tokens=64; k=${K_CHAT:-4} ;;
    *) tokens=128; k=${K_TINY:-5} ;;
  esac
  if [ "$STAGE" != bench ]; then
    $PY -m bench.gpu_checks --preset "$preset" "${device[@]}" --captures "${CAPTURES:-graph,none}" \
      --max-new-tokens 48 --out "$OUT/gpu-checks.json"
  fi
  if [ "$STAGE" != checks ]; then
    $PY -m bench.fast_bench --preset "$preset" "${device[@]}" --k "$k" --dtypes float32,bfloat16 --temperatures 0,1 \
      --max-new-tokens $tokens --repeats "$REPEATS" --out "$OUT"
  fi
  if [ -n "${SPEED:-}" ] && [ -z "${DRY_RUN:-}" ]; then
    $PY -m bench.speed --preset "$preset" --device cuda --dtype float32 --name "$preset-cuda" \
      --max-new-tokens $tokens --repeats "$REPEATS" --out "$OUT"
  fi
done
