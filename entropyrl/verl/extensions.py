"""What the plugin loads from the CPU wing, found by name and never imported by path.

The plugin sits below the rig (`entropyrl.rig`): the rig builds on it, so the plugin must not
import it. Two things of the rig still run inside verl's processes when a run asks for them:
the CPU backend (`VERL_PLATFORM=cpu`) and the smoke's per-sample recorder
(`ENTROPYRL_TRACE_DIR`). The rig declares them as entry points of the group `GROUP`
(pyproject.toml), as verl finds our plugin itself, and this module loads one by its name; a GPU
run's processes load neither.
"""

from __future__ import annotations

from importlib.metadata import distributions
from typing import Any

GROUP = "entropyrl.extensions"
CPU_BACKEND = "cpu"  # a callable that installs the platform, its fixes and the `hf` rollout
TRACE = "trace"  # the module that writes the smoke's per-sample rows


def load(name: str) -> Any:
    """The object entry point `name` of `GROUP` names; a clear error when it is not installed.

    Every copy of entropyrl's metadata on the path is searched, not only the first: an old
    `entropyrl.egg-info` left in a checkout's root comes first on the path of a process started
    there and would hide the installed entry points (`importlib.metadata.entry_points` keeps one
    copy of each distribution)."""
    for dist in distributions(name="entropyrl"):
        found = dist.entry_points.select(group=GROUP, name=name)
        if found:
            return next(iter(found)).load()
    raise RuntimeError(
        f"entropyrl extension {name!r} is not installed (no entry point {name!r} in the group "
        f"{GROUP!r}): reinstall entropyrl (`pip install -e .` in a checkout)"
    )
