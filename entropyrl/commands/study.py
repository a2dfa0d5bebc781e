"""`entropyrl study` and `entropyrl acceptance`: the local runner's two studies on the command
line (`python -m entropyrl.rig.local.study` and `python -m entropyrl.rig.local.acceptance`, whose parsers
they are)."""

from __future__ import annotations

from typing import Any

from entropyrl.commands.forward import add_forwarded


def register(subparsers: Any) -> None:
    """Add `study` and `acceptance` to the `entropyrl` command line."""
    add_forwarded(
        subparsers,
        "study",
        "entropyrl.rig.local.study",
        "ablation of the clip schedule and the entropy guidance on the demo (CPU ok)",
    )
    add_forwarded(
        subparsers,
        "acceptance",
        "entropyrl.rig.local.acceptance",
        "RL against an equal-time warm-up control over several seeds (as demo --acceptance)",
    )
