"""`entropyrl demo`: the single-machine quick start (options generated from `DemoConfig`).

Top-level imports stay light (argparse, dataclasses): torch and transformers load only when a
command runs.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from chair_server.options import add_options, from_args
from entropyrl.rig.local.config import DemoConfig

EPILOG = """examples:
  entropyrl demo                                   warm-up + EGPO with CHAIR clip bounds
  entropyrl demo --adv grpo --no-clip-schedule-enable   plain GRPO
  entropyrl demo --compare grpo,egpo,egpo+clip     variants from one warm-up, one figure
  entropyrl demo --acceptance --seeds 0,1,2        RL vs an equal-time warm-up control
  entropyrl demo --task function-calling           text EGPO on a synthetic tool-use task
"""


def as_option(message: str) -> str:
    """A settings error ("threads: ...", "egpo_bonus.alpha: ...") named by its command-line
    option ("--threads: ...", "--egpo-bonus-alpha: ...")."""
    name, sep, rest = message.partition(": ")
    if not sep or not re.fullmatch(r"[a-z_]+(\.[a-z_]+)?", name):
        return message
    return "--" + name.replace(".", "-").replace("_", "-") + ": " + rest


def _run_demo(args: argparse.Namespace) -> int:
    try:
        cfg = from_args(args, DemoConfig)
    except ValueError as error:  # a value out of range: one line naming the option, exit 2
        print(f"error: {as_option(str(error))}", file=sys.stderr)
        return 2
    try:
        from entropyrl.rig.local.demo import main  # torch and transformers: seconds
    except KeyboardInterrupt:
        print("interrupted at start-up; nothing written", file=sys.stderr)
        return 130
    problem = device_problem(cfg.device)
    if problem:  # before anything is written under --out
        print(f"error: --device: {problem}", file=sys.stderr)
        return 2
    return main(cfg)


def device_problem(device: str | None) -> str | None:
    """Why torch cannot run on `device` here (None: it can, or none was asked for)."""
    import torch

    if not device or device == "cpu":
        return None
    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError) as error:
        return f"{device!r} is not a torch device ({error}); use cpu or cuda"
    if kind == "cuda" and not torch.cuda.is_available():
        build = "a CPU build" if torch.version.cuda is None else "no GPU in sight"
        return f"{device} asked for, but torch here has {build}: leave --device out (cpu)"
    index = torch.device(device).index
    if kind == "cuda" and index is not None and index >= torch.cuda.device_count():
        return f"{device} asked for, but only {torch.cuda.device_count()} GPU(s) are visible"
    if kind == "mps" and not torch.backends.mps.is_available():
        return f"{device} asked for, but MPS is not available here: leave --device out"
    return None


def register(subparsers: Any) -> None:
    """Add `demo` to the `entropyrl` command line."""
    parser = subparsers.add_parser(
        "demo",
        help="quick start: tiny Qwen2-VL, synthetic COCO, CHAIR service, warm-up + RL (CPU ok)",
        description=(
            "Builds a synthetic COCO world, starts the CHAIR service on a free loopback port, "
            "warms a tiny Qwen2-VL up on captions with co-occurrence noise, then runs RL "
            "(CIDEr-D - w * CHAIR_i reward, entropy-guided advantages, per-sample clip bounds) "
            "and evaluates held-out images before and after. Writes metrics.jsonl, curves.png "
            "and summary.md/.json under --out."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(parser, DemoConfig)
    parser.set_defaults(func=_run_demo)
