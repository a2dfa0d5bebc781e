"""The smoke's steps between the command line and verl: the run folder's environment and Hydra
overrides, and running the trainer with its output in `DIR/run.log`, one line per step.

`entropyrl smoke` (`entropyrl.commands.smoke`) is the command; the assets are built by
`entropyrl.rig.smoke.assets` and the finished run is checked by `entropyrl.rig.smoke.check`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chair_server.launch import die_with_parent
from entropyrl.rig.smoke.settings import (
    SmokeSettings,
)


def run_environment(settings: SmokeSettings, out: Path) -> dict[str, str]:
    """Environment of a CPU smoke run (inherited by Ray's local workers)."""
    return {
        "VERL_PLATFORM": "cpu",
        # Every process one thread: the actor ranks (one process each) take turns with their
        # rollout servers (one replica per rank), Ray's and TransferQueue's helpers share the
        # same cores; more threads per rank thrash a 2-core machine at --ranks 2. TransferQueue
        # asks for 8 threads by default and warns at every call on a 2-core machine.
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TQ_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "VERL_FILE_LOGGER_PATH": str(out / "metrics.jsonl"),
        "ENTROPYRL_RESOLVED_CONFIG": str(out / "config.yaml"),
        "ENTROPYRL_TRACE_DIR": str(out / "trace"),
    }


def token_budget(settings: SmokeSettings) -> int:
    """Dynamic batch sizes: two of the longest sequences per micro-batch, so a mini-batch of
    several sequences is cut into at least two."""
    return 2 * (settings.max_prompt_length + settings.response_length)


def run_overrides(settings: SmokeSettings, assets: Path, out: Path) -> list[str]:
    """Hydra overrides on the recipe: only keys of `ALLOWED_DIFFERENCES`."""
    data, model = assets / "data", assets / "model"
    overrides = [
        # model and attention
        f"actor_rollout_ref.model.path={model}",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        # rollout engine, platform, processes and Ray's resources
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        "data.dataloader_num_workers=0",
        "trainer.device=cpu",
        f"trainer.n_gpus_per_node={settings.ranks}",
        # Ray schedules on logical resources: verl's placement bundles ask for CPUs and one GPU
        # per rank, TransferQueue's controller and storage take a CPU each. The real cores are
        # shared by thread count (OMP_NUM_THREADS=1), not by Ray. Ray's dashboard (ten
        # processes, some 4 CPU-seconds a run) stays off.
        "ray_kwargs.ray_init.num_cpus=16",
        f"+ray_kwargs.ray_init.num_gpus={settings.ranks}",
        "+ray_kwargs.ray_init.include_dashboard=false",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        # batch sizes and lengths scaled, the recipe's shape kept
        f"data.train_batch_size={settings.prompts_per_step}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={settings.mini_batch_prompts}",
        f"data.max_prompt_length={settings.max_prompt_length}",
        f"data.max_response_length={settings.response_length}",
        # the run: a few steps, checkpoints under DIR (the metrics file: VERL_FILE_LOGGER_PATH)
        f"trainer.total_training_steps={settings.steps}",
        f"trainer.default_local_dir={out / 'checkpoints'}",
    ]
    if settings.task == "caption":
        overrides += [
            f"data.train_files={data / 'train.parquet'}",
            f"data.val_files={data / 'val.parquet'}",
            # verl's multi-modal dataset path imports qwen_vl_utils (torchvision)
            "data.custom_cls.path=pkg://entropyrl.rig.dataset",
            "data.custom_cls.name=PillowRLHFDataset",
            f"reward.custom_reward_function.reward_kwargs.cider_df={data / 'cider_df.json.gz'}",
        ]
    else:
        val = "test.parquet" if settings.task == "function-calling" else "val.parquet"
        overrides += [
            f"data.train_files={data / 'train.parquet'}",
            f"data.val_files={data / val}",
            f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={token_budget(settings)}",
        ]
    return overrides


def write_run_files(
    settings: SmokeSettings, assets: Path, out: Path
) -> tuple[dict[str, str], list[str]]:
    """`out/smoke.env` (the run's environment, read by examples/eval_chair_mscoco.sh) and
    `out/overrides.txt` (one per line); returns both.

    A run folder without a checkpoint starts over: its metrics and trace are cleared. With one,
    the run resumes (or stops, when it is finished) and its files are kept.
    """
    out.mkdir(parents=True, exist_ok=True)
    env = run_environment(settings, out)
    env.update(
        DATA_DIR=str(assets / "data"),
        MODEL_PATH=str(assets / "model"),
        ENTROPYRL_SMOKE_ASSETS=str(assets),
    )
    lines = [f"export {key}={shlex.quote(value)}" for key, value in env.items()]
    (out / "smoke.env").write_text("\n".join(lines) + "\n")
    # Hydra's own output folder (its .hydra/ and log) goes under the run, not the current one.
    overrides = [*run_overrides(settings, assets, out), f"hydra.run.dir={out / 'hydra'}"]
    (out / "overrides.txt").write_text("\n".join(overrides) + "\n")
    from entropyrl.verl.checks.checkpoints import latest_step

    if latest_step(out / "checkpoints") is None:
        (out / "metrics.jsonl").unlink(missing_ok=True)
        for path in (out / "trace").glob("*.jsonl") if (out / "trace").is_dir() else ():
            path.unlink()
    return env, overrides


# -- running the trainer ----------------------------------------------------------------------


def run_trainer(command: Sequence[str], out: Path, *, poll_s: float = 1.0) -> int:
    """Run `command` (verl's trainer) with its output in `out/run.log`; print a line per step
    as `out/metrics.jsonl` grows, and the outcome. Ctrl-C and SIGTERM reach the whole run."""
    from entropyrl.rig.smoke.check import read_metrics, step_line

    log = out / "run.log"
    metrics = out / "metrics.jsonl"
    printed = {row["step"] for row in read_metrics(metrics)} if metrics.is_file() else set()
    print(f"smoke: training; verl's own output goes to {log}", flush=True)
    with open(log, "ab") as handle:
        process = subprocess.Popen(
            list(command),
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
    (out / "trainer.pid").write_text(str(process.pid))

    def forward(signum: int, _frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            done = process.poll() is not None
            if metrics.is_file():
                try:
                    rows = read_metrics(metrics)
                except ValueError:  # a line being written: read it at the next poll
                    rows = []
                for row in rows:
                    if row["step"] not in printed:
                        printed.add(row["step"])
                        print(step_line(row), flush=True)
            if done:
                break
            time.sleep(poll_s)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    code = process.returncode
    if code != 0:
        lines = log.read_text(errors="replace").splitlines()
        print("\n".join(lines[-40:]), file=sys.stderr)
        for stop in stop_lines(lines):  # after the workers' late tracebacks: last on screen
            print(f"smoke: {stop}", file=sys.stderr)
        print(
            f"smoke: the trainer exited with status {code} (its whole output: {log})",
            file=sys.stderr,
        )
    return code


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RAY_PREFIX = re.compile(r"^\((?:\w+ )?pid=\d+(?:, ip=[^)]*)?\)\s*")


def stop_lines(lines: Sequence[str]) -> list[str]:
    """The lines in which the trainer said why it stopped the run (`entropyrl: ...`, printed by
    the process that raised, prefixed by Ray with its name), without Ray's prefix or colours."""
    stops = []
    for line in lines:
        text = _RAY_PREFIX.sub("", _ANSI.sub("", line))
        if text.startswith("entropyrl: ") and not text.startswith("entropyrl: warning:"):
            stops.append(text)
    return stops
