"""Every command's --help renders (argparse %-formats help texts, so a stray "%" breaks it)."""

import subprocess
import sys

import pytest

COMMANDS = [
    ["-m", "entropyrl", "--help"],
    ["-m", "entropyrl", "demo", "--help"],
    ["-m", "entropyrl", "prepare", "coco", "--help"],
    ["-m", "entropyrl", "prepare", "fc", "--help"],
    ["-m", "entropyrl", "doctor", "--help"],
    ["-m", "entropyrl.local.acceptance", "--help"],
    ["-m", "chair_server", "--help"],
    ["-m", "chair_server.evaluate", "--help"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[1:-1]))
def test_help_renders(command):
    result = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout
