"""What the entropy-aware trainer keeps beside a run: its metrics file, its resolved config, the
settings beside each checkpoint.

- `metrics.jsonl` lives in the checkpoint folder unless `VERL_FILE_LOGGER_PATH` says otherwise
  (`default_metrics_path`): the run's own folder, shared between nodes and kept through a crash.
- A resumed run keeps that file's rows of the steps up to its checkpoint: verl's `FileLogger`
  opens the file with "wb" when `fit` builds its `Tracking`, so `ResumedLog` reads those rows
  before and writes them back through that logger's own file handle once verl has built it (the
  trainer's `logger` attribute is where verl hands it over). Nothing of verl's is replaced.
- `record_checkpoint` writes the run's settings beside a checkpoint verl just saved
  (`entropyrl.verl.checks.checkpoints`) and bounds the folders a resumed run leaves.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from entropyrl.verl.checks import checkpoints

__all__ = [
    "RESOLVED_CONFIG_ENV",
    "ResumedLog",
    "default_metrics_path",
    "empty_training_set",
    "metrics_file_path",
    "record_checkpoint",
    "write_resolved_config",
]

# Where to write the fully resolved config this run trains with (a reproducibility record).
RESOLVED_CONFIG_ENV = "ENTROPYRL_RESOLVED_CONFIG"


def default_metrics_path(config: Any, environ: Mapping[str, str] | None = None) -> str | None:
    """Where verl's file logger should write when the run does not say (`VERL_FILE_LOGGER_PATH`
    unset): `metrics.jsonl` in the checkpoint folder (verl's default is
    `./<project>/<experiment>.jsonl` in whatever folder the trainer's process started in).
    None when the file logger is off or placed."""
    environ = os.environ if environ is None else environ  # at call time: `datasets` rebinds it
    loggers = config.trainer.get("logger") or []
    loggers = [loggers] if isinstance(loggers, str) else list(loggers)
    if "file" not in loggers or environ.get("VERL_FILE_LOGGER_PATH"):
        return None
    return os.path.join(str(config.trainer.default_local_dir), "metrics.jsonl")


def metrics_file_path(project: str, experiment: str, environ: Mapping[str, str]) -> str:
    """Where verl 0.9.1's `FileLogger` writes (`verl/utils/tracking.py`)."""
    return environ.get("VERL_FILE_LOGGER_PATH") or os.path.join(
        os.path.expanduser(environ.get("VERL_FILE_LOGGER_ROOT", ".")),
        project,
        f"{experiment}.jsonl",
    )


class ResumedLog:
    """The rows of a metrics file up to `resumed_step` (later ones the resumed run logs again),
    read now, written back into the file verl's `FileLogger` reopens."""

    def __init__(self, path: str, resumed_step: int) -> None:
        self.path, self.rows = path, []
        if os.path.isfile(path):
            for line in Path(path).read_bytes().splitlines():
                try:
                    step = json.loads(line)["step"]
                except (ValueError, KeyError, TypeError):
                    continue
                if isinstance(step, int) and step <= resumed_step:
                    self.rows.append(line + b"\n")

    def restore(self, tracking: Any) -> None:
        """Write the kept rows through the file logger of verl's `Tracking` (none: nothing)."""
        backend = getattr(tracking, "logger", {}).get("file")
        if backend is None:
            return
        for row in self.rows:
            backend.fp.write(row)
        self.rows = []


def write_resolved_config(config: Any, path: Path) -> None:
    """The config as the trainer sees it (interpolations resolved), as YAML, written atomically."""
    from omegaconf import OmegaConf

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(OmegaConf.to_yaml(config, resolve=True))
    os.replace(partial, path)


def record_checkpoint(config: Any, step: int) -> None:
    """After verl saved step `step`: the run's settings beside it, and at most
    `trainer.max_actor_ckpt_to_keep` folders (verl's workers forget those of a run before a
    resume)."""
    folder = checkpoints.checkpoint_folder(config)
    checkpoints.write_settings(folder, config, int(step))
    keep = config.trainer.get("max_actor_ckpt_to_keep", None)
    if keep:
        checkpoints.remove_older(folder, keep=int(keep))


def empty_training_set(config: Any, rows: int) -> str:
    """Why a run has no step to train (verl would log nothing and exit 0)."""
    batch = int(config.data.train_batch_size)
    filtered = bool(config.data.get("filter_overlong_prompts", False))
    return (
        f"no training step: the training set holds {rows} row(s) after verl's dataset read "
        f"{config.data.train_files}, fewer than data.train_batch_size={batch}"
        + (
            " (data.filter_overlong_prompts=true dropped every row verl could not measure or "
            "found longer than data.max_prompt_length: for image rows, qwen_vl_utils and "
            "torchvision must import; entropyrl doctor --recipe checks)"
            if filtered
            else ""
        )
    )
