"""Every command's --help renders (argparse %-formats help texts, so a stray "%" breaks it)
and speaks to users: what an option does, its unit and default, no internal references."""

import re
import subprocess
import sys

import pytest

COMMANDS = [
    ["-m", "entropyrl", "--help"],
    ["-m", "entropyrl", "demo", "--help"],
    ["-m", "entropyrl", "prepare", "coco", "--help"],
    ["-m", "entropyrl", "prepare", "fc", "--help"],
    ["-m", "entropyrl", "prepare", "mixed-debug", "--help"],
    ["-m", "entropyrl.commands.smoke", "--help"],
    ["-m", "entropyrl.commands.preflight", "--help"],
    ["-m", "entropyrl.commands.merge_lora", "--help"],
    ["-m", "entropyrl.commands.evaluate", "--help"],
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


# References that mean something to the project's developers, not to a user reading --help.
INTERNAL = re.compile(
    r"\(env[:)]|\benv: |\bissue \d|environment\.md|architecture\.md|design notes|\bpilot\b",
    re.IGNORECASE,
)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[1:-1]))
def test_help_has_no_internal_references(command):
    result = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=120)
    found = INTERNAL.findall(result.stdout)
    assert not found, f"internal references in {' '.join(command)}: {found}"


def test_the_check_catches_what_it_is_for():
    assert INTERNAL.search("steps (env: 60)") and INTERNAL.search("(issue 6: 0.5)")
    assert not INTERNAL.search("the environment variable CHAIR_CACHE_DIR")
