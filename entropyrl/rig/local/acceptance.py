"""Acceptance study: RL against an equal-time control, per seed, on held-out images.

For each seed: warm up on the noisy captions, evaluate (greedy, held-out), then from that same
checkpoint (a) run RL and evaluate, (b) continue the supervised warm-up for exactly as many
seconds as RL took and evaluate. On CPU the seconds are this process's CPU time by default
(`--control-clock cpu`): on a machine shared with other jobs, wall time would hand whichever
phase ran while the machine was quieter more compute; on an idle machine with one torch thread
the two agree. RL passes a seed when it beats the control on CHAIR_i (lower)
and on CIDEr-D (higher); the recall difference is reported beside it, not hidden.

Run: `entropyrl demo --acceptance --seeds 0,1,2` or `python -m entropyrl.rig.local.acceptance`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from entropyrl.rig.local.config import DemoConfig
from entropyrl.rig.local.interrupts import run_interruptible
from entropyrl.rig.local.report import eval_row, markdown_table, plot_curves, write_summary
from entropyrl.rig.local.runner import MetricsLog, warm_start

__all__ = ["ACCEPTANCE_COLUMNS", "main", "run_acceptance"]

ACCEPTANCE_COLUMNS = (
    ("seed", "seed"),
    ("stage", "stage"),
    ("chair_i_pct", "CHAIR_i %"),
    ("chair_s_pct", "CHAIR_s %"),
    ("recall_pct", "recall %"),
    ("cider", "CIDEr-D"),
    ("length", "words"),
    ("train_seconds", "train s (wall)"),
    ("train_cpu_seconds", "train s (CPU)"),
    ("train_steps", "steps"),
)


def run_acceptance(cfg: DemoConfig) -> dict[str, Any]:
    """Run the study for `cfg.seed_list()` with the variant `cfg.variants()[0]`."""
    variant = cfg.variants()[0]
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    log = MetricsLog(out / "metrics.jsonl")
    rows: list[dict[str, Any]] = []
    verdicts: list[dict[str, Any]] = []
    started = time.perf_counter()
    for seed in cfg.seed_list():
        with warm_start(cfg, out, seed, log) as run:
            rl, after = run.rl(cfg, variant, log=log)
            control, held = run.control(cfg.control_clock)
        warm, before = run.warmup, run.before
        for stage, metrics, seconds, steps in (
            ("warm-up", before, warm["seconds"], warm["steps"]),
            (f"RL ({variant})", after, rl["seconds"], float(cfg.steps)),
            ("control (same time)", held, control["seconds"], control["steps"]),
        ):
            rows.append(
                {"seed": seed, **eval_row(stage, metrics, seconds), "train_steps": int(steps)}
            )
        for row, phase in zip(rows[-3:], (warm, rl, control)):
            row["train_cpu_seconds"] = phase["cpu_seconds"]
        for name, metrics in (("warmup", before), ("rl", after), ("control", held)):
            log.write("eval", seed, metrics, variant=name, seed=seed)
        verdicts.append(
            {
                "seed": seed,
                "chair_i_rl_minus_control_pct": 100 * (after["chair_i"] - held["chair_i"]),
                "cider_rl_minus_control": after["cider"] - held["cider"],
                "recall_rl_minus_control_pct": 100 * (after["recall"] - held["recall"]),
                "rl_beats_control": after["chair_i"] < held["chair_i"]
                and after["cider"] > held["cider"],
            }
        )
    wins = sum(v["rl_beats_control"] for v in verdicts)
    table = markdown_table(rows, ACCEPTANCE_COLUMNS)
    deltas = markdown_table(
        verdicts,
        (
            ("seed", "seed"),
            ("chair_i_rl_minus_control_pct", "CHAIR_i RL - control (points)"),
            ("cider_rl_minus_control", "CIDEr-D RL - control"),
            ("recall_rl_minus_control_pct", "recall RL - control (points)"),
            ("rl_beats_control", "RL better on CHAIR_i and CIDEr-D"),
        ),
    )
    verdict = f"RL beats the equal-time control on CHAIR_i and CIDEr-D in {wins} of {len(verdicts)} seeds."
    summary = {
        "variant": variant,
        "settings": {
            "seeds": cfg.seeds,
            "variant": variant,
            "warmup_steps": cfg.warmup_steps,
            "steps": cfg.steps,
            "warmup_lr": cfg.warmup_lr,
            "lr": cfg.lr,
            "chair_weight": cfg.chair_weight,
            "chair_penalty": cfg.chair_penalty,
            "ppo": cfg.ppo.to_dict(),
            "clip_schedule": cfg.clip_schedule.to_dict(),
            "kl_coef": cfg.kl_coef,
            "control_clock": cfg.control_clock,
            "noise_rate": cfg.noise_rate,
            "threads": cfg.threads,
        },
        "rows": rows,
        "verdicts": verdicts,
        "wins": wins,
        "seconds": time.perf_counter() - started,
    }
    write_summary(
        out, summary, table + "\n\n" + deltas + "\n\n" + verdict, heading="Acceptance study"
    )
    plot_curves(log.records, out / "curves.png", title="RL curves per seed")
    print(table)
    print()
    print(deltas)
    print()
    print(verdict)
    return summary


def main(
    argv: list[str] | None = None, prog: str = "python -m entropyrl.rig.local.acceptance"
) -> int:
    """`python -m entropyrl.rig.local.acceptance [demo options]` (defaults: seeds 0,1,2)."""
    import argparse

    from chair_server.options import add_options, from_args

    parser = argparse.ArgumentParser(prog=prog)
    add_options(parser, DemoConfig)
    parser.set_defaults(out="runs/acceptance")
    cfg = from_args(parser.parse_args(argv), DemoConfig)
    return run_interruptible(run_acceptance, cfg)


if __name__ == "__main__":
    sys.exit(main())
