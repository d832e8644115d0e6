#!/usr/bin/env bash
# The chat draft made on a CUDA GPU in a few minutes instead of an hour on a CPU:
# sample answers from the target in large batches, then train the draft on them.
#   bash scripts/distill_chat_draft_gpu.sh [extra train_chat_draft.py flags]
# Writes assets/models/chat-draft/; c (a CPU figure) is then measured on a CPU with
#   python -m scripts.train_chat_draft --eval-only
# The held-out set is sampled on the CPU, as the shipped draft's was, when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
DATA=${DATA:-data/chat_distill_gpu}
[ -d data/chat_distill_heldout ] || $PY -m scripts.make_chat_distill_data --heldout --prompts 32
$PY -m scripts.make_chat_distill_data --device cuda --batch 512 --tokens "${TOKENS:-3000000}" \
    --deadline "${GEN_MINUTES:-1.75}" --seed 1 --out "$DATA"
$PY -m scripts.train_chat_draft --device cuda --data "$DATA" --bs 128 --mass 0.99 \
    --minutes "${TRAIN_MINUTES:-2.25}" --eval-every 0.5 --threads 4 --threads-after 4 "$@"
