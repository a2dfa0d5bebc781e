"""Deprecated path: the CHAIR client lives in `entropyrl.rewards.chair_client`."""

from __future__ import annotations

import warnings

from entropyrl.rewards.chair_client import *  # noqa: F403
from entropyrl.rewards.chair_client import __all__  # noqa: F401

warnings.warn(
    "entropyrl.chair_client moved to entropyrl.rewards.chair_client; import it from there",
    FutureWarning,
    stacklevel=2,
)
