"""Which run a checkpoint folder belongs to, so `resume_mode: auto` continues only the same run.

verl 0.9.1 resumes from the latest `global_step_N` under `trainer.default_local_dir` whatever
settings wrote it, and a finished run started again trains nothing and exits 0 without a word.
The entropy-aware trainer writes the settings that define a run (`run_settings`: the algorithm,
the policy loss and clip ratios, the model, the training data, the reward function, the group
size) beside every checkpoint it saves (`SETTINGS_FILE`). Before Ray starts, the plugin's config
validation calls `resume_decision`: a checkpoint of other settings refuses the run in one line
(naming what differs and how to start a separate run; the limits of `entropyrl.core.specs.LIMIT_KEYS`,
such as `algorithm.lost_samples.max_fraction`, are not compared: raising one after a stop
continues the run); a checkpoint at or past the run's last
step says there is nothing left to do; otherwise the run resumes or starts, as verl would.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from entropyrl.core.files import json_dumps
from entropyrl.core.specs import LIMIT_KEYS

SETTINGS_FILE = "entropyrl_run.json"
LATEST_FILE = "latest_checkpointed_iteration.txt"  # verl's tracker of the latest saved step
# What makes two runs the same run. Batch sizes, lengths, frequencies, layouts, URLs, loggers
# and the limits under `algorithm` (`NOT_COMPARED`) may change between a run
# and its resumption; these may not.
RUN_KEYS: tuple[str, ...] = (
    "algorithm",
    "actor_rollout_ref.model.path",
    "actor_rollout_ref.actor.policy_loss",
    "actor_rollout_ref.actor.clip_ratio_low",
    "actor_rollout_ref.actor.clip_ratio_high",
    "actor_rollout_ref.actor.clip_ratio_c",
    "actor_rollout_ref.actor.use_kl_loss",
    "actor_rollout_ref.actor.kl_loss_type",
    "actor_rollout_ref.rollout.n",
    "data.train_files",
    "reward.custom_reward_function.path",
    "reward.custom_reward_function.name",
    "reward.custom_reward_function.reward_kwargs.chair_weight",
    "reward.custom_reward_function.reward_kwargs.recall_weight",
)


def _plain(value: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


def run_settings(config: Any) -> dict[str, Any]:
    """{key: value} of `RUN_KEYS` in this config (resolved; missing keys are None)."""
    from omegaconf import OmegaConf

    return {
        key: _plain(OmegaConf.select(config, key, default=None, throw_on_missing=False))
        for key in RUN_KEYS
    }


def checkpoint_folder(config: Any) -> Path:
    """`trainer.default_local_dir`, relative to the working folder as verl resolves it."""
    from omegaconf import OmegaConf

    folder = Path(str(OmegaConf.select(config, "trainer.default_local_dir")))
    return folder if folder.is_absolute() else Path(os.getcwd()) / folder


def latest_step(folder: Path) -> int | None:
    """The step of the latest complete checkpoint verl recorded in `folder`, or None."""
    try:
        return int((folder / LATEST_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def write_settings(folder: Path, config: Any, step: int) -> None:
    """Record the run's settings beside its checkpoints (atomically)."""
    folder.mkdir(parents=True, exist_ok=True)
    payload = {"step": int(step), "settings": run_settings(config)}
    partial = folder / (SETTINGS_FILE + ".partial")
    partial.write_text(json_dumps(payload, indent=1, sort_keys=True, default=str))
    os.replace(partial, folder / SETTINGS_FILE)


def remove_older(folder: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` `global_step_N` folders; the removed ones.

    verl's workers remove old actor checkpoints they saved themselves, so a run resumed after a
    restart keeps every folder the earlier process wrote: this bounds them on disk."""
    import shutil

    steps = sorted(
        (int(path.name.rsplit("_", 1)[1]), path)
        for path in folder.glob("global_step_*")
        if path.is_dir() and path.name.rsplit("_", 1)[1].isdigit()
    )
    removed = [path for _, path in steps[: max(len(steps) - keep, 0)]]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def _flat(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for key in sorted(value):
            out.update(_flat(value[key], f"{prefix}.{key}"))
        return out
    return {prefix: value}


# The leaves of `algorithm` that bound a run's losses rather than define its algorithm.
NOT_COMPARED: frozenset[str] = frozenset(f"algorithm.{key}" for key in LIMIT_KEYS)


def differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """'key: saved -> current' for every leaf setting that differs (limits left out)."""
    before, after = {}, {}
    for key in sorted(set(saved) | set(current)):
        before.update(_flat(saved.get(key), key))
        after.update(_flat(current.get(key), key))
    for key in NOT_COMPARED:
        before.pop(key, None)
        after.pop(key, None)
    return [
        f"{key}: {before.get(key)!r} -> {after.get(key)!r}"
        for key in sorted(set(before) | set(after))
        if before.get(key) != after.get(key)
    ]


@dataclass(frozen=True)
class ResumeDecision:
    """What a run starting with `resume_mode: auto` will do with its checkpoint folder.

    kind: "fresh" (no checkpoint), "resume", "finished" (nothing left to do), "unknown" (a
    checkpoint without recorded settings: verl resumes it), "other_run" (refused).
    """

    kind: str
    line: str
    step: int | None = None


def resume_decision(config: Any) -> ResumeDecision:
    from omegaconf import OmegaConf

    mode = OmegaConf.select(config, "trainer.resume_mode", default="auto")
    folder = checkpoint_folder(config)
    if mode != "auto":
        return ResumeDecision("fresh", f"trainer.resume_mode={mode}: not resuming {folder}")
    step = latest_step(folder)
    if step is None:
        return ResumeDecision("fresh", f"no checkpoint in {folder}: training from step 1")
    where = f"{folder} holds a checkpoint at step {step}"
    try:
        saved = json.loads((folder / SETTINGS_FILE).read_text())["settings"]
    except (OSError, ValueError, KeyError, TypeError):
        return ResumeDecision(
            "unknown", f"{where} without the settings that wrote it: resuming it", step
        )
    changed = differences(saved, run_settings(config))
    if changed:
        shown = "; ".join(changed[:3]) + (
            f"; and {len(changed) - 3} more" if len(changed) > 3 else ""
        )
        return ResumeDecision(
            "other_run",
            f"{where} of a run with other settings ({shown}); give this run its own folder "
            "(trainer.experiment_name=NAME, or trainer.default_local_dir=DIR), or delete that "
            "checkpoint to start over there",
            step,
        )
    total = OmegaConf.select(config, "trainer.total_training_steps", default=None)
    if total is not None and step >= int(total):
        return ResumeDecision(
            "finished",
            f"nothing left to do: {where}, the last of trainer.total_training_steps={total}; "
            f"raise it to train further, or delete {folder} to train again",
            step,
        )
    return ResumeDecision("resume", f"resuming the run in {folder} after step {step}", step)
