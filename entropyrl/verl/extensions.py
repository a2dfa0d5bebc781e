"""What the plugin loads from the CPU wing, found by name and never imported by path.

The plugin sits below the rig (`entropyrl.rig`): the rig builds on it, so the plugin must not
import it. Two things of the rig still run inside verl's processes when a run asks for them:
the CPU backend (`VERL_PLATFORM=cpu`) and the smoke's per-sample recorder
(`ENTROPYRL_TRACE_DIR`). The rig declares them as entry points of the group `GROUP`
(pyproject.toml), as verl finds our plugin itself, and this module loads one by its name; a GPU
run's processes load neither.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

GROUP = "entropyrl.extensions"
CPU_BACKEND = "cpu"  # a callable that installs the platform, its fixes and the `hf` rollout
TRACE = "trace"  # the module that writes the smoke's per-sample rows


def load(name: str) -> Any:
    """The object entry point `name` of `GROUP` names; a clear error when it is not installed."""
    found = entry_points(group=GROUP, name=name)
    if not found:
        raise RuntimeError(
            f"entropyrl extension {name!r} is not installed (no entry point {name!r} in the "
            f"group {GROUP!r}): reinstall entropyrl (`pip install -e .` in a checkout)"
        )
    return next(iter(found)).load()
