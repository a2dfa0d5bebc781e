"""Before anything starts, a launch script composes its recipe with every override and refuses
what could not run, one line each: misspelt algorithm keys, batch geometry verl would assert on,
a CHAIR service other machines reach without a token, checkpoints not shared between nodes.

nvidia-smi is a stand-in on PATH listing a chosen number of GPUs, so the checks hold on any
machine; the scripts themselves, Hydra, verl's config and the checks are real.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRAINING = (
    "chair_mscoco.sh",
    "egpo_function_calling.sh",
    "grpo_function_calling.sh",
    "egpo_ratio_mixed.sh",
)
# What runs on a node without vLLM and flash-attn (the rollout and attention of the CPU smoke).
NO_VLLM_NO_FLASH = (
    "actor_rollout_ref.rollout.name=hf",
    "actor_rollout_ref.model.use_remove_padding=false",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
)


def _nvidia_smi(folder: Path, gpus: int) -> Path:
    folder.mkdir(exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + "".join(f"echo 'NVIDIA H100 #{i}'\n" for i in range(gpus)))
    script.chmod(0o755)
    return folder


def launch(tmp_path: Path, name: str, *args: str, gpus: int = 8, env=None, timeout=180):
    full_env = {k: v for k, v in os.environ.items() if k not in ("N_GPUS", "DRY_RUN")}
    full_env.pop("CUDA_VISIBLE_DEVICES", None)
    full_env.pop("CHAIR_SERVER_TOKEN", None)
    full_env["PATH"] = f"{_nvidia_smi(tmp_path / 'bin', gpus)}{os.pathsep}{full_env['PATH']}"
    full_env["RAY_TMPDIR"] = str(tmp_path / "ray")  # Ray would create it on start
    full_env.setdefault("DATA_DIR", str(tmp_path / "data"))
    full_env.setdefault("MODEL_PATH", str(tmp_path / "model"))
    full_env.update(env or {})
    return subprocess.run(
        ["bash", str(REPO / "examples" / name), *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=tmp_path,
        timeout=timeout,
    )


def errors(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def test_a_misspelt_key_stops_the_smoke_before_anything_starts(tmp_path):
    out = tmp_path / "run"
    result = launch(
        tmp_path,
        "chair_mscoco.sh",
        "--smoke",
        "--out",
        str(out),
        "+algorithm.clip_schedule.treshold=0.1",
    )
    assert result.returncode == 2
    assert errors(result) == [
        "error: algorithm.clip_schedule: unknown key 'treshold'; accepted: enable, rule, low, "
        "high, threshold, direction, neutral, saturation, temperature"
    ]
    assert "Traceback" not in result.stderr + result.stdout
    assert not (out / "assets").exists()  # no asset was built (minutes), no service started
    assert not (tmp_path / "ray").exists()  # Ray never started


def test_hydra_refuses_an_unknown_key_without_plus_in_one_line(tmp_path):
    result = launch(tmp_path, "chair_mscoco.sh", "--dry-run", "algorithm.clip_schedule.treshold=1")
    assert result.returncode == 2
    (line,) = errors(result)
    # Hydra's struct error, translated: the section's keys, not advice to append with `+`
    assert line == (
        "error: algorithm.clip_schedule: unknown key 'treshold'; accepted: enable, rule, low, "
        "high, threshold, direction, neutral, saturation, temperature"
    )
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name", TRAINING)
def test_every_recipe_passes_its_batch_geometry_at_eight_gpus(tmp_path, name):
    result = launch(tmp_path, name, "--dry-run", env={"N_GPUS": "8"})
    assert result.returncode == 0, result.stderr
    assert errors(result) == []
    assert "# dry-run: batch layout: 1 node(s) x 8 GPU(s) = 8 GPU(s)" in result.stderr
    assert re.search(r"# dry-run: batch update: \d+ mini-batch\(es\)", result.stderr)


def test_the_dry_run_prints_the_split_a_rank_gets(tmp_path):
    result = launch(tmp_path, "chair_mscoco.sh", "--dry-run", "trainer.nnodes=8", gpus=8)
    assert result.returncode == 0, result.stderr
    batch = [line for line in result.stderr.splitlines() if line.startswith("# dry-run: batch")]
    assert batch[:4] == [
        "# dry-run: batch layout: 8 node(s) x 8 GPU(s) = 64 GPU(s), 64 data-parallel actor rank(s)",
        "# dry-run: batch step: 512 prompts x n=5 = 2560 rows; 40 rows per rank",
        "# dry-run: batch update: 4 mini-batch(es) x 1 epoch(s) of 128 prompts x n=5 = 640 rows, "
        "10 rows per rank in micro-batches of 5 rows (2 per rank)",
        "# dry-run: batch old log-probs: 40 rows per rank in micro-batches of 10 rows",
    ]
    # the checkpoint folder of a multi-node run must be shared: noted in a dry run
    assert (
        "would stop: trainer.default_local_dir=checkpoints/entropyrl/chair_mscoco_model_entropyrl is relative"
        in (result.stderr)
    )


def test_a_geometry_verl_would_assert_on_is_refused_in_one_line(tmp_path):
    """The former recipe: 16 prompts x n=5 per mini-batch is 10 rows per rank on 8 GPUs."""
    old = (
        "data.train_batch_size=64",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    )
    result = launch(tmp_path, "chair_mscoco.sh", "--dry-run", *old, env={"N_GPUS": "8"})
    assert result.returncode == 2
    assert errors(result) == [
        "error: actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 does not divide the 10 "
        "rows each of 8 rank(s) gets per mini-batch (16 prompts x n=5 / 8); use 1, 2, 5 or 10"
    ]
    assert result.stdout == ""  # nothing printed to run


def test_gpus_are_counted_as_cuda_visible_devices_leaves_them(tmp_path):
    result = launch(
        tmp_path, "chair_mscoco.sh", "--dry-run", gpus=8, env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    )
    assert result.returncode == 0, result.stderr
    assert "1 node(s) x 4 GPU(s) per node = 4 GPU(s)" in result.stderr
    assert "nvidia-smi lists 8, CUDA_VISIBLE_DEVICES=0,1,2,3 leaves 4" in result.stderr
    assert "trainer.n_gpus_per_node=4" in result.stdout
    hidden = launch(tmp_path, "chair_mscoco.sh", gpus=8, env={"CUDA_VISIBLE_DEVICES": "-1"})
    assert hidden.returncode == 2
    assert "no GPU visible (nvidia-smi lists 8, CUDA_VISIBLE_DEVICES=-1 leaves 0)" in hidden.stderr


def test_a_service_other_machines_reach_needs_the_token(tmp_path):
    result = launch(tmp_path, "chair_mscoco.sh", "--dry-run", env={"CHAIR_HOST": "192.0.2.2"})
    assert result.returncode == 0
    assert (
        "prerequisite not met: the CHAIR service would listen on 192.0.2.2, where other machines "
        "reach it (1 node(s)), so it needs a token: export CHAIR_SERVER_TOKEN=" in result.stderr
    )
    with_token = launch(
        tmp_path,
        "chair_mscoco.sh",
        "--dry-run",
        env={"CHAIR_HOST": "192.0.2.2", "CHAIR_SERVER_TOKEN": "s3cret"},
    )
    assert "needs a token" not in with_token.stderr
    service, command = with_token.stdout.strip().splitlines()
    assert "--host 192.0.2.2" in service
    assert "reward_kwargs.chair_url=http://192.0.2.2:PORT" in command
    assert "s3cret" not in with_token.stdout + with_token.stderr  # never on a command line


def test_several_nodes_listen_on_this_nodes_address(tmp_path):
    address = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    assert address, "this machine has no non-loopback address"
    result = launch(
        tmp_path,
        "chair_mscoco.sh",
        "--dry-run",
        "trainer.nnodes=2",
        env={"CHAIR_SERVER_TOKEN": "s3cret"},
    )
    assert f"--host {address[0]}" in result.stdout.splitlines()[0]


def _inputs(tmp_path: Path) -> dict[str, str]:
    data, model = tmp_path / "data", tmp_path / "model"
    data.mkdir(exist_ok=True)
    model.mkdir(exist_ok=True)
    for name in ("train.parquet", "val.parquet", "cider_df.json.gz", "chair_ground_truth.json"):
        (data / name).write_text("{}")
    (model / "config.json").write_text("{}")
    (model / "chat_template.jinja").write_text("{{ messages }}")  # the launch checks it
    return {"DATA_DIR": str(data), "MODEL_PATH": str(model)}


def test_several_nodes_need_a_shared_checkpoint_folder(tmp_path):
    env = {**_inputs(tmp_path), "CHAIR_SERVER_TOKEN": "s3cret"}
    relative = launch(tmp_path, "chair_mscoco.sh", "trainer.nnodes=2", *NO_VLLM_NO_FLASH, env=env)
    assert relative.returncode == 2
    (line,) = errors(relative)
    assert line.startswith(
        "error: trainer.default_local_dir=checkpoints/entropyrl/chair_mscoco_model_entropyrl is relative: on 2 "
        "nodes"
    )
    local = tmp_path / "checkpoints"
    args = ("trainer.nnodes=2", f"trainer.default_local_dir={local}", *NO_VLLM_NO_FLASH)
    from entropyrl.verl.checks.layout import LOCAL_FILESYSTEMS, filesystem_type

    if filesystem_type(local) in LOCAL_FILESYSTEMS:
        on_local_disk = launch(tmp_path, "chair_mscoco.sh", *args, env=env)
        assert on_local_disk.returncode == 2
        (line,) = errors(on_local_disk)
        assert f"trainer.default_local_dir={local} is on this node's local disk" in line
    # Declared shared, the checks pass and the script goes on to its next step (the plugin
    # check, here a stand-in that fails, so the script stops there).
    python = tmp_path / "python"
    python.write_text(
        "#!/bin/sh\n"
        'case " $* " in *" entropyrl doctor "*) echo "verl did not load the plugin"; exit 1 ;; esac\n'
        f'exec "{sys.executable}" "$@"\n'
    )
    python.chmod(0o755)
    shared = launch(
        tmp_path,
        "chair_mscoco.sh",
        *args,
        env={**env, "CHECKPOINTS_SHARED": "1", "PYTHON": str(python)},
    )
    assert errors(shared) == [
        "error: the entropyrl verl plugin does not load: verl did not load the plugin "
        f"(run: {python} -m entropyrl doctor)"
    ]


def test_a_gpu_run_without_flash_attn_stops_in_one_line(tmp_path):
    result = launch(tmp_path, "chair_mscoco.sh", env=_inputs(tmp_path))
    assert result.returncode == 2
    flash = [line for line in errors(result) if "flash-attn" in line]
    assert len(flash) == 1 and "pip install flash-attn==2.8.3 --no-build-isolation" in flash[0]
    assert "Traceback" not in result.stderr
