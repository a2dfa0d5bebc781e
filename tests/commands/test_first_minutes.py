"""A laptop's first minutes: the mistakes a new user makes get one line with the fix, exit 2,
before anything is written; a verb's --help shows the defaults it runs with."""

from __future__ import annotations

import subprocess
import sys

import pytest

from entropyrl.cli import main
from entropyrl.commands.demo import device_problem


def test_a_cuda_device_on_a_machine_without_one_is_one_line_and_writes_nothing(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = tmp_path / "demo"
    assert main(["demo", "--device", "cuda", "--out", str(out)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: --device: cuda asked for, but torch here has ")
    assert line.endswith("leave --device out (cpu)")
    assert not out.exists()


def test_device_problem_names_what_torch_cannot_do():
    assert device_problem(None) is None and device_problem("cpu") is None
    assert device_problem("tpu9").startswith("'tpu9' is not a torch device")


def test_a_misspelt_option_points_to_the_verbs_help(capsys):
    assert main(["demo", "--stesp", "5"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: unrecognized arguments: --stesp 5 (entropyrl demo --help lists the options)"
    )


@pytest.mark.parametrize(
    ("verb", "shown"),
    [
        ("study", ["(default: runs/study)", "RL AdamW learning rate (default: 0.0002)"]),
        ("demo", ["(default: runs/demo)", "RL AdamW learning rate (default: 5e-05)"]),
    ],
)
def test_a_verbs_help_shows_the_defaults_it_runs_with(verb, shown):
    result = subprocess.run(
        [sys.executable, "-m", "entropyrl", verb, "--help"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    text = " ".join(result.stdout.split())
    assert result.returncode == 0
    for phrase in shown:
        assert phrase in text, phrase
    assert "(default: low) (default: None)" not in text
