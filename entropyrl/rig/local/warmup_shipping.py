"""The warm-up checkpoints shipped with the package: which settings, and how they are trained.

A new user's first quick start would otherwise spend most of its time on a supervised warm-up
that is the same for everyone with the defaults. So the quick starts' warm-ups are trained once
here (`python tools/ship_warmups.py`, one CPU thread) into `warmup_cache.SHIPPED`, and
tests/rig/local/test_shipped_warmups.py trains them again and compares: a change to the warm-up's
code or defaults that moves the result fails there until they are shipped again.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path
from typing import Any

from entropyrl.rig.local.config import DemoConfig
from entropyrl.rig.local.warmup_cache import SHIPPED, WarmupEntry, shipped_entry

__all__ = ["QUICKSTARTS", "quickstart_config", "ship", "train_warmup"]

# The settings each quick start runs its warm-up with (beyond DemoConfig's defaults).
QUICKSTARTS: dict[str, dict[str, Any]] = {
    "captioning": {},  # bash examples/quickstart.sh
    "function-calling": {"task": "function-calling", "warmup_steps": 300},  # ..._quickstart.sh
}


def quickstart_config(name: str) -> DemoConfig:
    """The `DemoConfig` of quick start `name` (a key of `QUICKSTARTS`), progress bars off."""
    return DemoConfig(progress=False, **QUICKSTARTS[name])


def train_warmup(cfg: DemoConfig) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """Train `cfg`'s warm-up from scratch on the CPU, cache unused: (state dict, `run_warmup`'s
    result, its log records), what a shipped slot holds."""
    from entropyrl.rig.local.runner import CaptionSession, RecordingLog, run_warmup

    cfg = dataclasses.replace(cfg, device="cpu", warmup_cache=False)
    recorded = RecordingLog(None)
    if cfg.task == "captioning":
        with (
            tempfile.TemporaryDirectory(prefix="entropyrl-warmup-") as world,
            CaptionSession(cfg, world) as session,
        ):
            result = run_warmup(
                session.model, session.task, cfg, steps=cfg.warmup_steps, seed=cfg.seed,
                log=recorded,
            )  # fmt: skip
            return session.state(), result, recorded.records
    from entropyrl.rig.local.function_calling import build_function_calling

    model, task = build_function_calling(cfg)
    result = run_warmup(model, task, cfg, steps=cfg.warmup_steps, seed=cfg.seed, log=recorded)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return state, result, recorded.records


def ship(
    root: Path | None = None, names: tuple[str, ...] = tuple(QUICKSTARTS)
) -> list[WarmupEntry]:
    """Train each quick start's warm-up into `root` and remove the slots no quick start uses."""
    root = SHIPPED if root is None else root
    entries = []
    for name in names:
        cfg = quickstart_config(name)
        entry = shipped_entry(cfg, cfg.seed, cfg.task, root=root)
        if entry.folder.exists():
            shutil.rmtree(entry.folder)
        entry.save(*train_warmup(cfg))
        entries.append(entry)
    if set(names) == set(QUICKSTARTS):
        keep = {entry.folder.name for entry in entries}
        for folder in root.iterdir():
            if folder.is_dir() and folder.name not in keep:
                shutil.rmtree(folder)
    return entries
