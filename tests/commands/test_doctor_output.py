"""`entropyrl doctor` says what it checks before each slow step and explains, instead of
printing, the messages verl gives on every import of a working CPU setup."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from entropyrl.commands import doctor

# the doctor in a fresh interpreter (so verl's import-time messages fire), its last check
# (a second fresh interpreter) replaced by a report that says everything is registered
SCRIPT = """
import json, sys
from entropyrl.commands import doctor
report = json.loads(sys.argv[1])
doctor.fresh_process_report = lambda timeout=300.0: report
from entropyrl.cli import main
sys.exit(main(["doctor", *sys.argv[2:]]))
"""


@pytest.fixture(scope="module")
def report() -> dict:
    registered = {
        "advantage_estimators": ["egpo", "egpo_ratio", "entropy_adv", "maxent_grpo"],
        "policy_losses": ["per_sample_clip"],
        "trainers": ["entropyrl"],
        "rollouts": ["hf"],
        "platforms": ["cpu"],
    }
    return {"verl_version": "0.9.1", "plugin_imported": True, **registered}


def run_doctor(report: dict, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "PYTHONWARNINGS")}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(report), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_doctor_announces_its_steps_and_explains_expected_warnings(report) -> None:
    pytest.importorskip("verl")
    run = run_doctor(report)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("entropyrl doctor:")
    assert lines[1].startswith("importing verl") and lines[1].endswith("...")
    assert lines[2] == "verl: 0.9.1"
    order = [
        "importing verl",
        "verl internals",
        "entry point",
        "importing the plugin",
        "registered in this process",
        "checking discovery in a fresh Python",
        "fresh process (`import verl` only): plugin loaded, all registered",
    ]
    positions = [next(i for i, line in enumerate(lines) if step in line) for step in order]
    assert positions == sorted(positions)
    # verl's expected import messages: explained in one line, not printed
    assert "UserWarning" not in run.stderr and "engine is not available" not in run.stderr
    assert "No supported accelerator" not in run.stderr
    explained = [line for line in lines if "expected verl messages not shown" in line]
    assert len(explained) <= 2  # one per import step that produced any
    import torch

    if not torch.cuda.is_available():  # verl warns that it found no GPU
        assert any("no GPU visible" in line for line in explained)


def test_explain_keeps_unexpected_messages() -> None:
    lines = [
        "UserWarning: torchtitan engine is not available: ModuleNotFoundError(...)",
        "verl.plugin.platform.platform_manager: No supported accelerator detected. ...",
        "verl.something: a real problem",
    ]
    out = doctor.explain(lines)
    assert out[0].startswith("  2 expected verl messages not shown")
    assert "torchtitan" in out[0] and "no GPU visible" in out[0]
    assert out[1:] == ["  verl: verl.something: a real problem"]
    assert doctor.explain([]) == []


def test_plain_doctor_points_to_the_recipe_check(report) -> None:
    run = run_doctor(report)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "`entropyrl doctor --recipe chair_mscoco [overrides]`" in run.stdout


def test_recipe_doctor_names_what_a_gpu_run_still_needs_here(report) -> None:
    """On this CPU machine: no vLLM, no flash-attn, no GPU, no COCO data, no model: one line
    each, and a non-zero exit; the config itself passes."""
    run = run_doctor(report, "--recipe", "chair_mscoco")
    assert run.returncode == 1, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert "ok      config: algorithm settings and batch geometry" in lines
    problems = [line for line in lines if line.startswith("PROBLEM")]
    assert any(line.startswith("PROBLEM stack: vllm is not installed") for line in problems)
    assert any(line.startswith("PROBLEM stack: flash-attn: not installed") for line in problems)
    assert any(line.startswith("PROBLEM gpus: GPUs: none visible") for line in problems)
    assert any("data.train_files: data/coco/train.parquet not found" in p for p in problems)
    # a version off verl's pins is a warning, counted apart (as the launch scripts say it)
    warnings = [line for line in lines if line.startswith("warning ")]
    also = f" ({len(warnings)} warning(s) above)" if warnings else ""
    assert (
        lines[-1] == f"{len(problems)} problem(s): this run cannot start here as configured{also}"
    )
    assert "Traceback" not in run.stderr and "UserWarning" not in run.stderr


def test_recipe_doctor_takes_a_config_path_and_overrides(report) -> None:
    from pathlib import Path

    recipe = Path(__file__).resolve().parents[2] / "configs" / "chair_mscoco.yaml"
    run = run_doctor(
        report, "--recipe", str(recipe), "trainer.nnodes=8", "data.train_batch_size=64"
    )
    assert run.returncode == 1
    (line,) = [line for line in run.stdout.splitlines() if line.startswith("PROBLEM config")]
    assert line == (
        "PROBLEM config: data.train_batch_size=64 is smaller than "
        "actor_rollout_ref.actor.ppo_mini_batch_size=128: a step must hold at least one mini-batch"
    )
