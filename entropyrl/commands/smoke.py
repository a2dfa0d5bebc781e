"""`--smoke` of the verl launch scripts: the recipe itself through `verl.trainer.main_ppo`, on CPU.

A smoke is evidence for the configuration it runs, so it runs the recipe's own: its estimator and
loss, remove-padding, gradient checkpointing, FSDP2, dynamic batch sizes where the recipe has
them, validation, checkpoints and `resume_mode: auto`. Its resolved config may differ from the
recipe's (composed for 1 node x 8 GPUs) only in the keys of `ALLOWED_DIFFERENCES`, each for a
reason a CPU forces (a tiny model of the recipe's architecture, the `hf` rollout, PyTorch's
attention, the CPU platform and Ray's logical resources, the data's paths, lengths and batch
sizes scaled with the recipe's shape kept: at least 2 mini-batches per step, at least 2
micro-batches per mini-batch). `tests/rig/smoke/test_smoke_config.py` fails when another key differs.

`entropyrl launch` (the launch scripts' `--smoke`) takes four steps, each also a command here:

    python -m entropyrl.commands.smoke plan {caption,function-calling,mixed} --out DIR [--ranks N]
    ... the launcher checks the config with DIR/overrides.txt (entropyrl.commands.preflight) ...
    python -m entropyrl.commands.smoke build TASK --out DIR [--ranks N]
    python -m entropyrl.commands.smoke run TASK --out DIR -- python -m verl.trainer.main_ppo ...
    python -m entropyrl.commands.smoke check TASK --out DIR

`plan` writes `DIR/smoke.env` (environment: the CPU platform, thread counts, where verl's file
logger and the per-sample trace write, the data and model of the asset folder) and
`DIR/overrides.txt` (Hydra overrides on top of the recipe), naming the asset folder without
building it, so the config is checked before any minute is spent. `build` builds (or reuses)
the assets (`entropyrl.rig.smoke.assets`); `prepare` does both. `run` runs the trainer with
its output in `DIR/run.log` and prints one line per step and the outcome. `check` reads what the
run wrote and checks values, not only plumbing (`entropyrl.rig.smoke.check`).

The checkpoint folder is `DIR/checkpoints`: the same command after a kill resumes at the last
saved step; after a finished run it says there is nothing left to do.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from entropyrl.commands.forward import add_forwarded
from entropyrl.rig.smoke.run import run_trainer, write_run_files
from entropyrl.rig.smoke.settings import DEFAULT_OUT, TASKS, default_settings

# -- command line ----------------------------------------------------------------------------


def _cache_dir(out: Path) -> Path:
    configured = os.environ.get("ENTROPYRL_SMOKE_CACHE")
    return Path(configured) if configured else out / "assets"


def main(
    argv: Sequence[str] | None = None, prog: str = "python -m entropyrl.commands.smoke"
) -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Plan, build, run and check the CPU smoke run of the verl launch scripts.",
    )
    parser.add_argument(
        "action",
        choices=("plan", "build", "prepare", "run", "check"),
        help="plan: write DIR/smoke.env and DIR/overrides.txt (the asset folder named, not "
        "built); build: build or reuse the assets; prepare: both; run: run the trainer command "
        "given after `--` with its output in DIR/run.log; check: check a finished run",
    )
    parser.add_argument("task", choices=TASKS)
    parser.add_argument("--out", type=Path, help="run folder (default: runs/<task>_smoke)")
    parser.add_argument(
        "--ranks", type=int, default=1, help="data-parallel actor ranks (default 1)"
    )
    parser.add_argument(
        "--model",
        default=os.environ.get("SMOKE_MODEL", ""),
        help="the tiny policy's architecture (default: the recipe's; $SMOKE_MODEL)",
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    command = argv[split + 1 :]
    out = (args.out or Path(DEFAULT_OUT[args.task])).resolve()
    settings = default_settings(args.task, ranks=args.ranks, model=args.model)
    if args.action in ("plan", "prepare"):
        write_run_files(settings, _cache_dir(out) / settings.asset_key(), out)
    if args.action in ("build", "prepare"):
        from entropyrl.rig.smoke.assets import prepare_assets

        prepare_assets(settings, _cache_dir(out))
    if args.action == "run":
        if not command:
            parser.error("run needs the trainer command after `--`")
        return run_trainer(command, out)
    if args.action != "check":
        return 0
    from entropyrl.rig.smoke.check import check_run

    return check_run(settings, out)


def register(subparsers: Any) -> None:
    """Add `smoke` to the `entropyrl` command line (the parser of
    `python -m entropyrl.commands.smoke`)."""
    add_forwarded(
        subparsers,
        "smoke",
        __name__,
        "the CPU smoke of a recipe: plan, build, run, check (what `examples/*.sh --smoke` runs)",
    )


if __name__ == "__main__":
    sys.exit(main())
