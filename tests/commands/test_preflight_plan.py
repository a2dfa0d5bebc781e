"""The plan through the commands a user runs: `bash examples/chair_mscoco.sh --dry-run` prints
GPU memory per rank, host memory per node, disk and an estimated time for the recipes' models
without a download, refuses a layout that does not fit in one line (exit 2), and it and
`entropyrl doctor` stop on a model without a chat template and a wandb logger without a key.

A stand-in `nvidia-smi` plays a node of 8 H100 80 GB GPUs (81,559 MiB each, as nvidia-smi
reports an H100 80GB HBM3), so the figures do not depend on the machine the tests run on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

H100_MIB = "81559"


@pytest.fixture()
def node_env(tmp_path: Path) -> dict[str, str]:
    folder = tmp_path / "bin"
    folder.mkdir()
    tool = folder / "nvidia-smi"
    names = "\\n".join(["NVIDIA H100 80GB HBM3"] * 8)
    tool.write_text(
        "#!/bin/sh\n"
        'case "$*" in *memory.total*) printf "' + "\\n".join([H100_MIB] * 8) + '\\n" ;; '
        '*driver_version*) echo "580.65.06" ;; '
        '*) printf "' + names + '\\n" ;; esac\n'
    )
    tool.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "LORA_", "N_GPUS"))}
    env.update(
        PATH=f"{folder}:{os.environ['PATH']}",
        HOME=str(tmp_path),  # no ~/.netrc with W&B credentials
        PYTHON=sys.executable,
        MODEL_PATH="Qwen/Qwen2.5-VL-3B-Instruct",
        DATA_DIR=str(tmp_path / "no_data"),
        HF_HUB_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf"),  # nothing downloaded
    )
    return env


def dry_run(repo_root: Path, env: dict[str, str], *overrides: str, **more: str):
    result = subprocess.run(
        ["bash", "examples/chair_mscoco.sh", "--dry-run", *overrides],
        capture_output=True,
        text=True,
        cwd=repo_root,
        env={**env, **more},
        timeout=300,
    )
    return result.returncode, result.stderr.splitlines()


def test_full_3b_on_one_gpu_is_refused_with_a_fits_line(repo_root, node_env):
    """0.6 x 85.5 GB for vLLM + 16P = 60.1 GB of training state: 111.4 GB per rank."""
    status, lines = dry_run(repo_root, node_env, N_GPUS="1")
    errors = [line for line in lines if line.startswith("error:")]
    assert status == 2, "\n".join(lines[-20:])
    assert len(errors) == 1
    assert errors[0].startswith(
        "error: fits: no: full fine-tuning of Qwen2.5-VL-3B-Instruct on 1 GPU(s) needs 111.4 GB "
        "per rank"
    )
    assert "85.5 GB GPU (nvidia-smi)" in errors[0] and "LORA_RANK=64" in errors[0]


def test_lora_3b_on_one_gpu_passes(repo_root, node_env):
    """51.3 GB for vLLM + 4P + 16L = 16.9 GB: 68.2 GB of the 85.5."""
    status, lines = dry_run(repo_root, node_env, N_GPUS="1", LORA_RANK="64")
    assert status == 0, "\n".join(lines[-20:])
    gpu = next(line for line in lines if "budget: GPU memory per rank" in line)
    assert "68.2 GB of 85.5 GB (nvidia-smi)" in gpu


@pytest.mark.parametrize(
    ("model", "gpu", "host", "disk", "source"),
    [
        ("Qwen/Qwen2.5-VL-3B-Instruct", "53.4 GB", "132.1 GB", "16.5 GB", "Qwen2.5-VL-3B 1,800"),
        ("Qwen/Qwen2.5-VL-7B-Instruct", "55.8 GB", "204.7 GB", "35.1 GB", "Qwen2.5-VL-7B 2,000"),
        ("Qwen/Qwen3-VL-4B-Instruct", "53.8 GB", "143.1 GB", "19.3 GB", "Qwen2.5-VL-3B 1,800"),
    ],
)
def test_the_budget_of_the_recipes_models_without_a_download(
    repo_root, node_env, model, gpu, host, disk, source
):
    """LORA_RANK=64 on one node of 8: every figure is there, the disk line with LoRA's. GPU:
    51.3 GB for vLLM + (4P + 16L) / 8; host: vLLM's weights asleep (2P x 8), 8 x 4 GiB of
    multimodal cache, the step's image tensors twice; disk 4P + 12L."""
    status, lines = dry_run(repo_root, node_env, N_GPUS="8", LORA_RANK="64", MODEL_PATH=model)
    assert status == 0, "\n".join(lines[-20:])
    budget = {
        line.split("budget: ", 1)[1].split(":")[0]: line for line in lines if "budget:" in line
    }
    assert budget["GPU memory per rank"].split(": ", 3)[3].startswith(f"{gpu} of 85.5 GB")
    assert f"host memory per node: {host} at most" in budget["host memory per node"]
    assert budget["disk"].split("budget: ")[1].startswith(f"disk: {disk} per checkpoint")
    time = budget["time"]
    assert "time: estimate" in time and "EasyR1 v0.3.2 assets/baselines.md" in time
    assert f"{source} tokens/s/GPU" in time


def _model_without_template(folder: Path) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "Qwen2Tokenizer"}))
    return folder


def test_no_chat_template_and_no_wandb_key_would_stop_the_dry_run(repo_root, node_env, tmp_path):
    model = _model_without_template(tmp_path / "model")
    _, lines = dry_run(
        repo_root, node_env, "trainer.logger=[console,wandb]", N_GPUS="8", MODEL_PATH=str(model)
    )
    stops = [line for line in lines if line.startswith("# dry-run: would stop:")]
    assert any(f"chat template: {model} has none" in line for line in stops), lines
    assert any("trainer.logger has wandb but WANDB_API_KEY is not set" in line for line in stops)
    _, lines = dry_run(
        repo_root,
        node_env,
        "trainer.logger=[console,wandb]",
        N_GPUS="8",
        MODEL_PATH=str(model),
        WANDB_API_KEY="x" * 40,
    )
    assert not any("WANDB_API_KEY" in line for line in lines if "would stop" in line)


def test_no_chat_template_and_no_wandb_key_are_doctor_problems(repo_root, node_env, tmp_path):
    model = _model_without_template(tmp_path / "model")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "entropyrl",
            "doctor",
            "--recipe",
            "chair_mscoco",
            f"actor_rollout_ref.model.path={model}",
            "trainer.logger=[console,wandb]",
        ],
        capture_output=True,
        text=True,
        cwd=repo_root,
        env=node_env,
        timeout=300,
    )
    lines = result.stdout.splitlines()
    assert result.returncode == 1
    assert any(
        line.startswith(f"PROBLEM inputs: chat template: {model} has none") for line in lines
    )
    assert any(line.startswith("PROBLEM config: trainer.logger has wandb") for line in lines)


def test_the_doctor_says_fits_as_the_dry_run_does(repo_root, node_env):
    """`entropyrl doctor --recipe` on one GPU: the same "fits: no" as a PROBLEM line."""
    result = subprocess.run(
        [
            sys.executable, "-m", "entropyrl", "doctor", "--recipe", "chair_mscoco",
            "trainer.n_gpus_per_node=1",
        ],
        capture_output=True, text=True, cwd=repo_root, env=node_env, timeout=300,
    )  # fmt: skip
    fits = [line for line in result.stdout.splitlines() if "fits: no" in line]
    assert result.returncode == 1
    assert len(fits) == 1 and fits[0].startswith("PROBLEM ")
    assert "full fine-tuning of Qwen2.5-VL-3B-Instruct on 1 GPU(s) needs 111.4 GB" in fits[0]
