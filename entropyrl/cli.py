"""The `entropyrl` command line.

Every sub-command is registered by a module of `entropyrl.commands`; this module only collects
them. A command module exposes `register(subparsers)` that adds its parser and sets `func`; it
keeps its top-level imports light (argparse, stdlib) so `entropyrl --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from chair_server.options import OneLineParser

COMMAND_MODULES: tuple[str, ...] = (
    "entropyrl.commands.demo",  # demo
    "entropyrl.commands.study",  # study, acceptance
    "entropyrl.commands.prepare",  # prepare coco | fc | mixed-debug
    "entropyrl.commands.launch",  # launch (the examples/ training scripts)
    "entropyrl.commands.preflight",  # preflight
    "entropyrl.commands.smoke",  # smoke
    "entropyrl.commands.doctor",  # doctor
    "entropyrl.commands.eval",  # eval caption | fc
    "entropyrl.commands.merge_lora",  # merge-lora
)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="entropyrl",
        description="Entropy-guided and hallucination-aware RL for Qwen / Qwen-VL models.",
    )
    from entropyrl import __version__

    parser.add_argument("--version", action="version", version=f"entropyrl {__version__}")
    subparsers = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=OneLineParser
    )
    for module_name in COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name != module_name:
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # argparse would name the top-level help; the verb's own lists the options
        verb = f"entropyrl {args.command}" if getattr(args, "command", None) else "entropyrl"
        print(
            f"error: unrecognized arguments: {' '.join(unknown)} ({verb} --help lists the options)",
            file=sys.stderr,
        )
        return 2
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    result = args.func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
