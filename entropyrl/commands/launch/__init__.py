"""`entropyrl launch`: what runs around a verl training command, for the launch scripts.

Each training script in examples/ is its training command, written out:

    exec "$PYTHON" -m entropyrl launch "$0" "$@" -- \\
      "$PYTHON" -m verl.trainer.main_ppo --config-path "$root/configs" --config-name chair_mscoco \\
        data.train_files="$DATA_DIR/train.parquet" ...

This command takes the script's flags and the user's Hydra overrides (before the last `--`) and
the training command (after it), and does, in order: `--smoke`'s plan (a tiny model and data
named, the CPU environment), the GPUs (nvidia-smi, CUDA_VISIBLE_DEVICES, N_GPUS), the recipe
composed with every override and checked (`entropyrl.commands.preflight`), the smoke's assets,
the input files and the model, the plugin's entry point, for captioning recipes the CHAIR
service (started on a free port, supervised, stopped on any exit), then the training command
with the recipe's extra overrides and the user's last (Hydra: the last one wins), and the
smoke's check. `--dry-run` prints the commands instead, shell-quoted, and turns missing
prerequisites into notes; what it would take (nodes x GPUs) goes to stderr.

A usage mistake or a missing prerequisite is one `error:` line and exit status 2.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

from entropyrl.commands.launch.args import Stop, parse
from entropyrl.commands.launch.evaluation import (
    caption_evaluation,
    function_calling_evaluation,
    parse_evaluation,
)
from entropyrl.commands.launch.training import run

# The steps live beside this dispatch, one job a module: args (the flags, the overrides, the
# training command), recipes (what each recipe needs; LoRA and EXPERIMENT overrides), checks
# (GPUs, verl, the preflight, files, the model, the plugin), service (the CHAIR service),
# training (a verl recipe's launch, smoke included), evaluation (the two
# evaluation scripts).


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


# The evaluation scripts' commands, by the module they run; any other is a training command.
CAPTION_EVALUATION = "entropyrl.commands.eval.caption"
FUNCTION_CALLING_EVALUATION = "entropyrl.commands.eval.fc"


def launched_module(argv: Sequence[str]) -> str | None:
    """The MODULE of the command after the last `--` when it is `PYTHON -m MODULE ...`."""
    argv = list(argv)
    if "--" not in argv[1:]:
        return None
    command = argv[len(argv) - argv[::-1].index("--") :]
    return next((command[i + 1] for i, arg in enumerate(command[:-1]) if arg == "-m"), None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        module = launched_module(argv)
        if module == CAPTION_EVALUATION:  # its own flags: parse_evaluation
            return caption_evaluation(*parse_evaluation(argv))
        launch = parse(argv)
        if module == FUNCTION_CALLING_EVALUATION:
            return function_calling_evaluation(launch)
        return run(launch)
    except Stop as stop:
        return stop.status
    except KeyboardInterrupt:
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "launch",
        help="run a verl training command with its launch steps (what examples/*.sh call)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
        prefix_chars="\0",  # every argument, flags included, belongs to the launch
    )
    parser.add_argument("arguments", nargs=argparse.REMAINDER)
    parser.set_defaults(func=lambda args: main(args.arguments))
