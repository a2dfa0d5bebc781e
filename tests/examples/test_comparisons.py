"""The captioning comparisons per model: `EXPERIMENT=baseline|entropyrl|penalty|reversed|clip_low`
are named after their model, so the 3B, 7B and Qwen3-VL-4B sets never share a checkpoint folder,
and examples/eval_chair_mscoco.sh evaluates one model's set from MODEL_PATH alone."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from entropyrl.commands.launch.evaluation import COMPARISONS
from entropyrl.commands.launch.recipes import (
    DEFAULT_CAPTION_MODEL,
    EXPERIMENTS,
    experiment_name,
    model_short_name,
)

REPO = Path(__file__).resolve().parents[2]
MODELS = {
    "Qwen/Qwen2.5-VL-3B-Instruct": "qwen2_5_vl_3b",
    "Qwen/Qwen2.5-VL-7B-Instruct": "qwen2_5_vl_7b",
    "Qwen/Qwen3-VL-4B-Instruct": "qwen3_vl_4b",
}


@pytest.mark.parametrize(
    ("path", "short"),
    [
        *MODELS.items(),
        ("/models/Qwen2.5-VL-7B-Instruct/", "qwen2_5_vl_7b"),
        ("Qwen3-VL-4B-Thinking", "qwen3_vl_4b_thinking"),  # another variant stays in the name
        (
            "/root/.cache/huggingface/hub/models--Qwen--Qwen3-VL-4B-Instruct/snapshots/"
            "0123456789abcdef0123456789abcdef01234567",
            "qwen3_vl_4b",
        ),
        ("ckpt/chair_mscoco_qwen2_5_vl_3b_baseline/global_step_40/actor/huggingface", None),
        ("", "model"),
    ],
)
def test_the_short_name_of_a_model(path: str, short: str | None) -> None:
    expected = short or "chair_mscoco_qwen2_5_vl_3b_baseline"  # a merged checkpoint: its run
    assert model_short_name(path) == expected


def test_the_recipes_own_name_is_its_models_entropyrl_run(compose) -> None:
    config = compose("chair_mscoco")
    assert config.actor_rollout_ref.model.path == DEFAULT_CAPTION_MODEL
    assert config.trainer.experiment_name == experiment_name(DEFAULT_CAPTION_MODEL, "entropyrl")
    assert config.trainer.experiment_name == "chair_mscoco_qwen2_5_vl_3b_entropyrl"


def _dry_run(tmp_path: Path, *args: str, script: str = "chair_mscoco.sh", **env: str):
    full_env = {k: v for k, v in os.environ.items() if k not in ("DRY_RUN", "RUNS", "CKPT_ROOT")}
    full_env.update(DATA_DIR=str(tmp_path / "data"), N_GPUS="8", **env)
    return subprocess.run(
        ["bash", str(REPO / "examples" / script), "--dry-run", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=tmp_path,
        timeout=300,
    )


@pytest.mark.parametrize("experiment", sorted(EXPERIMENTS))
@pytest.mark.parametrize("model", sorted(MODELS))
def test_each_models_comparison_runs_in_its_own_folder(compose, tmp_path, model, experiment):
    result = _dry_run(tmp_path, MODEL_PATH=model, EXPERIMENT=experiment)
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout.strip().splitlines()[-1])
    overrides = argv[argv.index("--config-name") + 2 :]
    name = f"chair_mscoco_{MODELS[model]}_{experiment}"
    assert f"trainer.experiment_name={name}" in overrides
    config = compose("chair_mscoco", overrides)
    assert config.trainer.experiment_name == name
    # verl's checkpoint folder follows the run name
    resolved = OmegaConf.to_container(config.trainer, resolve=True)
    assert resolved["default_local_dir"] == f"checkpoints/entropyrl/{name}"


def test_a_users_run_name_still_wins(tmp_path) -> None:
    result = _dry_run(tmp_path, "trainer.experiment_name=mine", EXPERIMENT="baseline")
    assert result.returncode == 0, result.stderr
    overrides = shlex.split(result.stdout.strip().splitlines()[-1])
    assert overrides[-1] == "trainer.experiment_name=mine"


def test_the_evaluation_takes_one_models_set_from_model_path(tmp_path) -> None:
    root = tmp_path / "ckpt"
    for short in ("qwen2_5_vl_3b", "qwen2_5_vl_7b"):
        for experiment in COMPARISONS:
            (root / f"chair_mscoco_{short}_{experiment}" / "global_step_5" / "actor").mkdir(
                parents=True
            )
    result = _dry_run(
        tmp_path,
        script="eval_chair_mscoco.sh",
        MODEL_PATH="Qwen/Qwen2.5-VL-7B-Instruct",
        CKPT_ROOT=str(root),
    )
    assert result.returncode == 0, result.stderr
    plan = result.stdout + result.stderr
    models = [line.strip() for line in plan.splitlines() if line.startswith("  ")]
    assert models[0].startswith("base: Qwen/Qwen2.5-VL-7B-Instruct")
    runs = [line.split(" ", 2)[:2] for line in models[1:]]
    assert runs == [
        [f"{name}:", f"{root}/chair_mscoco_qwen2_5_vl_7b_{name}/global_step_5/actor"]
        for name in COMPARISONS
    ]
    assert set(COMPARISONS) == set(EXPERIMENTS)  # every comparison the recipe trains
    assert "qwen2_5_vl_3b" not in plan
    # each model's set has its own results folder
    assert f"caption evaluation -> {REPO}/eval/chair_mscoco_qwen2_5_vl_7b" in plan


def test_a_missing_run_of_the_set_is_a_note_naming_its_command(tmp_path) -> None:
    result = _dry_run(
        tmp_path,
        script="eval_chair_mscoco.sh",
        MODEL_PATH="Qwen/Qwen3-VL-4B-Instruct",
        CKPT_ROOT=str(tmp_path / "none"),
    )
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: no checkpoint")]
    assert len(notes) == len(COMPARISONS) == 7
    assert notes[0] == (
        f"note: no checkpoint under {tmp_path}/none/chair_mscoco_qwen3_vl_4b_baseline: baseline "
        "left out (train it with MODEL_PATH=Qwen/Qwen3-VL-4B-Instruct EXPERIMENT=baseline bash "
        "examples/chair_mscoco.sh, trainer.save_freq > 0)"
    )
