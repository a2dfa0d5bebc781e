"""`entropyrl demo`: the single-machine quick start (options generated from `DemoConfig`).

Top-level imports stay light (argparse, dataclasses): torch and transformers load only when a
command runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from entropyrl.local.config import DemoConfig, add_config_arguments, config_from_args

EPILOG = """examples:
  entropyrl demo                                   warm-up + EGPO with CHAIR clip bounds
  entropyrl demo --adv grpo --no-clip-schedule-enable   plain GRPO
  entropyrl demo --compare grpo,egpo,egpo+clip     variants from one warm-up, one figure
  entropyrl demo --acceptance --seeds 0,1,2        RL vs an equal-time warm-up control
  entropyrl demo --task function-calling           text EGPO on a synthetic tool-use task
"""


def _run_demo(args: argparse.Namespace) -> int:
    cfg = config_from_args(args, DemoConfig)
    try:
        from entropyrl.local.demo import main  # torch and transformers: seconds
    except KeyboardInterrupt:
        print("interrupted at start-up; nothing written", file=sys.stderr)
        return 130
    return main(cfg)


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
    add_config_arguments(parser, DemoConfig)
    parser.set_defaults(func=_run_demo)
