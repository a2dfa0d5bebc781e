"""A machine that plans GPU runs: without verl, the dry run and the doctor say in one line what
to install here (the CPU route, never the gpu extra); a version off verl's pins is a warning in
the doctor as in the launch scripts and docs/install.md."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WITHOUT_VERL = Path(__file__).with_name("without_verl")


def env_without_verl(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("N_GPUS", "DRY_RUN")}
    env["PYTHONPATH"] = os.pathsep.join([str(WITHOUT_VERL), env.get("PYTHONPATH", "")])
    env.update(DATA_DIR=str(tmp_path / "data"), MODEL_PATH=str(tmp_path / "model"))
    return env


def test_the_stand_in_hides_verl(tmp_path) -> None:
    probe = "import importlib.util as u; print(u.find_spec('entropyrl') is not None); import verl"
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env=env_without_verl(tmp_path),
    )
    assert result.stdout.strip() == "True" and "No module named 'verl'" in result.stderr


def test_a_dry_run_without_verl_names_the_cpu_route(tmp_path) -> None:
    result = subprocess.run(
        ["bash", str(REPO / "examples" / "chair_mscoco.sh"), "--dry-run"],
        capture_output=True,
        text=True,
        env=env_without_verl(tmp_path),
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if "verl is not installed" in line]
    assert len(notes) == 1 and "the CPU route: pip install torch==2.13.0" in notes[0]
    assert "Traceback" not in result.stderr and "No module named" not in result.stderr
    assert "verl[vllm]" not in result.stdout + result.stderr
    assert "python3 -m verl.trainer.main_ppo" in result.stdout or "main_ppo" in result.stdout


def test_the_doctor_without_verl_names_the_cpu_route(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "entropyrl", "doctor", "--recipe", "chair_mscoco"],
        capture_output=True,
        text=True,
        env=env_without_verl(tmp_path),
        timeout=120,
    )
    assert result.returncode == 1
    assert "PROBLEM stack: verl is not installed" in result.stdout
    assert (
        "the CPU route" in result.stdout and "No module named" not in result.stdout + result.stderr
    )


def test_a_version_off_verls_pins_is_a_warning_in_the_doctor(monkeypatch, capsys) -> None:
    from entropyrl.cli import main
    from entropyrl.verl.checks import findings

    real = findings.installed_version
    for module in ("stack", "findings"):
        monkeypatch.setattr(
            f"entropyrl.verl.checks.{module}.{'_version' if module == 'stack' else 'installed_version'}",
            lambda name: "4.40.0" if name == "transformers" else real(name),
        )
    main(["doctor", "--recipe", "chair_mscoco", "actor_rollout_ref.rollout.name=hf"])
    lines = capsys.readouterr().out.splitlines()
    version = [
        line
        for line in lines
        if line.startswith(("warning stack: transformers", "PROBLEM stack: transformers"))
    ]
    assert version and version[0].startswith("warning stack: transformers 4.40.0: verl 0.9.1 pins")
    assert "warning(s) above" in lines[-1]
