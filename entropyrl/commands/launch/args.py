"""The command line of `entropyrl launch`: a launch script's flags, the user's Hydra overrides
and the training command after the last `--`, and how a usage mistake or a missing prerequisite
stops the launch (one `error:` line, exit status 2)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

TRAINER_MODULE = "verl.trainer.main_ppo"
OPTIONS = "--dry-run, --smoke, --out DIR, --ranks N, --help"
# the caption reward's keyword arguments: the CHAIR service's URL, the CIDEr-D frequencies, the
# penalty of the EXPERIMENT comparisons
REWARD_KWARGS = "reward.custom_reward_function.reward_kwargs"


class Stop(Exception):
    """Stop the launch with this exit status (its lines were printed)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class Launch:
    """One launch: the script's flags, the user's overrides, the training command."""

    script: str
    command: list[str]
    overrides: list[str] = field(default_factory=list)
    dry_run: bool = False
    smoke: bool = False
    out: str = ""
    ranks: int = 1

    @property
    def python(self) -> str:
        return os.environ.get("PYTHON") or "python3"

    @property
    def quickstart(self) -> str:
        return (
            f"No GPU here? `bash {self.script} --smoke` runs this same verl trainer on the CPU "
            "with a tiny model; the CPU quick start (bash examples/quickstart.sh) runs the "
            "algorithms on one machine."
        )

    def fail(self, problem: str) -> None:
        """A prerequisite not met: a note in a dry run, else one error line and exit 2."""
        if self.dry_run:
            say(f"# dry-run: prerequisite not met: {problem}")
            return
        say(f"error: {problem}")
        if not self.smoke:
            say(self.quickstart)
        raise Stop(2)


def usage_error(message: str) -> NoReturn:
    say(f"error: {message}")
    raise Stop(2)


def script_help(script: str) -> str:
    """A script's header comment (its lines after the shebang up to `set -`), as its --help."""
    lines = []
    for line in Path(script).read_text().splitlines()[1:]:
        if line.startswith("set -"):
            break
        lines.append(line[2:] if line.startswith("# ") else line.lstrip("#"))
    return "\n".join(lines)


def parse(argv: Sequence[str]) -> Launch:
    """`SCRIPT [flags] [overrides] -- COMMAND...` -> a Launch (usage mistakes: exit 2)."""
    argv = list(argv)
    usage = "usage: entropyrl launch SCRIPT [options] [key=value ...] -- COMMAND ..."
    if argv[:1] in (["-h"], ["--help"]):
        print(
            f"{usage}\n\nWhat the scripts under examples/ run: SCRIPT is the script, COMMAND the "
            f"training or evaluation command it launches; options: {OPTIONS}. Run a script's "
            "own --help (e.g. bash examples/chair_mscoco.sh --help) for what it does."
        )
        raise SystemExit(0)
    if not argv or "--" not in argv[1:]:
        usage_error(usage)
    split = len(argv) - 1 - argv[::-1].index("--")
    launch = Launch(script=argv[0], command=argv[split + 1 :])
    launch.dry_run = os.environ.get("DRY_RUN", "0") == "1"
    args = iter(argv[1:split])
    ranks = "1"
    for arg in args:
        if arg == "--dry-run":
            launch.dry_run = True
        elif arg == "--smoke":
            launch.smoke = True
        elif arg in ("--out", "--ranks"):
            value = next(args, None)
            if value is None:
                usage_error("--out needs a folder" if arg == "--out" else "--ranks needs a number")
            if arg == "--out":
                launch.out = value
            else:
                ranks = value
        elif arg.startswith("--out="):
            launch.out = arg[len("--out=") :]
        elif arg.startswith("--ranks="):
            ranks = arg[len("--ranks=") :]
        elif arg in ("-h", "--help"):
            print(script_help(launch.script))
            raise Stop(0)
        elif arg.startswith("-"):
            # a misspelt flag would otherwise reach Hydra as an override, or be taken for one
            usage_error(
                f"unknown option {arg} (the options: {OPTIONS}; everything else is a Hydra "
                "override, key=value)"
            )
        else:
            launch.overrides.append(arg)
    if not ranks.isdigit() or int(ranks) == 0:
        usage_error(f"--ranks must be a positive integer, got '{ranks}'")
    launch.ranks = int(ranks)
    if not launch.smoke and (launch.out or launch.ranks != 1):
        usage_error("--out and --ranks belong to --smoke (a GPU run takes trainer.* overrides)")
    return launch


# -- the training command -----------------------------------------------------------------------


def config_name(command: Sequence[str]) -> str:
    """The `--config-name` of a `verl.trainer.main_ppo` command."""
    if TRAINER_MODULE not in command or "--config-name" not in command[:-1]:
        usage_error(f"the training command must be `python -m {TRAINER_MODULE} --config-name ...`")
    return command[command.index("--config-name") + 1]


def config_folder(command: Sequence[str]) -> str:
    """The `--config-path` of a `verl.trainer.main_ppo` command (the repository's configs/
    when it names none: the scripts always do)."""
    if "--config-path" in command[:-1]:
        return command[command.index("--config-path") + 1]
    for arg in command:
        if arg.startswith("--config-path="):
            return arg.split("=", 1)[1]
    return str(Path(__file__).resolve().parents[3] / "configs")


def split_command(command: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the trainer and its options up to the config name, the command's own overrides)."""
    end = command.index("--config-name") + 2
    return list(command[:end]), list(command[end:])


def override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def override_value(key: str, overrides: Sequence[str]) -> str:
    """The value of the last KEY=VALUE (or +KEY=, ++KEY=) among `overrides`, as Hydra applies
    them (the last one wins); empty when none sets KEY."""
    value = ""
    for override in overrides:
        if "=" in override and override_key(override) == key:
            value = override.split("=", 1)[1]
    return value
