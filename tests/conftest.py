"""Suite-wide settings: deterministic, single-threaded torch so results do not move with load,
and every cache that would land under the user's home kept in a per-session temporary folder.

The cache variables are set when this file is imported, before any test module is (some
libraries read them once, at import: huggingface_hub, datasets, matplotlib), and they replace
whatever the user's shell set, so a run never reads or fills the user's caches. Services and
scripts that tests start inherit them. `tests/test_home.py` checks that a run with an empty
HOME leaves it empty.
"""

import os
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

CACHE_ROOT = Path(tempfile.mkdtemp(prefix="entropyrl-test-caches-"))

# variable -> folder under CACHE_ROOT; each default lies under ~ (~/.cache/..., ~/.triton, ...)
CACHE_DIRS = {
    "XDG_CACHE_HOME": "xdg-cache",  # the default of everything below that follows XDG
    "ENTROPYRL_CACHE": "entropyrl",  # built tokenizers (~/.cache/entropyrl)
    "CHAIR_CACHE_DIR": "chair_server",  # CHAIR ground-truth caches (~/.cache/chair_server)
    "HF_HOME": "huggingface",  # hub, datasets (verl's RLHFDataset) and modules caches
    "MPLCONFIGDIR": "matplotlib",  # font cache and config (~/.cache/matplotlib, ~/.config/...)
    "TORCH_HOME": "torch",
    "TRITON_CACHE_DIR": "triton",
    "VLLM_CACHE_ROOT": "vllm",
}
# set by a user's shell, these would send Hugging Face files elsewhere than HF_HOME
DERIVED_FROM_HF_HOME = (
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "TRANSFORMERS_CACHE",
    "HF_DATASETS_CACHE",
    "HF_MODULES_CACHE",
)

for variable, folder in CACHE_DIRS.items():
    (CACHE_ROOT / folder).mkdir()
    os.environ[variable] = str(CACHE_ROOT / folder)
for variable in DERIVED_FROM_HF_HOME:
    os.environ.pop(variable, None)
# tests never download: a stray hub call fails at once instead of fetching into a cache
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
# Ray writes a new cluster's auth token to ~/.ray/auth_token unless it finds one
_token = CACHE_ROOT / "ray_auth_token"
_token.write_text(secrets.token_hex(32))
_token.chmod(0o600)
os.environ["RAY_AUTH_TOKEN_PATH"] = str(_token)

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # chair_server tests run without torch
    pass


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(CACHE_ROOT, ignore_errors=True)


@pytest.fixture(scope="session")
def cache_dirs() -> dict[str, Path]:
    """The session's cache folders, by the variable that points at each."""
    return {variable: CACHE_ROOT / folder for variable, folder in CACHE_DIRS.items()}


# --- tokenizers: built once per session in a private ENTROPYRL_CACHE (tests/rig/local, tests/models) ---


@pytest.fixture(scope="session")
def entropyrl_cache(tmp_path_factory):
    """A private `ENTROPYRL_CACHE` so tests neither read nor fill the user's cache."""
    path = tmp_path_factory.mktemp("entropyrl-cache")
    previous = os.environ.get("ENTROPYRL_CACHE")
    os.environ["ENTROPYRL_CACHE"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("ENTROPYRL_CACHE", None)
    else:
        os.environ["ENTROPYRL_CACHE"] = previous


@pytest.fixture(scope="session")
def small_tokenizer(entropyrl_cache):
    from entropyrl.rig.tokenizer import build_qwen_tokenizer

    return build_qwen_tokenizer(8192)


@pytest.fixture(scope="session")
def full_tokenizer(entropyrl_cache):
    from entropyrl.rig.tokenizer import build_qwen_tokenizer

    return build_qwen_tokenizer(None)


# --- smoke assets: built once, shared by every test and worker process that needs them ---

REPO = Path(__file__).resolve().parents[1]
# A fixed folder, not the session's temporary one: the tiny warmed-up models and worlds of the
# `--smoke` runs cost minutes to build, and their key (`SmokeSettings.asset_key`) holds a digest
# of the code that builds them, so a folder is reused only while that code is unchanged. Runs
# side by side build under a lock (`entropyrl.rig.smoke.assets.prepare_assets`). Never under HOME.
SMOKE_ASSET_CACHE = Path(
    os.environ.get("ENTROPYRL_TEST_ASSET_CACHE") or REPO / ".cache" / "smoke-assets"
)


@pytest.fixture(scope="session")
def smoke_cache() -> Path:
    """Where the smoke runs of this test session find (or build) their assets."""
    SMOKE_ASSET_CACHE.mkdir(parents=True, exist_ok=True)
    return SMOKE_ASSET_CACHE


@pytest.fixture(scope="session")
def smoke_assets(smoke_cache):
    """`smoke_assets(task, model="")`: the asset folder (`data/`, `model/`, for captioning
    `world/`) of that smoke, built once per content."""

    def assets(task: str, model: str = "") -> Path:
        from entropyrl.rig.smoke.assets import prepare_assets
        from entropyrl.rig.smoke.settings import default_settings

        return prepare_assets(default_settings(task, model=model), smoke_cache)

    return assets


# --- verl's configs as main_ppo composes them, and the real `--smoke` runs ---------------------
# (verl is a test dependency: in CI a missing verl fails the run, never skips it)

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
# (entropyrl/commands/launch/recipes.py: lora_overrides).
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
# the two-rank runs are tests/rig/smoke/test_ranks.py's pair.
# Two are the commands of recorded runs (entropyrl/rig/smoke/record.py), taken from there so
# that tests/rig/smoke/test_recorded_runs.py compares like with like.
def _recorded(name: str) -> tuple[str, tuple[str, ...], dict[str, str] | None]:
    from entropyrl.rig.smoke.record import RECORDED

    run = RECORDED[name]
    return run.script, run.args, dict(run.env) or None


SMOKE_RUNS: dict[str, tuple[str, tuple[str, ...], dict[str, str] | None]] = {
    "fc": _recorded("egpo"),
    "mixed": ("egpo_ratio_mixed.sh", (), LORA_ENV),
    "lora_caption_entropy_adv": _recorded("lora"),
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
    from entropyrl.commands.eval.generation import read_rows

    return any(
        row.get("step") == step and "critic/score/mean" in row.get("data", {})
        for row in read_rows(metrics)
    )


def run_until_checkpoint(command: list[str], env: dict, out: Path, step: int) -> int:
    """Start the smoke in a session of its own and, once the checkpoint of `step` is complete
    and the step is logged, SIGKILL that session, as a user's `kill -9 -- -SID` (or a closed
    terminal) does: the launcher, its CHAIR service supervisor, not the trainer, which runs in a
    session of its own and must die with its launcher (`chair_server.launch.die_with_parent`).
    Returns the script's exit status once the trainer is gone, having checked that no later
    step was checkpointed."""
    import os
    import signal
    import subprocess
    import time

    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    latest = out / "checkpoints" / "latest_checkpointed_iteration.txt"
    deadline = time.monotonic() + SMOKE_TIMEOUT
    trainer = None
    try:
        while time.monotonic() < deadline and process.poll() is None:
            saved = latest.is_file() and latest.read_text().strip()
            if saved == str(step) and step_logged(out / "metrics.jsonl", step):
                trainer = int((out / "trainer.pid").read_text())
                os.killpg(process.pid, signal.SIGKILL)
                break
            assert saved in (False, "", *map(str, range(step + 1))), f"ran past step {step}"
            time.sleep(0.2)
        output, _ = process.communicate(timeout=300)
        gone = time.monotonic() + 120
        while trainer is not None and _running(trainer) and time.monotonic() < gone:
            time.sleep(0.2)
        assert trainer is None or not _running(trainer), "the trainer outlived its launch"
        assert latest.read_text().strip() == str(step), "a step was trained after the kill"
    finally:
        if process.poll() is None:
            process.kill()
    (out / "killed_run.log").write_bytes(output or b"")
    return process.returncode


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


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


# --- how tests are shared among worker processes, and the order they start in ---

# pytest-xdist's groups (`--dist loadgroup`, tools/test.sh): a test marked `xdist_group(NAME)`
# runs in the worker that runs every other test of NAME. The real smoke runs are such groups
# (tests/conftest.py); every other test is grouped by its module here, so a module's
# expensive module-scoped fixture (a tiny model trained, an evaluation run) is made in one worker
# only. The long groups come first, longest first: each worker takes the next group when it runs
# dry (`--no-loadscope-reorder` keeps this order), so the long runs start at once, side by side,
# and the short modules fill the end.
LONG_GROUPS = (
    "ranks",
    "caption",
    "fc",
    "lora_caption_entropy_adv",
    "fallbacks",
    "mixed",
    "wrong_token",
    "tests/evaluation/test_eval_caption.py",
)


def _group(item: pytest.Item) -> str | None:
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return None
    return mark.args[0] if mark.args else mark.kwargs.get("name")


# Tests that start Ray (a smoke run, `ray.init`) carry the `ray` marker, so that
# `pytest -m "not ray"` is the fast local subset (docs/testing.md). A test that takes one of
# these fixtures is marked here; one that starts Ray itself is marked where it is written
# (tests/test_ci_policy.py checks that every `ray.init` is).
RAY_FIXTURES = frozenset({"smoke_runs", "smoke_script", "caption_run", "smoke_helpers"})


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if RAY_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.ray)
        if _group(item) is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    rank = {name: i for i, name in enumerate(LONG_GROUPS)}
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (rank.get(_group(item) or "", len(rank)), order[id(item)]))


# --- CI skip policy (tests/test_ci_policy.py runs this block on its own) ---

# In CI (`.ci/run` exports CI=true) a skip is a failure, wherever it is raised (a test, a
# fixture, a module or a conftest at import) and whatever its message says: a missing or broken
# dependency must turn the run red, never into a directory of skips. The only skips CI accepts
# are what a machine cannot do, listed here by test id (a parametrized id also matches by its
# base name) with the reason the skip must give: the same test skipped for another reason (a
# module gone missing) fails. Each allowed skip that happened is printed at the end of the run.
# An expected failure (xfail) hides a known failure just as a skip does and fails in CI too; an
# unexpected pass fails everywhere (`xfail_strict`, pyproject.toml). Elsewhere (a user's partial
# install) a skip stays a skip.
IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
ALLOWED_SKIPS: dict[str, str] = {
    "tests/rewards/test_sandbox.py::test_network_namespace_alone_blocks_the_network": (
        "network namespaces are not available here"
    ),
    "tests/rewards/test_sandbox.py::test_escaped_children_are_killed_without_the_guard[namespaces]": (
        "PID namespaces are not available here"
    ),
    "tests/chair/test_hardening.py::test_memory_per_request_stays_bounded": (
        "reads peak memory from /proc"
    ),
}


def _allowed(nodeid: str) -> str | None:
    """The reason an allowed skip of `nodeid` must give, None when none is allowed."""
    if "@" in nodeid.rsplit("]", 1)[-1]:  # pytest-xdist's `@group` suffix
        nodeid = nodeid.rsplit("@", 1)[0]
    return ALLOWED_SKIPS.get(nodeid) or ALLOWED_SKIPS.get(nodeid.split("[")[0])


def _allowed_skip(report: pytest.TestReport | pytest.CollectReport) -> bool:
    """A skip of an allowed test for the reason it is allowed (an xfail never is)."""
    if not isinstance(report, pytest.TestReport) or hasattr(report, "wasxfail"):
        return False
    reason = _allowed(report.nodeid)
    return reason is not None and reason in _skip_reason(report)


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    return str(longrepr[-1] if isinstance(longrepr, tuple) else longrepr)


class CiSkipPolicy:
    """Registered as a plugin, not left as conftest hooks: pytest calls a folder's hooks
    without the conftests above it once that folder's own conftest has raised a skip at
    import, so conftest hooks never see that folder's report."""

    def __init__(self) -> None:
        self.allowed_seen: list[tuple[str, str]] = []
        self.unconverted: list[str] = []

    def _fail(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        if not report.skipped or _allowed_skip(report):
            return
        reason = _skip_reason(report)
        name = report.nodeid or "collection"
        if hasattr(report, "wasxfail"):
            why = (
                f"CI=true: {name} failed as expected (xfail: {report.wasxfail or 'no reason'}); "
                "in CI an expected failure fails too: mend the code or the test"
            )
        elif isinstance(report, pytest.TestReport) and _allowed(report.nodeid):
            why = (
                f"CI=true: {name} was skipped ({reason}), not for the reason ALLOWED_SKIPS "
                f"(tests/conftest.py) allows it ({_allowed(report.nodeid)}): install what is "
                "missing or mend what is broken"
            )
        else:
            why = (
                f"CI=true: {name} was skipped ({reason}); in CI a skip fails unless its test id "
                "is in ALLOWED_SKIPS (tests/conftest.py): install what is missing or mend what "
                "is broken"
            )
        report.outcome = "failed"
        report.longrepr = why

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        outcome = yield
        self._fail(outcome.get_result())

    @pytest.hookimpl(hookwrapper=True)
    def pytest_make_collect_report(self, collector: pytest.Collector):
        outcome = yield
        self._fail(outcome.get_result())

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # where the summary is printed (the controller when tests run in worker processes)
        if report.skipped:
            if _allowed_skip(report):
                self.allowed_seen.append((report.nodeid, _skip_reason(report)))
            else:
                self.unconverted.append(f"{report.nodeid}: {_skip_reason(report)}")

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:
            self.unconverted.append(f"{report.nodeid or 'collection'}: {_skip_reason(report)}")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        # a skip that reached the end unconverted, by whatever path, still turns the run red
        if self.unconverted and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        terminalreporter.section("skips CI allows (ALLOWED_SKIPS in tests/conftest.py)")
        for nodeid, reason in self.allowed_seen:
            terminalreporter.line(f"{nodeid}: {reason} (allowed: {_allowed(nodeid)})")
        if not self.allowed_seen:
            terminalreporter.line("none happened")
        for line in self.unconverted:
            terminalreporter.line(f"CI=true: a skip is a failure: {line}", red=True)


def pytest_configure(config: pytest.Config) -> None:
    if IN_CI:
        config.pluginmanager.register(CiSkipPolicy(), "entropyrl-ci-skip-policy")


# --- end of the CI skip policy ---
