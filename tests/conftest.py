import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Tiny models run fastest on one thread, and CI has only two cores.
torch.set_num_threads(1)
