"""What the plugin costs on the real trainer: the caption smoke with entropyrl's features on and off.

    python benchmarks/plugin_overhead.py [--runs 2] [--steps 7] [--warmup 2] [--out DIR]

Both variants are `bash examples/chair_mscoco.sh --smoke` (the real `verl.trainer.main_ppo` on
CPU: Ray, FSDP2, the `hf` rollout, the CHAIR service, the same tiny Qwen2.5-VL and data), one
run of each per round, alternating which goes first, so a busy machine slows both alike:

- on: the entropy-aware trainer (`trainer.v1.trainer_mode=entropyrl`), the per-sample clip loss
  (`per_sample_clip`), the CHAIR clip schedule and an entropy-guided estimator (`egpo`);
- off: verl's own sync trainer, verl's `vanilla` loss and `grpo`, schedule off.

Checkpoints and validation are off in both (they are the same verl code either way). Each run
trains `--steps` steps; the first `--warmup` (rollout-server warm-up, first FSDP gathers,
compilation) are left out. For every phase verl times (`timing_s/gen`, `old_log_prob`, `ref`,
`adv`, `update_actor`, `step`) it prints the median over the kept steps of all runs, per variant,
and the ratio on/off; `--json` writes them too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PHASES = ("gen", "old_log_prob", "ref", "adv", "update_actor", "step")
VARIANTS: dict[str, tuple[str, ...]] = {
    "on": (
        "trainer.v1.trainer_mode=entropyrl",
        "actor_rollout_ref.actor.policy_loss.loss_mode=per_sample_clip",
        "algorithm.adv_estimator=egpo",
        "algorithm.clip_schedule.enable=true",
    ),
    "off": (
        "trainer.v1.trainer_mode=sync",
        "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla",
        "algorithm.adv_estimator=grpo",
        "algorithm.clip_schedule.enable=false",
    ),
}


def run_command(variant: str, out: Path, steps: int) -> list[str]:
    """The smoke command of one run of `variant`."""
    return [
        "bash",
        str(REPO / "examples" / "chair_mscoco.sh"),
        "--smoke",
        "--out",
        str(out),
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        *VARIANTS[variant],
    ]


def phase_times(rows: Sequence[dict[str, Any]], warmup: int) -> dict[str, list[float]]:
    """{phase: [seconds per kept step]} from verl's metrics rows (steps after `warmup`)."""
    times: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for row in rows:
        if row["step"] <= warmup:
            continue
        for phase in PHASES:
            value = row["data"].get(f"timing_s/{phase}")
            if isinstance(value, int | float):
                times[phase].append(float(value))
    return times


def summarize(times: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float | int]]:
    """{phase: {on, off (medians), ratio, steps}} over the kept steps of every run."""
    table = {}
    for phase in PHASES:
        on, off = times["on"][phase], times["off"][phase]
        if not on or not off:
            continue
        median_on, median_off = statistics.median(on), statistics.median(off)
        table[phase] = {
            "on": median_on,
            "off": median_off,
            "ratio": median_on / median_off if median_off > 0 else float("nan"),
            "steps": min(len(on), len(off)),
        }
    return table


def markdown(table: dict[str, dict[str, float | int]]) -> str:
    lines = [
        "| phase (verl's timing_s/...) | plugin off: verl sync, vanilla, grpo (s) | plugin on (s) "
        "| on / off | steps per variant |",
        "|---|---:|---:|---:|---:|",
    ]
    for phase, row in table.items():
        lines.append(
            f"| {phase} | {row['off']:.3f} | {row['on']:.3f} | {row['ratio']:.3f} | {row['steps']} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from entropyrl.core.files import write_json
    from entropyrl.rig.smoke.check import read_metrics

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="runs per variant (default 2)")
    parser.add_argument("--steps", type=int, default=7, help="steps per run (default 7)")
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out (default 2)")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "plugin_overhead")
    parser.add_argument("--json", type=Path, help="also write the table here")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)
    if args.steps <= args.warmup:
        parser.error("--steps must be larger than --warmup")
    times: dict[str, dict[str, list[float]]] = {v: {p: [] for p in PHASES} for v in VARIANTS}
    for round_ in range(args.runs):
        order = ("on", "off") if round_ % 2 == 0 else ("off", "on")
        for variant in order:
            out = args.out / f"{variant}-{round_}"
            command = run_command(variant, out, args.steps)
            print(" ".join(command), flush=True)
            if args.dry_run:
                continue
            # one asset build (the tiny model and data) for every run
            env = {**os.environ, "ENTROPYRL_SMOKE_CACHE": str(args.out / "assets")}
            result = subprocess.run(command, cwd=REPO, env=env)
            if result.returncode != 0:
                print(f"{variant} run {round_} failed ({result.returncode}); see {out}/run.log")
                return 1
            for phase, values in phase_times(
                read_metrics(out / "metrics.jsonl"), args.warmup
            ).items():
                times[variant][phase] += values
    if args.dry_run:
        return 0
    table = summarize(times)
    print(markdown(table))
    if args.json:
        write_json({"table": table, "times": times}, args.json)  # strict JSON: NaN as null
    return 0


if __name__ == "__main__":
    sys.exit(main())
