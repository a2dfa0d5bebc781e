"""`--dry-run` of the verl launch scripts states the resources from the overrides and the hardware.

nvidia-smi is replaced by a stand-in on PATH that lists a chosen number of GPUs (none: it fails,
as it does on a machine without a driver), so the checks hold on any machine.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRAINING = ("chair_mscoco.sh", "egpo_function_calling.sh", "grpo_function_calling.sh")


def _fake_nvidia_smi(folder: Path, gpus: int) -> Path:
    folder.mkdir(exist_ok=True)
    script = folder / "nvidia-smi"
    if gpus:
        body = "".join(f"echo 'NVIDIA H100 80GB HBM3 #{i}'\n" for i in range(gpus))
    else:
        body = "echo 'NVIDIA-SMI has failed because it could not communicate with the driver' >&2\nexit 9\n"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return folder


def dry_run(tmp_path: Path, name: str, *args: str, gpus: int = 0, env=None):
    full_env = dict(os.environ)
    full_env.pop("N_GPUS", None)
    full_env.pop("DRY_RUN", None)
    bin_dir = _fake_nvidia_smi(tmp_path / "bin", gpus)
    full_env["PATH"] = f"{bin_dir}{os.pathsep}{full_env.get('PATH', '')}"
    (tmp_path / "model").mkdir(exist_ok=True)
    full_env.update({"DATA_DIR": str(tmp_path / "data"), "MODEL_PATH": str(tmp_path / "model")})
    full_env.update(env or {})
    result = subprocess.run(
        ["bash", str(REPO / "examples" / name), "--dry-run", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result


def _resources(result) -> str:
    lines = [line for line in result.stderr.splitlines() if "dry-run: resources:" in line]
    assert len(lines) == 1, result.stderr
    return lines[0]


def _gpus_per_node(result) -> list[str]:
    argv = shlex.split(result.stdout.strip().splitlines()[-1])
    return [a.split("=", 1)[1] for a in argv if a.startswith("trainer.n_gpus_per_node=")]


@pytest.mark.parametrize("name", TRAINING)
def test_no_gpu_is_said_plainly_and_the_plan_names_its_layout(tmp_path, name):
    """Without a GPU the plan is for the config's own GPUs per node, and says so."""
    result = dry_run(tmp_path, name, "trainer.total_epochs=1", gpus=0)
    line = _resources(result)
    assert "1 node(s) x 8 GPU(s) per node = 8 GPU(s)" in line
    assert "GPUs per node: the config (no GPU here: nvidia-smi lists 0; N_GPUS=" in line
    assert "no GPU on the local host" in result.stderr
    assert f"bash {REPO}/examples/{name} --smoke" in result.stderr
    assert _gpus_per_node(result) == []  # the config's value stands
    assert "# dry-run: batch layout: 1 node(s) x 8 GPU(s) = 8 GPU(s)" in result.stderr


def test_gpus_per_node_come_from_what_nvidia_smi_lists(tmp_path):
    result = dry_run(tmp_path, "chair_mscoco.sh", gpus=2)
    line = _resources(result)
    assert "1 node(s) x 2 GPU(s) per node = 2 GPU(s)" in line and "nvidia-smi lists 2" in line
    assert "the GPUs this process sees" in line
    assert "no GPU" not in result.stderr
    assert _gpus_per_node(result) == ["2"]


def test_n_gpus_names_its_source(tmp_path):
    result = dry_run(tmp_path, "egpo_function_calling.sh", gpus=4, env={"N_GPUS": "2"})
    assert "1 node(s) x 2 GPU(s) per node = 2 GPU(s)" in _resources(result)
    assert "GPUs per node: N_GPUS=2" in _resources(result)
    assert _gpus_per_node(result) == ["2"]


def test_overrides_win_and_a_short_machine_is_noted(tmp_path):
    result = dry_run(
        tmp_path, "chair_mscoco.sh", "trainer.nnodes=2", "trainer.n_gpus_per_node=4", gpus=2
    )
    line = _resources(result)
    assert "2 node(s) x 4 GPU(s) per node = 8 GPU(s)" in line
    assert "GPUs per node: trainer.n_gpus_per_node=4" in line
    assert "shows 2 GPU(s), fewer than the 4 per node" in result.stderr
    assert _gpus_per_node(result)[-1] == "4"  # the caller's override comes last: Hydra takes it


def test_resources_go_to_stderr_so_stdout_stays_the_commands(tmp_path):
    result = dry_run(tmp_path, "chair_mscoco.sh", gpus=1)
    assert "dry-run:" not in result.stdout
    assert all(not line.startswith("#") for line in result.stdout.splitlines())


def test_eval_says_when_there_is_no_gpu(tmp_path):
    result = dry_run(tmp_path, "eval_function_calling.sh", gpus=0)
    assert "resources: generation on TP=1 GPU(s)" in result.stderr
    assert "no GPU on the local host (nvidia-smi lists 0)" in result.stderr
