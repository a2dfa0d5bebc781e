"""What a run will take, before it starts: steps, the image tensors verl holds in host memory per
step and per validation batch, and the checkpoints' disk (printed by `--dry-run`).

- Steps: verl's trainer takes `len(train set) // data.train_batch_size` steps per epoch (its
  sampler drops the last partial batch) for `trainer.total_epochs`, unless
  `trainer.total_training_steps` is set; validation runs before training (`val_before_train`)
  and every `trainer.test_freq` steps, in batches of `data.val_batch_size` prompts.
- Image tensors: verl's agent loop returns every sample with its processor outputs, and
  TransferQueue keeps a step's samples in host memory; a Qwen-VL processor's `pixel_values` are
  float32, one row of channels x temporal patch x patch x patch values per patch of the resized
  image (`pixel_values_bytes`, checked against the processor's own output in
  tests/verl/test_budget.py). Sizes come from the image sizes `entropyrl prepare coco` records.
- Checkpoints: verl's FSDP checkpoint holds the model in float32 (4 bytes a parameter) and
  Adam's two moments (8), and with LoRA the whole model plus the adapters' moments (4P + 12L,
  docs/lora.md); `trainer.max_actor_ckpt_to_keep` of them stay on disk.

GPU and host memory, the disk line's adapter count and the estimated step time are
`entropyrl.verl.checks.plan`'s; a run's own `timing_s/step` (in `metrics.jsonl`) after the first
steps replaces the estimate.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from entropyrl.data.prompt_length import VisionGrid
from entropyrl.models.images import SPATIAL_MERGE_SIZE, smart_resize

FLOAT32 = 4
CHANNELS = 3
FULL_CHECKPOINT_BYTES_PER_PARAMETER = 12  # fp32 weights + Adam's exp_avg and exp_avg_sq


def pixel_values_bytes(
    width: int,
    height: int,
    grid: VisionGrid,
    temporal_patch_size: int = 2,
    image_patch_size: int | None = None,
) -> int:
    """Bytes of the float32 `pixel_values` a Qwen-VL processor makes of one image: the image
    resized by `fetch_image` and the processor, cut into patch x patch squares, each a row of
    channels x temporal_patch_size x patch x patch values."""
    fetch_factor = (image_patch_size or grid.patch_size) * SPATIAL_MERGE_SIZE
    h, w = smart_resize(height, width, fetch_factor)
    h, w = smart_resize(h, w, grid.factor, grid.min_pixels, grid.max_pixels)
    patches = (h // grid.patch_size) * (w // grid.patch_size)
    row = CHANNELS * temporal_patch_size * grid.patch_size**2
    return patches * row * FLOAT32


def temporal_patch_size(model_dir: str | Path) -> int:
    folder = Path(model_dir)
    for name in ("preprocessor_config.json", "processor_config.json"):
        path = folder / name
        if path.is_file():
            config = json.loads(path.read_text())
            config = config.get("image_processor", config)
            return int(config.get("temporal_patch_size", 2))
    return 2


def parameter_count(model_dir: str | Path) -> int:
    """Parameters of the model in `model_dir` (config.json), built on the meta device: no
    weights are read; tied embeddings count once."""
    import torch
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):
        model = _model_class(config).from_config(config)
    return sum(p.numel() for p in model.parameters())


def _model_class(config: Any) -> Any:
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    if getattr(config, "vision_config", None) is not None:
        return AutoModelForImageTextToText
    return AutoModelForCausalLM


def checkpoint_bytes(parameters: int, adapter_parameters: int = 0) -> int:
    """One actor checkpoint: the model in fp32 and Adam's moments of what trains."""
    if adapter_parameters:
        return FLOAT32 * parameters + 12 * adapter_parameters
    return FULL_CHECKPOINT_BYTES_PER_PARAMETER * parameters


@dataclass(frozen=True)
class Budget:
    train_rows: int
    steps_per_epoch: int
    total_steps: int
    val_rows: int
    val_batches: int
    validations: int
    rows_per_step: int
    rows_per_val_batch: int
    step_pixel_bytes: tuple[int, int] | None  # (all images the mean size, all the largest)
    val_pixel_bytes: tuple[int, int] | None
    checkpoint_bytes: int | None
    kept_checkpoints: int
    adapter_parameters: int = 0


def _mean_and_max(sizes: Mapping[tuple[int, int], int], bytes_of: Any) -> tuple[float, int]:
    total = sum(sizes.values())
    values = {size: bytes_of(*size) for size in sizes}
    mean = sum(values[size] * count for size, count in sizes.items()) / max(total, 1)
    return mean, max(values.values(), default=0)


def budget(
    config: Any,
    train_rows: int,
    val_rows: int,
    image_sizes: Mapping[str, Mapping[tuple[int, int], int]] | None = None,
    grid: VisionGrid | None = None,
    temporal: int = 2,
    parameters: int | None = None,
    adapter_parameters: int = 0,
) -> Budget:
    """The figures above for a composed config, its data sets' row counts and (for images)
    each split's image sizes {(width, height): count} and the processor's grid."""
    from omegaconf import OmegaConf

    def get(key: str, default: Any = None) -> Any:
        return OmegaConf.select(config, key, default=default)

    batch = int(get("data.train_batch_size"))
    n = int(get("actor_rollout_ref.rollout.n", 1))
    steps_per_epoch = train_rows // batch
    total = get("trainer.total_training_steps")
    total_steps = int(total) if total else steps_per_epoch * int(get("trainer.total_epochs", 1))
    val_batch = get("data.val_batch_size") or val_rows
    val_batch = min(int(val_batch), val_rows) if val_rows else int(val_batch)
    val_n = int(get("actor_rollout_ref.rollout.val_kwargs.n", 1) or 1)
    test_freq = int(get("trainer.test_freq", -1) or -1)
    validations = int(bool(get("trainer.val_before_train", True)))
    if test_freq > 0:
        validations += total_steps // test_freq + (total_steps % test_freq != 0)
    step_bytes = val_bytes = None
    if image_sizes and grid is not None:

        def bytes_of(width: int, height: int) -> int:
            return pixel_values_bytes(width, height, grid, temporal)

        train = image_sizes.get("train") or {}
        val = image_sizes.get("val") or {}
        if train:
            mean, most = _mean_and_max(train, bytes_of)
            step_bytes = (round(mean * batch * n), most * batch * n)
        if val:
            mean, most = _mean_and_max(val, bytes_of)
            val_bytes = (round(mean * val_batch * val_n), most * val_batch * val_n)
    return Budget(
        train_rows=train_rows,
        steps_per_epoch=steps_per_epoch,
        total_steps=total_steps,
        val_rows=val_rows,
        val_batches=-(-val_rows // val_batch) if val_batch else 0,
        validations=validations,
        rows_per_step=batch * n,
        rows_per_val_batch=val_batch * val_n,
        step_pixel_bytes=step_bytes,
        val_pixel_bytes=val_bytes,
        checkpoint_bytes=None
        if parameters is None
        else checkpoint_bytes(parameters, adapter_parameters),
        kept_checkpoints=int(get("trainer.max_actor_ckpt_to_keep", 0) or 0),
        adapter_parameters=adapter_parameters,
    )


def _gb(value: float) -> str:
    return f"{value / 1e9:.1f} GB"


def describe(b: Budget) -> list[str]:
    """The budget as the dry-run prints it, one line each."""
    lines = [
        f"steps: {b.steps_per_epoch} per epoch ({b.train_rows} training rows), "
        f"{b.total_steps} in all",
        f"validation: {b.validations} time(s), each {b.val_batches} batch(es) of up to "
        f"{b.rows_per_val_batch} samples ({b.val_rows} rows)",
    ]
    if b.step_pixel_bytes is not None:
        mean, most = b.step_pixel_bytes
        lines.append(
            f"host memory: the image tensors of a step's {b.rows_per_step} samples, "
            f"{_gb(mean)} (images of the mean size; {_gb(most)} were all the largest), held in "
            "TransferQueue"
        )
    if b.val_pixel_bytes is not None:
        mean, most = b.val_pixel_bytes
        lines.append(
            f"host memory: a validation batch's image tensors, {_gb(mean)} (up to {_gb(most)})"
        )
    if b.checkpoint_bytes is not None:
        what = (
            "fp32 model and Adam's moments of the adapters (4P + 12L)"
            if b.adapter_parameters
            else "fp32 model and Adam's moments (12P)"
        )
        kept = f", {_gb(b.checkpoint_bytes * b.kept_checkpoints)} for the {b.kept_checkpoints} kept"
        lines.append(
            f"disk: {_gb(b.checkpoint_bytes)} per checkpoint ({what}, computed)"
            + (kept if b.kept_checkpoints else ", every one kept (max_actor_ckpt_to_keep unset)")
        )
    return lines


def sizes_from_manifest(data_dir: Path) -> dict[str, dict[tuple[int, int], int]] | None:
    """Each split's {(width, height): count} from `entropyrl prepare coco`'s manifest.json."""
    try:
        recorded = json.loads((data_dir / "manifest.json").read_text())["image_sizes"]
        return {
            split: {tuple(int(v) for v in key.split("x")): int(c) for key, c in counts.items()}
            for split, counts in recorded.items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def data_files(config: Any, key: str) -> list[str]:
    """`data.train_files` / `data.val_files` as a list (verl takes one path or several)."""
    from omegaconf import OmegaConf

    value = OmegaConf.select(config, key, default=None)
    return [str(value)] if isinstance(value, str) else [str(f) for f in value or []]


def parquet_rows(files: Iterable[Any]) -> int | None:
    """Rows of the parquet files from their metadata (no row read); None when one is missing
    or not parquet."""
    try:
        import pyarrow.parquet as pq

        return sum(pq.ParquetFile(str(f)).metadata.num_rows for f in files)
    except Exception:
        return None
