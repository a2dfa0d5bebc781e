"""Two inputs a run reads only once its workers are up, checked before: the model folder's chat
template and the W&B credentials of a `wandb` logger.

Without them a run stops late and long: building a prompt (`apply_chat_template`) on a tokenizer
without a template is a traceback, and `wandb.init` runs when verl's trainer creates its
`Tracking` logger at the start of `fit` (verl/trainer/ppo/v1/trainer_base.py), after Ray, the
workers and the models have started, where it asks for a key or fails. Each is one "would stop"
line with its fix. No verl import.
"""

from __future__ import annotations

import json
import netrc
import os
from pathlib import Path
from typing import Any

from entropyrl.verl.checks.findings import Finding
from entropyrl.verl.checks.findings import select as _select

# Where transformers keeps a chat template: a file of its own (a processor's or a tokenizer's)
# or a key of the tokenizer's or processor's config.
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
TEMPLATE_KEYS_IN = ("tokenizer_config.json", "processor_config.json")
WANDB_HOST = "api.wandb.ai"
# W&B modes that write locally and need no key
WANDB_KEYLESS_MODES = frozenset({"offline", "disabled", "dryrun"})


def model_folder(model: str) -> Path | None:
    """The folder holding `model`: itself when it is a local folder, else its snapshot in the
    Hugging Face cache; None when it is neither (the inputs check says so)."""
    if not model:
        return None
    if Path(model).is_dir():
        return Path(model)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, local_files_only=True))
    except Exception:
        return None


def template_source(folder: Path) -> str | None:
    """The file in `folder` that holds a chat template, or None when none does."""
    for name in TEMPLATE_FILES:
        if (folder / name).is_file():
            return name
    for name in TEMPLATE_KEYS_IN:
        try:
            settings = json.loads((folder / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(settings, dict) and settings.get("chat_template"):
            return f"{name} (chat_template)"
    return None


def chat_template_findings(config: Any) -> list[Finding]:
    """The policy's tokenizer folder (`actor_rollout_ref.model.tokenizer_path`, else the model
    path) has a chat template: verl builds every prompt with it. Nothing when the folder is not
    here (the inputs check reports the model)."""
    model = str(
        _select(config, "actor_rollout_ref.model.tokenizer_path")
        or _select(config, "actor_rollout_ref.model.path", "")
    )
    folder = model_folder(model)
    if folder is None:
        return []
    source = template_source(folder)
    if source:
        return [Finding("inputs", True, f"chat template: {model}: {source}")]
    return [
        Finding(
            "inputs",
            False,
            f"chat template: {model} has none (no chat_template in tokenizer_config.json, no "
            "chat_template.jinja or chat_template.json): verl builds every prompt with it; use "
            "the instruct model's folder (e.g. Qwen/Qwen2.5-VL-3B-Instruct) or copy its "
            f"chat_template.jinja into {folder}",
        )
    ]


def _netrc_has_wandb(environ: dict[str, str]) -> bool:
    """A netrc entry for W&B's host (NETRC, else ~/.netrc), as `wandb login` writes it."""
    path = Path(environ.get("NETRC") or Path(environ.get("HOME") or Path.home()) / ".netrc")
    try:
        return netrc.netrc(str(path)).authenticators(WANDB_HOST) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def logger_findings(config: Any, environ: dict[str, str] | None = None) -> list[Finding]:
    """A `wandb` entry in `trainer.logger` has credentials here: WANDB_API_KEY, or a netrc entry
    for api.wandb.ai, or a W&B mode that needs none (WANDB_MODE=offline|disabled). Nothing when
    the run does not log to W&B. `environ` defaults to this process's environment."""
    environ = dict(os.environ) if environ is None else environ
    loggers = _select(config, "trainer.logger", [])
    loggers = [loggers] if isinstance(loggers, str) else list(loggers)
    if "wandb" not in loggers:
        return []
    mode = environ.get("WANDB_MODE", "").lower()
    if environ.get("WANDB_API_KEY"):
        source = "WANDB_API_KEY"
    elif mode in WANDB_KEYLESS_MODES:
        source = f"WANDB_MODE={mode}, no key needed"
    elif _netrc_has_wandb(environ):
        source = f"netrc entry for {WANDB_HOST}"
    else:
        return [
            Finding(
                "config",
                False,
                "trainer.logger has wandb but WANDB_API_KEY is not set and no netrc entry for "
                f"{WANDB_HOST} exists: export WANDB_API_KEY=... (or run `wandb login`) before "
                "the launch, WANDB_MODE=offline to log locally, or drop wandb from "
                "trainer.logger",
            )
        ]
    return [Finding("config", True, f"wandb logger: {source}")]
