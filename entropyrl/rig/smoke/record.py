"""Recorded smoke runs: what the smoke check reads of a finished run, kept as test data.

The smoke check (`entropyrl.rig.smoke.check`) reads a run's metrics rows, its resolved config and
its per-sample trace. Real runs need Ray and minutes each; the check's own tests read these
recordings instead, so they run in plain pytest and plant their faults into real records.

    python -m entropyrl.rig.smoke.record [NAME ...] [--to tests/rig/smoke/recorded]

runs each smoke of `RECORDED` (all when no name is given) as its script's `--smoke` and keeps
`metrics.jsonl`, `config.yaml` and `trace/*.jsonl`, with the machine's paths replaced by
placeholders. Rerun it when the recorder's format (`entropyrl.rig.trace`, verl's file logger)
changes; tests/rig/smoke/test_recorded_runs.py compares the recordings' fields with a live run's.
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
DEFAULT_FOLDER = REPO / "tests" / "rig" / "smoke" / "recorded"
KEPT = ("metrics.jsonl", "config.yaml")
TRACE = "trace"
OUT_PLACEHOLDER = "<run>"
CACHE_PLACEHOLDER = "<smoke-cache>"


@dataclass(frozen=True)
class RecordedRun:
    """One smoke as the recorder runs it: `bash examples/<script> --smoke <args>` with `env`."""

    script: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    why: str = ""


# LoRA as `LORA_RANK=8` adds it to a caption run (entropyrl/commands/launch/recipes.py).
LORA_QWEN3_VL = {"LORA_RANK": "8", "SMOKE_MODEL": "qwen3_vl"}

RECORDED: dict[str, RecordedRun] = {
    "caption": RecordedRun(
        "chair_mscoco.sh",
        ("trainer.total_training_steps=3",),
        why="the recipe: grpo, the CHAIR clip schedule, the per-sample clip loss, 3 steps",
    ),
    "egpo": RecordedRun(
        "egpo_function_calling.sh", why="EGPO's entropy bonus on the text recipe (Qwen3)"
    ),
    "lora": RecordedRun(
        "chair_mscoco.sh",
        ("algorithm.adv_estimator=entropy_adv",),
        LORA_QWEN3_VL,
        why="LoRA adapters on Qwen3-VL, token-level entropy shaping",
    ),
    "two_ranks": RecordedRun(
        "chair_mscoco.sh",
        (
            "--ranks",
            "2",
            "actor_rollout_ref.actor.ppo_epochs=2",
            "actor_rollout_ref.actor.optim.lr=1e-3",
        ),
        why=(
            "two FSDP2 ranks, two rollout replicas; a second, off-policy PPO epoch and lr 1e-3, "
            "so the clip acts on this tiny model and its fractions can be recomputed"
        ),
    ),
    "token_penalty": RecordedRun(
        "chair_mscoco.sh",
        ("trainer.total_training_steps=3",),
        {"EXPERIMENT": "token_penalty"},
        why="the token penalty: -beta on the tokens of CHAIR's hallucinated spans, GRPO under it",
    ),
    "token_clip": RecordedRun(
        "chair_mscoco.sh",
        (
            "actor_rollout_ref.actor.ppo_epochs=2",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            "algorithm.token_clip.low=0.5",
        ),
        {"EXPERIMENT": "token_clip"},
        why=(
            "the token clip: its own bounds on the hallucinated tokens, as the loss reads the "
            "mask; a second epoch at lr 1e-3 so the clip acts, and a floor (0.5) far from the "
            "actor's (0.8), so the fractions tell a loss that ignored the mask apart"
        ),
    ),
}


def record(name: str, run: RecordedRun, folder: Path, cache: Path | None = None) -> Path:
    """Run `run`'s smoke and keep what the check reads in `folder/name`; raises when it fails."""
    target = folder / name
    with tempfile.TemporaryDirectory(prefix=f"record-{name}-") as scratch:
        out = Path(scratch) / "run"
        env = dict(os.environ, **run.env, CHAIR_CACHE_DIR=str(Path(scratch) / "chair-cache"))
        if cache is not None:
            env["ENTROPYRL_SMOKE_CACHE"] = str(cache)
        command = ["bash", str(REPO / "examples" / run.script), "--smoke", "--out", str(out)]
        result = subprocess.run(
            [*command, *run.args], env=env, cwd=REPO, capture_output=True, text=True
        )
        if result.returncode != 0 or "smoke check passed" not in result.stdout:
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-40:])
            raise RuntimeError(f"the {name} smoke failed (exit {result.returncode}):\n{tail}")
        shutil.rmtree(target, ignore_errors=True)
        (target / TRACE).mkdir(parents=True)
        paths = {str(out): OUT_PLACEHOLDER}
        if cache is not None:
            paths[str(cache)] = CACHE_PLACEHOLDER
        for name_ in KEPT:
            text = (out / name_).read_text()
            for path, placeholder in paths.items():
                text = text.replace(path, placeholder)
            (target / name_).write_text(text)
        for path in sorted((out / TRACE).glob("*.jsonl")):
            shutil.copy(path, target / TRACE / path.name)
    return target


@dataclass
class Recording:
    """What a finished run wrote, as the smoke check reads it."""

    metrics: list[dict[str, Any]]
    config: Any
    driver: list[dict[str, Any]]
    syncs: list[dict[str, Any]]
    rollouts: list[dict[str, Any]]
    workers: list[dict[str, Any]]

    def copy(self) -> Recording:
        return copy.deepcopy(self)

    def real(self) -> list[dict[str, Any]]:
        """The driver's rows without verl's synthetic padding rows."""
        return [row for row in self.driver if not row["padding"]]

    def ours(self) -> bool:
        """Whether the run's loss is the per-sample clip loss, the one that traces its rows."""
        from entropyrl.rig.smoke.check import LOSS_MODES

        return self.config.actor_rollout_ref.actor.policy_loss.loss_mode in LOSS_MODES

    def trace_problems(self, **kwargs: Any) -> list[str]:
        from entropyrl.rig.smoke.check import check_trace

        return check_trace(
            self.driver,
            self.config,
            sync_rows=self.syncs,
            rollout_rows=self.rollouts,
            worker_rows=self.workers if self.ours() else None,
            **kwargs,
        )

    def step_metric_problems(self) -> list[str]:
        from entropyrl.rig.smoke.check import entropy_of, training_metrics
        from entropyrl.rig.smoke.step_metrics import check_step_metrics

        return check_step_metrics(
            training_metrics(self.metrics),
            self.driver,
            self.config,
            worker_rows=self.workers if self.ours() else None,
            sequence_entropy=entropy_of(self.config),
        )


def read_recording(folder: Path) -> Recording:
    """A run folder (a recording or a live run's `--out`) as the check reads it."""
    from omegaconf import OmegaConf

    from entropyrl.rig.smoke.check import read_metrics, read_trace

    trace = folder / TRACE
    return Recording(
        metrics=read_metrics(folder / "metrics.jsonl"),
        config=OmegaConf.load(folder / "config.yaml"),
        driver=read_trace(trace, "driver"),
        syncs=read_trace(trace, "sync"),
        rollouts=read_trace(trace, "rollout"),
        workers=read_trace(trace, "worker"),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m entropyrl.rig.smoke.record",
        description="Run the smoke runs the smoke check's tests read and keep their records.",
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"of {', '.join(RECORDED)}")
    parser.add_argument("--to", type=Path, default=DEFAULT_FOLDER, help="(default: %(default)s)")
    parser.add_argument(
        "--cache", type=Path, help="the smoke's asset cache (ENTROPYRL_SMOKE_CACHE)"
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in RECORDED]
    if unknown:
        parser.error(f"no recorded run {', '.join(unknown)}: choose from {', '.join(RECORDED)}")
    for name in args.names or list(RECORDED):
        print(f"record: {name}: {RECORDED[name].why}", flush=True)
        print(f"record: wrote {record(name, RECORDED[name], args.to, args.cache)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
