"""Suite-wide settings: deterministic, single-threaded torch so results do not move with load,
and caches kept inside a per-run temporary folder instead of the user's home."""

import os
import tempfile

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# CHAIR ground-truth caches written by tests (and by the services they start, which inherit
# the environment) go to a throw-away folder, never ~/.cache.
os.environ.setdefault("CHAIR_CACHE_DIR", tempfile.mkdtemp(prefix="entropyrl-test-chair-cache-"))

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # chair_server tests run without torch
    pass
