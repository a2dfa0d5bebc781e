"""Suite-wide settings: deterministic, single-threaded torch so results do not move with load."""

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# verl's plugin discovery is tested explicitly; elsewhere, keep imports predictable.
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # chair_server tests run without torch
    pass
