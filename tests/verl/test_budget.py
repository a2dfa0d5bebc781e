"""`entropyrl.verl.checks.budget`: the dry-run's figures against their sources. The image tensors'
bytes against what the processor itself returns for real-size images, the steps against verl's
own dataloader arithmetic, the checkpoint bytes against a real verl checkpoint (the caption
smoke's, tests/rig/smoke/test_smoke.py), and the dry-run printing them."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from entropyrl.data.prompt_length import VisionGrid
from entropyrl.verl.checks import budget

REAL_SIZES = [(640, 480), (500, 375), (427, 640), (97, 33)]


@pytest.fixture(scope="module")
def processor():
    """A Qwen2.5-VL image processor at the real model's pixel limits (4..16384 merged
    patches of 28 px), Pillow only."""
    from entropyrl.rig.tokenizer import build_qwen2vl_processor, build_qwen_tokenizer

    processor = build_qwen2vl_processor(build_qwen_tokenizer(num_ranks=1024), image_size=112)
    processor.image_processor.size = {"shortest_edge": 4 * 28**2, "longest_edge": 16384 * 28**2}
    return processor


@pytest.mark.parametrize("size", REAL_SIZES, ids=[f"{w}x{h}" for w, h in REAL_SIZES])
def test_the_image_tensor_bytes_are_the_processors(processor, size):
    from entropyrl.models.images import fetch_image

    image = Image.fromarray(np.full((size[1], size[0], 3), 90, dtype=np.uint8))
    resized = fetch_image({"image": image}, 14)
    pixels = processor.image_processor(images=[resized], return_tensors="np")["pixel_values"]
    grid = VisionGrid(patch_size=14, merge_size=2, min_pixels=3136, max_pixels=12845056)
    assert pixels.dtype == np.float32
    assert budget.pixel_values_bytes(*size, grid) == pixels.nbytes


def test_a_coco_image_is_7_4_mb_and_a_step_of_them_18_8_gb(compose):
    """640 x 480 at Qwen2.5-VL's limits: 476 x 644 px, 34 x 46 patches of 14 px, 1,176 float32
    values each; the recipe's step holds 512 prompts x n=5 of them."""
    grid = VisionGrid(patch_size=14, merge_size=2, min_pixels=3136, max_pixels=12845056)
    one = budget.pixel_values_bytes(640, 480, grid)
    assert one == 34 * 46 * 3 * 2 * 14 * 14 * 4 == 7_357_056
    plan = budget.budget(
        compose("chair_mscoco"),
        train_rows=82_783,
        val_rows=5_000,
        image_sizes={"train": {(640, 480): 10}, "val": {(640, 480): 1}},
        grid=grid,
        parameters=3_754_622_976,
    )
    assert plan.rows_per_step == 2560 and plan.step_pixel_bytes == (one * 2560, one * 2560)
    assert plan.rows_per_val_batch == 512 and plan.val_pixel_bytes == (one * 512, one * 512)
    assert plan.steps_per_epoch == 82_783 // 512 == plan.total_steps  # total_epochs 1
    assert plan.validations == 1 + 4  # before training, then at 50, 100, 150 and the last (161)
    assert plan.val_batches == 10
    assert plan.checkpoint_bytes == 12 * 3_754_622_976 and plan.kept_checkpoints == 2
    lines = budget.describe(plan)
    assert lines[0] == "steps: 161 per epoch (82783 training rows), 161 in all"
    assert "a step's 2560 samples, 18.8 GB" in lines[2]
    assert (
        lines[4].startswith("disk: 45.1 GB per checkpoint")
        and "90.1 GB for the 2 kept" in (lines[4])
    )


def test_the_steps_are_verls(compose, tmp_path):
    """verl's trainer: len(dataset) // train_batch_size per epoch (its sampler drops the last
    partial batch), times total_epochs unless total_training_steps is set."""
    cfg = compose("chair_mscoco", ["data.train_batch_size=8", "trainer.total_epochs=3"])
    plan = budget.budget(cfg, train_rows=30, val_rows=12)
    assert (plan.steps_per_epoch, plan.total_steps) == (3, 9)
    cfg = compose("chair_mscoco", ["data.train_batch_size=8", "trainer.total_training_steps=5"])
    assert budget.budget(cfg, train_rows=30, val_rows=12).total_steps == 5


def test_the_parameters_of_a_model_folder(tmp_path):
    from entropyrl.rig.tiny import TinyModelConfig, build_tiny_qwen2_5_vl
    from entropyrl.rig.tokenizer import build_qwen_tokenizer

    model = build_tiny_qwen2_5_vl(build_qwen_tokenizer(num_ranks=1024), TinyModelConfig())
    model.save_pretrained(tmp_path)
    assert budget.parameter_count(tmp_path) == sum(p.numel() for p in model.parameters())


def test_the_dry_run_prints_the_budget(repo_root, tmp_path):
    """The preflight's dry run on prepared data and a model folder."""
    from entropyrl.data.coco import prepare_coco
    from entropyrl.rig.synthetic import build_synthetic_coco

    world = build_synthetic_coco(tmp_path / "world", num_train=6, num_test=2, image_size=112)
    data = tmp_path / "data"
    prepare_coco(world.root, world.root, data, val_size=1, test_size=1)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))  # no weights
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "entropyrl.commands.preflight",
            "chair_mscoco",
            "--mode",
            "smoke",
            "--dry-run",
            "--",
            f"data.train_files={data / 'train.parquet'}",
            f"data.val_files={data / 'val.parquet'}",
            f"actor_rollout_ref.model.path={model}",
            "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "trainer.n_gpus_per_node=1",
        ],
        capture_output=True,
        text=True,
        cwd=repo_root,
        timeout=300,
    )
    lines = [line for line in result.stderr.splitlines() if "budget:" in line]
    assert result.returncode == 0, result.stderr[-2000:]
    assert lines[0] == "# dry-run: budget: steps: 3 per epoch (6 training rows), 3 in all"
    assert lines[1].startswith("# dry-run: budget: validation: 2 time(s), each 1 batch(es)")
    # a stand-in config.json and a smoke: no model numbers, no GPU plan, no time estimate
    assert lines[-1].startswith("# dry-run: budget: GPU memory, host memory and time: not computed")


def test_the_mean_image_size_is_weighted_by_how_many_images_have_it() -> None:
    """Three small images and one large: the host-memory plan's mean is 175 bytes, not 250."""
    from entropyrl.verl.checks.budget import _mean_and_max

    assert _mean_and_max({(10, 10): 3, (20, 20): 1}, lambda w, h: w * h) == (175.0, 400)
