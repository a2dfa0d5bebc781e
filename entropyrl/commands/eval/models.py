"""The models of a caption evaluation: `NAME=PATH` to the Hugging Face folder it is evaluated
from, merging a verl checkpoint with verl's model merger (a LoRA run's adapter folded in by
`entropyrl.commands.merge_lora`). A finished merge is reused by the next run.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

CHECKPOINT_MARKERS = ("fsdp_config.json", "huggingface")
# What verl's merger does not write and the checkpoint's huggingface/ folder has: the image
# processor and chat template the model is prompted with.
PROCESSOR_FILES = (
    "preprocessor_config.json",
    "processor_config.json",
    "chat_template.json",
    "chat_template.jinja",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "generation_config.json",
)


class EvalError(RuntimeError):
    """A setup problem, said in one line (exit status 2)."""


@dataclass
class ModelSource:
    """Where a model comes from and the Hugging Face folder it is evaluated from."""

    name: str
    given: str
    kind: str  # "hf" (used as is), "checkpoint" (merged first), "missing" (a dry run's)
    checkpoint: str | None = None  # the verl actor folder
    lora: bool = False
    path: str | None = None  # the Hugging Face folder (after merging)
    problem: str | None = None  # why a "missing" model cannot be used here

    def describe(self) -> str:
        if self.kind == "missing":
            return f"{self.given} (prerequisite not met: {self.problem})"
        if self.kind == "hf":
            return f"{self.path} (Hugging Face model, used as it is)"
        how = (
            "verl's model merger, then the LoRA adapter folded in"
            if self.lora
            else "verl's model merger"
        )
        return f"{self.checkpoint} (verl checkpoint, merged by {how} into {self.path})"


def _latest_step(run: Path) -> Path | None:
    steps = [
        step
        for step in run.glob("global_step_*")
        if step.name.split("_")[-1].isdigit() and (step / "actor").is_dir()
    ]
    return max(steps, key=lambda step: int(step.name.split("_")[-1]), default=None)


def _hub_style(given: str) -> bool:
    """`owner/name`, as a Hugging Face hub id is written (not a path)."""
    return given.count("/") == 1 and not given.startswith(("/", ".", "~"))


def _hub_snapshot(given: str) -> str | None:
    if not _hub_style(given):
        return None
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(given, local_files_only=True)
    except Exception:  # not cached (or no huggingface_hub): not a usable hub id
        return None


def resolve_model(name: str, given: str, out: Path) -> ModelSource:
    """Classify `given` (see the module docstring); merging happens later, in `prepare_model`."""
    path = Path(given).expanduser()
    target = out / name / "hf"
    if path.is_dir() and (path / "config.json").is_file():
        return ModelSource(name, given, "hf", path=str(path.resolve()))
    actor: Path | None = None
    if path.is_dir() and any((path / marker).exists() for marker in CHECKPOINT_MARKERS):
        actor = path
    elif path.is_dir() and (path / "actor").is_dir():
        actor = path / "actor"
    elif path.is_dir():
        step = _latest_step(path)
        if step is None:
            raise EvalError(
                f"model {name}={given}: neither a Hugging Face folder (config.json) nor a verl "
                "checkpoint (global_step_N/actor)"
            )
        actor = step / "actor"
    if actor is not None:
        lora = (actor / "lora_train_meta.json").is_file()
        merged = target / "merged" if lora else target
        return ModelSource(
            name, given, "checkpoint", checkpoint=str(actor.resolve()), lora=lora, path=str(merged)
        )
    if not _hub_style(given):
        raise EvalError(f"model {name}={given}: no such folder")
    snapshot = _hub_snapshot(given)
    if snapshot is None:
        raise EvalError(
            f"model {name}={given}: not a local folder nor a model in the Hugging Face cache "
            f"(download it first: hf download {given})"
        )
    return ModelSource(name, given, "hf", path=snapshot)


def parse_models(entries: Sequence[str], out: Path, *, dry_run: bool = False) -> list[ModelSource]:
    """The `--model NAME=PATH` entries; in a dry run (`dry_run`) a model that cannot be
    resolved is kept as "missing", with the reason, instead of stopping."""
    models: list[ModelSource] = []
    for entry in entries:
        name, sep, given = entry.partition("=")
        if not sep or not name or not given:
            raise EvalError(f"--model {entry!r}: expected NAME=PATH")
        if not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise EvalError(f"--model {entry!r}: NAME may hold letters, digits, '-', '_', '.'")
        if any(model.name == name for model in models):
            raise EvalError(f"--model {name} is given twice")
        try:
            models.append(resolve_model(name, given, out))
        except EvalError as error:
            if not dry_run:
                raise
            models.append(ModelSource(name, given, "missing", problem=str(error)))
    if not models and not dry_run:
        raise EvalError("no --model given (NAME=PATH; the first is the base of the comparison)")
    return models


def prepare_model(model: ModelSource, *, python: str = sys.executable) -> None:
    """Merge a checkpoint into `model.path` (once: a finished merge is reused)."""
    if model.kind != "checkpoint":
        return
    target = Path(model.path).parent if model.lora else Path(model.path)
    stamp = Path(model.path) / "MERGED_FROM"
    if stamp.is_file() and stamp.read_text().strip() == model.checkpoint:
        return
    shutil.rmtree(target, ignore_errors=True)
    _run(
        [
            python,
            "-m",
            "verl.model_merger",
            "merge",
            "--backend",
            "fsdp",
            "--local_dir",
            model.checkpoint,
            "--target_dir",
            str(target),
        ],
        f"verl's model merger on {model.checkpoint}",
    )
    # verl's merger writes weights, config and tokenizer; the image processor and chat template
    # are in the checkpoint's huggingface/ folder
    hf = Path(model.checkpoint) / "huggingface"
    for name in PROCESSOR_FILES:
        if (hf / name).is_file() and not (target / name).exists():
            shutil.copy2(hf / name, target / name)
    if model.lora:
        from entropyrl.commands.merge_lora import merge_lora

        merge_lora(target, model.path)
        for name in PROCESSOR_FILES:
            if (target / name).is_file() and not (Path(model.path) / name).exists():
                shutil.copy2(target / name, Path(model.path) / name)
    stamp.write_text(model.checkpoint + "\n")


def _run(command: list[str], what: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise EvalError(f"{what} failed (exit {result.returncode}):\n{tail}")
