"""With verl's overlong-prompt filter off, proof that every prompt fits.

verl's `data.filter_overlong_prompts` opens and processes every image of both splits before the
first step; the caption recipe turns it off and this check proves the bound instead, from the
image sizes and prompts `entropyrl prepare coco` records in each data folder's `manifest.json`
(`entropyrl.data.prompt_length`: verl's own count, tested). Run before Ray by the launch's
preflight and by `main_ppo`'s validation (`entropyrl.verl.checks.validation`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _select(config: Any, key: str, default: Any = None) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.select(config, key, default=default)


def model_folder(model: str) -> Path | None:
    """The model's local folder: the path itself, or its snapshot in the Hugging Face cache."""
    if Path(model).is_dir():
        return Path(model)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, local_files_only=True))
    except Exception:
        return None


def prompt_bound(config: Any) -> list[tuple[bool, str]]:
    """With verl's length filter off, prove every prompt fits `data.max_prompt_length`.

    For an image model, from the image sizes and prompts `entropyrl prepare coco` records in
    each data folder's `manifest.json` (`entropyrl.data.prompt_length`: verl's own count,
    tested); and `rollout.max_model_len`, when set, holds a prompt and a response. Nothing to
    prove where the inputs are not there yet (the launch script names them next)."""
    findings: list[tuple[bool, str]] = []
    limit = int(_select(config, "data.max_prompt_length", 1024))
    response = int(_select(config, "data.max_response_length", 0))
    context = _select(config, "actor_rollout_ref.rollout.max_model_len")
    if context is not None and int(context) < limit + response:
        findings.append(
            (
                False,
                f"actor_rollout_ref.rollout.max_model_len={context} is shorter than a prompt and "
                f"its response (data.max_prompt_length + data.max_response_length = "
                f"{limit + response}): set it to {limit + response}",
            )
        )
    if _select(config, "data.filter_overlong_prompts", True):
        return findings
    folder = model_folder(str(_select(config, "actor_rollout_ref.model.path", "")))
    if folder is None or not (
        (folder / "preprocessor_config.json").is_file()
        or (folder / "processor_config.json").is_file()
    ):
        return findings  # no model here yet, or a text model: no images to bound
    from entropyrl.verl.checks.budget import data_files

    files = data_files(config, "data.train_files") + data_files(config, "data.val_files")
    if not files or not all(Path(str(f)).is_file() for f in files):
        return findings
    prompts, sizes = [], set()
    for data in sorted({Path(str(f)).resolve().parent for f in files}):
        manifest = data / "manifest.json"
        try:
            recorded = json.loads(manifest.read_text())
            for counts in recorded["image_sizes"].values():
                sizes |= {tuple(int(v) for v in key.split("x")) for key in counts}
            prompts += recorded["prompts"]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            findings.append(
                (
                    False,
                    f"data.filter_overlong_prompts=false, and {manifest} records no image sizes "
                    "to prove every prompt fits data.max_prompt_length: prepare the data again "
                    "with entropyrl prepare coco (it records them), or set "
                    "data.filter_overlong_prompts=true (verl then opens every image before the "
                    "first step)",
                )
            )
            return findings
    from entropyrl.data.prompt_length import longest_prompt

    patch = _select(config, "data.image_patch_size")
    longest, size = longest_prompt(folder, prompts, sizes, int(patch) if patch else None)
    where = f"the largest image {size[0]}x{size[1]}" if size else "no image"
    findings.append(
        (
            longest <= limit,
            f"prompts: at most {longest} tokens ({where}, {len(sizes)} image sizes recorded) "
            + (
                f"<= data.max_prompt_length={limit}"
                if longest <= limit
                else f"> data.max_prompt_length={limit}: raise it to {longest} (and "
                "actor_rollout_ref.rollout.max_model_len with it), or set "
                "data.filter_overlong_prompts=true to drop the longer rows"
            ),
        )
    )
    return findings
