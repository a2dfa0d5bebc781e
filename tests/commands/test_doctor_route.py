"""`entropyrl doctor` names the install route the node's NVIDIA driver needs, and says whether
the installed torch is on it: a stand-in `nvidia-smi` plays the node."""

from __future__ import annotations

import os
from pathlib import Path

from entropyrl.commands import doctor
from entropyrl.verl.checks import stack

CUDA12 = "550.54.15"
CUDA13 = "580.65.06"


def fake_nvidia_smi(tmp_path: Path, monkeypatch, driver: str, gpus: int = 8) -> None:
    """`nvidia-smi` answering as a node of `gpus` H100s with NVIDIA driver `driver` does."""
    folder = tmp_path / "bin"
    folder.mkdir()
    tool = folder / "nvidia-smi"
    names = "\\n".join(["NVIDIA H100 80GB HBM3"] * gpus)
    tool.write_text(
        "#!/bin/sh\n"
        'case "$*" in *driver_version*) echo "' + driver + '" ;; '
        '*) printf "' + names + '\\n" ;; esac\n'
    )
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")


def test_a_cuda_12_node_is_told_route_b_and_never_the_gpu_extra(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, monkeypatch, CUDA12)
    route, in_use = doctor.gpu_route_lines()
    assert route == f"GPU install route for NVIDIA driver {CUDA12}: " + stack.gpu_install_for(
        CUDA12
    )
    assert "route (b)" in route and ".[gpu]" not in route
    # this machine's torch is the CPU wheel: a GPU run would stop on it
    assert in_use.startswith("GPU stack in use: would stop a GPU run: torch ")
    assert "route (b)" in in_use and ".[gpu]" not in in_use


def test_an_r580_node_is_told_route_a(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, monkeypatch, CUDA13)
    route = doctor.gpu_route_lines()[0]
    assert "route (a)" in route and "pip install -e '.[gpu]'" in route


def test_a_cuda_13_torch_on_a_cuda_12_driver_would_stop(tmp_path, monkeypatch):
    """The route in use: PyPI's torch 2.11.0 (CUDA 13.0) on an R550 driver sees no GPU."""
    fake_nvidia_smi(tmp_path, monkeypatch, CUDA12)
    monkeypatch.setattr(stack, "torch_build", lambda: ("2.11.0", "13.0"))
    monkeypatch.setattr(stack, "torch_sees_gpu", lambda: False)
    in_use = doctor.gpu_route_lines()[1]
    assert in_use.startswith("GPU stack in use: would stop a GPU run: NVIDIA driver 550.54.15")
    assert "route (b)" in in_use and "route (c)" in in_use and ".[gpu]" not in in_use
    # the same torch reaching the GPUs (CUDA's forward-compatibility libraries): fine
    monkeypatch.setattr(stack, "torch_sees_gpu", lambda: True)
    assert doctor.gpu_route_lines()[1].startswith("GPU stack in use: ok: ")


def test_no_nvidia_smi_no_route_lines(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi here
    assert doctor.gpu_route_lines() == []


def test_doctor_recipe_on_a_cuda_12_node_names_route_b(tmp_path, monkeypatch, capsys):
    from entropyrl.cli import main

    fake_nvidia_smi(tmp_path, monkeypatch, CUDA12)
    main(["doctor", "--recipe", "chair_mscoco"])
    problems = [line for line in capsys.readouterr().out.splitlines() if "stack:" in line]
    named = [line for line in problems if "install route" in line or "route (" in line]
    assert any("route (b)" in line for line in named), problems
    assert not any(".[gpu]" in line for line in problems), problems
