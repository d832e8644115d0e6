import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import engine  # noqa: E402,F401  (sets the offline default before transformers loads)

# Tiny models run fastest on one thread, and CI has only two cores.
torch.set_num_threads(1)
