"""Verbs of `entropyrl` that hand every argument to a module's `main(argv, prog=...)`: a command
that also runs as `python -m MODULE` keeps one parser, and `entropyrl VERB --help` prints it."""

from __future__ import annotations

import argparse
import importlib
from typing import Any


def add_forwarded(subparsers: Any, verb: str, module: str, help: str) -> argparse.ArgumentParser:
    """Add `verb`, which runs `module.main(arguments, prog="entropyrl ... VERB")` (the module
    loads only then, so `entropyrl --help` stays fast)."""
    parser = subparsers.add_parser(
        verb,
        help=help,
        add_help=False,
        prefix_chars="\0",  # every argument, flags and --help included, belongs to the module
    )
    parser.add_argument("arguments", nargs=argparse.REMAINDER)

    def run(args: argparse.Namespace) -> int:
        return importlib.import_module(module).main(args.arguments, prog=parser.prog)

    parser.set_defaults(func=run, entry_module=module)
    return parser
