"""One check's verdict, and the small readers every check shares (no verl import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Finding:
    """One check's verdict: `ok` False means the run cannot start as configured."""

    check: str  # config | stack | gpus | inputs | nodes
    ok: bool
    line: str
    # False: the run may still start (a version off verl's pins): a warning in the launch
    # scripts, the dry run and the doctor alike.
    blocking: bool = True


def select(config: Any, key: str, default: Any = None) -> Any:
    from omegaconf import OmegaConf

    value = OmegaConf.select(config, key, default=default, throw_on_missing=False)
    return default if value is None else value


def installed_version(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None
