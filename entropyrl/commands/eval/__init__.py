"""`entropyrl eval caption|fc`: the evaluations of trained models, one verb.

`eval caption` is `python -m entropyrl.commands.eval.caption` (CHAIR, POPE, CIDEr-D with
bootstrap intervals), `eval fc` is `python -m entropyrl.commands.eval.fc` (the function-calling
generate, score, table and compare).
"""

from __future__ import annotations

from typing import Any

from entropyrl.commands.forward import add_forwarded


def register(subparsers: Any) -> None:
    """Add `eval` with `caption` and `fc` to the `entropyrl` command line."""
    evaluation = subparsers.add_parser(
        "eval", help="evaluate trained models (caption: CHAIR, POPE, CIDEr-D; fc: tool calls)"
    )
    tasks = evaluation.add_subparsers(dest="eval_command", metavar="TASK")
    add_forwarded(
        tasks,
        "caption",
        "entropyrl.commands.eval.caption",
        "CHAIR / POPE / CIDEr-D of the base model and each run, with bootstrap intervals",
    )
    add_forwarded(
        tasks,
        "fc",
        "entropyrl.commands.eval.fc",
        "function calling: generate, score strictly (and with BFCL's checker), tabulate, compare",
    )
    evaluation.set_defaults(func=lambda args: _usage(evaluation))


def _usage(parser: Any) -> int:
    parser.print_help()
    return 2
