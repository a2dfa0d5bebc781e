"""Every command's --help renders (argparse %-formats help texts, so a stray "%" breaks it)
and speaks to users: what an option does, its unit and default, no internal references."""

import ast
import re
import subprocess
import sys
from pathlib import Path

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
    ["-m", "entropyrl.commands.eval.fc", "--help"],
    ["-m", "entropyrl", "doctor", "--help"],
    ["-m", "entropyrl.rig.local.acceptance", "--help"],
    ["-m", "entropyrl.rig.local.study", "--help"],
    ["-m", "entropyrl.commands.eval.caption", "--help"],
    ["-m", "entropyrl", "smoke", "--help"],
    ["-m", "entropyrl", "preflight", "--help"],
    ["-m", "entropyrl", "merge-lora", "--help"],
    ["-m", "entropyrl", "eval", "caption", "--help"],
    ["-m", "entropyrl", "eval", "fc", "--help"],
    ["-m", "entropyrl", "study", "--help"],
    ["-m", "entropyrl", "acceptance", "--help"],
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


# Every module that runs as `python -m MODULE` is also a verb of `entropyrl` (the same parser),
# but for the ones in NOT_VERBS.
VERBS = {
    "entropyrl.commands.smoke": ["smoke"],
    "entropyrl.commands.preflight": ["preflight"],
    "entropyrl.commands.merge_lora": ["merge-lora"],
    "entropyrl.commands.eval.caption": ["eval", "caption"],
    "entropyrl.commands.eval.fc": ["eval", "fc"],
    "entropyrl.rig.local.study": ["study"],
    "entropyrl.rig.local.acceptance": ["acceptance"],
}
NOT_VERBS = {
    "entropyrl.cli": "the command line itself",
    "entropyrl.commands.launch.__main__": "`entropyrl launch` itself, whose arguments are all its own",
    "entropyrl.rig.local.demo": "says to run `entropyrl demo`",
    "entropyrl.commands.eval.generation": "the child process of a caption evaluation",
    "entropyrl.rewards.sandbox_child": "the child process of the code sandbox",
    "entropyrl.commands.plan_table": "prints docs/scaling.md's planning table (its generator)",
    "entropyrl.rig.smoke.record": "records the runs the smoke check's tests read (docs/testing.md)",
}


def python_m_modules() -> set[str]:
    package = Path(__file__).resolve().parents[1] / "entropyrl"
    found = set()
    for path in package.rglob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
                parts = path.relative_to(package.parent).with_suffix("").parts
                found.add(".".join(parts))
    return found


def test_every_python_m_command_is_a_verb():
    from entropyrl.cli import build_parser

    assert python_m_modules() == set(VERBS) | set(NOT_VERBS)
    parser = build_parser()
    for module, verb in VERBS.items():
        assert parser.parse_args([*verb, "--anything"]).entry_module == module, verb


def test_every_command_module_is_registered_by_the_commands_layer():
    from entropyrl.cli import COMMAND_MODULES

    assert all(name.startswith("entropyrl.commands.") for name in COMMAND_MODULES)
