"""Shared fixtures for the verl adapter tests (real verl 0.9.1 on CPU, no Ray)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("verl")

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO / "configs"
CONFIG_NAMES = ("chair_mscoco", "egpo_function_calling", "grpo_function_calling")


def compose_config(name: str, overrides: list[str] | None = None):
    """Compose one of our configs the way verl's `main_ppo` does (`--config-path/--config-name`)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name=name, overrides=list(overrides or []))


@pytest.fixture(scope="session")
def compose():
    return compose_config


@pytest.fixture(scope="session")
def chair_config():
    """The composed recipe with interpolations resolved, as verl's TaskRunner hands it on."""
    from omegaconf import OmegaConf

    config = compose_config("chair_mscoco")
    OmegaConf.resolve(config)
    return config


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="module")
def qwen_vl_utils_module():
    """`qwen_vl_utils` as verl imports it, on a machine without torchvision (CPU).

    The module imports torchvision at the top for its video path; its image path is PIL and
    its own `smart_resize`. A stand-in module satisfies those imports (and fails if the image
    path ever reaches it), so the real image code runs."""
    import importlib
    import sys
    import types

    if importlib.util.find_spec("torchvision") is not None:
        import qwen_vl_utils

        yield qwen_vl_utils
        return

    class Untouchable(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            raise AssertionError(f"qwen_vl_utils' image path used torchvision.{name}")

    stand_in = Untouchable("torchvision")
    stand_in.__version__ = "0.0"
    stand_in.io = Untouchable("torchvision.io")
    stand_in.transforms = Untouchable("torchvision.transforms")
    stand_in.transforms.InterpolationMode = types.SimpleNamespace(BICUBIC="bicubic")
    saved = {
        k: v
        for k, v in sys.modules.items()
        if k == "qwen_vl_utils" or k.startswith("qwen_vl_utils.")
    }
    for name in saved:
        del sys.modules[name]
    sys.modules["torchvision"] = stand_in
    sys.modules["torchvision.io"] = stand_in.io
    sys.modules["torchvision.transforms"] = stand_in.transforms
    try:
        module = importlib.import_module("qwen_vl_utils")
        yield module
    finally:
        for name in ("torchvision", "torchvision.io", "torchvision.transforms"):
            sys.modules.pop(name, None)
        for name in [
            k for k in sys.modules if k == "qwen_vl_utils" or k.startswith("qwen_vl_utils.")
        ]:
            del sys.modules[name]
        sys.modules.update(saved)


# -- the real `--smoke` runs, shared by every test (and worker process) that reads them --------
#
# Each run is made once per test session, in a folder every worker process of the session
# shares (pytest-xdist gives each worker its own basetemp under one session folder), under a
# lock: the first test that needs a run makes it, any other waits for it and reads the same
# folder. A run that failed fails every test that needs it, with the run's own output.

SMOKE_TIMEOUT = 1800


def _session_folder(tmp_path_factory) -> Path:
    import os

    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


class SmokeRun:
    """What one `bash examples/<script> --smoke` left: its folder and its console."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.stdout = (out / "console.stdout").read_text()
        self.stderr = (out / "console.stderr").read_text()
        self.returncode = int((out / "console.status").read_text())

    def tail(self, lines: int = 60) -> str:
        return "\n".join((self.stdout + self.stderr).splitlines()[-lines:])


def smoke_command(script: str, out: Path, *args: str) -> list[str]:
    return ["bash", str(REPO / "examples" / script), "--smoke", "--out", str(out), *args]


def smoke_env(cache: Path, out: Path, extra: dict | None = None) -> dict[str, str]:
    import os

    env = dict(os.environ)
    env.update(ENTROPYRL_SMOKE_CACHE=str(cache), CHAIR_CACHE_DIR=str(out / "chair-cache"))
    env.update(extra or {})
    return env


def run_smoke(script: str, out: Path, cache: Path, *args: str, env=None) -> SmokeRun:
    """Run one smoke into `out` (made fresh) and keep its console beside its files."""
    import subprocess

    result = subprocess.run(
        smoke_command(script, out, *args),
        capture_output=True,
        text=True,
        env=smoke_env(cache, out, env),
        cwd=REPO,
        timeout=SMOKE_TIMEOUT,
    )
    return record_console(out, result)


def record_console(out: Path, result) -> SmokeRun:
    out.mkdir(parents=True, exist_ok=True)
    (out / "console.stdout").write_text(result.stdout or "")
    (out / "console.stderr").write_text(result.stderr or "")
    (out / "console.status").write_text(str(result.returncode))
    return SmokeRun(out)


def shared_run(tmp_path_factory, name: str, make) -> SmokeRun:
    """The session's run `name`, made by `make(out) -> SmokeRun` the first time it is asked for."""
    import fcntl

    root = _session_folder(tmp_path_factory) / "smoke-runs"
    root.mkdir(parents=True, exist_ok=True)
    out = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "console.status").is_file():
            import shutil

            shutil.rmtree(out, ignore_errors=True)
            make(out)
    run = SmokeRun(out)
    assert run.returncode == 0, f"the {name} smoke failed:\n{run.tail()}"
    assert "smoke check passed" in run.stdout, run.tail()
    return run


@pytest.fixture(scope="session")
def smoke_runs(tmp_path_factory, smoke_cache):
    """`smoke_runs(name)`: the session's smoke run `name` (see `SMOKE_RUNS`), made once."""

    def make(name: str, out: Path) -> SmokeRun:
        script, args, env = SMOKE_RUNS[name]
        env = dict(env or {})
        if name == "fallbacks":
            empty = out.parent / "fallbacks-empty-coco"
            empty.mkdir(exist_ok=True)
            env.update(CHAIR_OPTIONAL="1", CHAIR_COCO=str(empty), CHAIR_TIMEOUT="30")
            flag = Path(f"{out}.flag")  # made by the call that raises
            flag.unlink(missing_ok=True)
            args = (*args, f"+reward.custom_reward_function.reward_kwargs.planted_flag={flag}")
        return run_smoke(script, out, smoke_cache, *args, env=env)

    def get(name: str) -> SmokeRun:
        return shared_run(tmp_path_factory, name, lambda out: make(name, out))

    return get


# LoRA as `LORA_RANK=8` adds it to a caption run
# (entropyrl/commands/launch_recipes.py: lora_overrides).
LORA_ENV = {"LORA_RANK": "8"}
LORA_CAPTION = (
    "actor_rollout_ref.model.lora_rank=8",
    "actor_rollout_ref.model.lora_alpha=16",
    "actor_rollout_ref.model.target_modules=all-linear",
    "actor_rollout_ref.actor.optim.lr=1e-5",
    "actor_rollout_ref.model.exclude_modules='.*visual.*'",
)
LORA_TEXT = (
    "actor_rollout_ref.model.lora_rank=8",
    "actor_rollout_ref.model.lora_alpha=16",
    "actor_rollout_ref.model.target_modules=all-linear",
    "actor_rollout_ref.actor.optim.lr=1e-5",
)
# The fall-backs: no entropy (rollout-correction bypass: verl computes none), the CHAIR service
# never up (CHAIR_OPTIONAL=1 over an empty COCO folder), and one reward call that raises (the
# first training call gets a malformed ground truth: tests/verl/planted/failing_reward.py) in a
# run whose limit lets a step lose 2 of its 20 samples.
FAILING_REWARD = REPO / "tests" / "verl" / "planted" / "failing_reward.py"
FALLBACK_ARGS = (
    "algorithm.adv_estimator=egpo",
    "algorithm.rollout_correction.bypass_mode=true",
    f"reward.custom_reward_function.path={FAILING_REWARD}",
    "algorithm.lost_samples.max_fraction=0.1",
)

# name -> (script, arguments after --smoke --out DIR, extra environment). Each run is evidence for
# more than one thing where that costs nothing: the LoRA caption run takes another estimator than
# its recipe's plain one, the mixed recipe's run puts LoRA on the text model (Qwen3). A run costs
# some 150 CPU-seconds, mostly the start of verl's processes: the list stays short. The GRPO
# function-calling recipe is the EGPO one with another estimator (tests/verl/test_configs.py);
# the two-rank runs are tests/verl/test_ranks.py's pair.
SMOKE_RUNS: dict[str, tuple[str, tuple[str, ...], dict[str, str] | None]] = {
    "fc": ("egpo_function_calling.sh", (), None),
    "mixed": ("egpo_ratio_mixed.sh", (), LORA_ENV),
    "lora_caption_entropy_adv": (
        "chair_mscoco.sh",
        ("algorithm.adv_estimator=entropy_adv",),
        {**LORA_ENV, "SMOKE_MODEL": "qwen3_vl"},
    ),
    "fallbacks": ("chair_mscoco.sh", FALLBACK_ARGS, None),  # its environment: `smoke_runs`
}


@pytest.fixture(scope="session")
def smoke_script():
    """`smoke_script(script, out, cache, *args, env=None) -> SmokeRun`: one run, not shared."""
    return run_smoke


# The caption recipe killed after its step-2 checkpoint, then the same command again.
RESUMED_STEPS = ("trainer.total_training_steps=3", "trainer.save_freq=1")


def step_logged(metrics: Path, step: int) -> bool:
    """Whether the file logger has written `step`'s training row (verl saves a step's
    checkpoint before it logs the step, so a kill in between loses that row for good); a line
    the logger is still writing is left out."""
    from entropyrl.commands.eval_generation import read_rows

    return any(
        row.get("step") == step and "critic/score/mean" in row.get("data", {})
        for row in read_rows(metrics)
    )


def run_until_checkpoint(command: list[str], env: dict, out: Path, step: int) -> int:
    """Start the smoke, SIGKILL its trainer (the whole process group) once the checkpoint of
    `step` is complete and the step is logged, and return the script's exit status."""
    import os
    import signal
    import subprocess
    import time

    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    latest = out / "checkpoints" / "latest_checkpointed_iteration.txt"
    deadline = time.monotonic() + SMOKE_TIMEOUT
    try:
        while time.monotonic() < deadline and process.poll() is None:
            saved = latest.is_file() and latest.read_text().strip()
            if saved == str(step) and step_logged(out / "metrics.jsonl", step):
                os.killpg(int((out / "trainer.pid").read_text()), signal.SIGKILL)
                break
            assert saved in (False, "", *map(str, range(step + 1))), f"ran past step {step}"
            time.sleep(0.2)
        output, _ = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    (out / "killed_run.log").write_bytes(output or b"")
    return process.returncode


@pytest.fixture(scope="session")
def caption_run(tmp_path_factory, smoke_cache) -> SmokeRun:
    """The caption smoke killed after its step-2 checkpoint, then the same command again; the
    killed run's metrics rows are kept in `killed_metrics.jsonl`."""
    import shutil
    import subprocess

    def make(out: Path) -> SmokeRun:
        command = smoke_command("chair_mscoco.sh", out, *RESUMED_STEPS)
        env = smoke_env(smoke_cache, out)
        killed = run_until_checkpoint(command, env, out, step=2)
        assert killed != 0, (out / "killed_run.log").read_text()[-3000:]
        shutil.copy(out / "metrics.jsonl", out / "killed_metrics.jsonl")
        result = subprocess.run(
            command, capture_output=True, text=True, env=env, cwd=REPO, timeout=SMOKE_TIMEOUT
        )
        return record_console(out, result)

    return shared_run(tmp_path_factory, "caption", make)


@pytest.fixture(scope="session")
def smoke_helpers():
    """The run helpers and settings test modules share (they cannot import this conftest)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        command=smoke_command,
        env=smoke_env,
        RESUMED_STEPS=RESUMED_STEPS,
        LORA_CAPTION=LORA_CAPTION,
        LORA_TEXT=LORA_TEXT,
    )
