"""A first hour's mistakes, each refused before anything runs: one line starting `error:` that
names what is wrong and what would work, no traceback, exit status 2. The launch scripts are run
as `--dry-run` (what a user tries first: it composes the recipe with the overrides and checks it,
on a machine without GPUs); the demo stops before it imports torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

LAUNCH_MISTAKES = {
    "a misspelt estimator": (
        ["algorithm.adv_estimator=egpo-ratio"],
        "algorithm.adv_estimator=egpo-ratio is not registered with verl; known: egpo, egpo_ratio,",
    ),
    "a misspelt loss": (
        ["actor_rollout_ref.actor.policy_loss.loss_mode=per-sample-clip"],
        "loss_mode=per-sample-clip is not registered with verl; known: ",
    ),
    "a loss that contradicts the clip schedule": (
        ["actor_rollout_ref.actor.policy_loss.loss_mode=gspo"],
        "algorithm.clip_schedule.enable=true trains with the per_sample_clip loss, which "
        "actor_rollout_ref.actor.policy_loss.loss_mode=gspo contradicts;",
    ),
    "a constant bound the clip schedule would not read": (
        ["actor_rollout_ref.actor.clip_ratio_high=0.4"],
        "actor_rollout_ref.actor.clip_ratio_high=0.4 is not read with "
        "algorithm.clip_schedule.enable=true:",
    ),
    "an entropy estimator under verl's own trainer": (
        [
            "algorithm.adv_estimator=egpo",
            "trainer.v1.trainer_mode=sync",
            "algorithm.clip_schedule.enable=false",
        ],
        "algorithm.adv_estimator=egpo reads per-token entropy, which only the entropy-aware "
        "trainer (trainer.v1.trainer_mode=entropyrl with trainer.use_v1=true) hands it:",
    ),
    "an unknown key of our section": (
        ["algorithm.clip_schedule.hihg=0.6"],
        "algorithm.clip_schedule: unknown key 'hihg'; accepted: enable, rule, low, high,",
    ),
    "the same with Hydra's +": (
        ["+algorithm.clip_schedule.hihg=0.6"],
        "algorithm.clip_schedule: unknown key 'hihg'; accepted: enable, rule, low, high,",
    ),
    "an unknown key of verl's": (
        ["trainer.totl_epochs=3"],
        "trainer.totl_epochs is not a key of the chair_mscoco config; did you mean "
        "trainer.total_epochs?",
    ),
    "a value out of range": (
        ["algorithm.clip_schedule.low=-1"],
        "algorithm.clip_schedule.low: must be finite and >= 0, got -1",
    ),
    "a misspelt launcher flag": (["--dryrun"], "unknown option --dryrun (the options: --dry-run,"),
    "another misspelt flag": (["--smok"], "unknown option --smok (the options: --dry-run,"),
}

# Mistakes in the launch script's environment: (its variables, the line).
LAUNCH_ENV_MISTAKES = {
    "a misspelt comparison run": (
        {"EXPERIMENT": "baselin"},
        "EXPERIMENT must be entropyrl, baseline, penalty, reversed, clip_low, token_penalty or "
        "token_clip, got 'baselin'",
    ),
}

DEMO_MISTAKES = {
    "no thread": (["--threads", "0"], "--threads: invalid value 0 (must be >= 1)"),
    "a group of one": (["--samples-per-prompt", "1"], "--samples-per-prompt: invalid value 1"),
    "a bonus cap below its weight": (
        ["--egpo-bonus-alpha", "0.1"],
        "--egpo-bonus-alpha: must be > lam (0.4), got 0.1",
    ),
    "a noise rate over 1": (["--noise-rate", "2"], "--noise-rate: invalid value 2.0 (must be in"),
    "an unknown clip rule": (["--clip-schedule-rule", "cosine"], "--clip-schedule-rule"),
}


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("mistake", LAUNCH_MISTAKES)
def test_a_launch_mistake_is_one_line(mistake, tmp_path) -> None:
    args, needle = LAUNCH_MISTAKES[mistake]
    env = {k: v for k, v in os.environ.items() if k not in ("N_GPUS", "DRY_RUN")}
    result = subprocess.run(
        ["bash", str(REPO / "examples" / "chair_mscoco.sh"), "--dry-run", *args],
        capture_output=True,
        text=True,
        env={**env, "DATA_DIR": str(tmp_path / "data"), "MODEL_PATH": str(tmp_path / "model")},
        cwd=tmp_path,
        timeout=300,
    )
    assert needle in one_error_line(result)


@pytest.mark.parametrize("mistake", LAUNCH_ENV_MISTAKES)
def test_a_launch_environment_mistake_is_one_line(mistake, tmp_path) -> None:
    variables, needle = LAUNCH_ENV_MISTAKES[mistake]
    env = {k: v for k, v in os.environ.items() if k not in ("N_GPUS", "DRY_RUN")}
    env.update(DATA_DIR=str(tmp_path / "data"), MODEL_PATH=str(tmp_path / "model"), **variables)
    result = subprocess.run(
        ["bash", str(REPO / "examples" / "chair_mscoco.sh"), "--dry-run"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert needle in one_error_line(result)


@pytest.mark.parametrize("mistake", DEMO_MISTAKES)
def test_a_demo_mistake_is_one_line(mistake, tmp_path) -> None:
    args, needle = DEMO_MISTAKES[mistake]
    result = subprocess.run(
        [sys.executable, "-m", "entropyrl", "demo", *args, "--out", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert needle in one_error_line(result)
    assert not (tmp_path / "demo").exists()  # refused before anything was written
