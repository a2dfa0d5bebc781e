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


# --- how tests are shared among worker processes, and the order they start in ---

# pytest-xdist's groups (`--dist loadgroup`, tools/test.sh): a test marked `xdist_group(NAME)`
# runs in the worker that runs every other test of NAME. The real smoke runs are such groups
# (tests/verl/conftest.py); every other test is grouped by its module here, so a module's
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


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
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
# base name); each one that happened is printed at the end of the run. Elsewhere (a user's
# partial install) a skip stays a skip.
IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
ALLOWED_SKIPS: dict[str, str] = {
    "tests/rewards/test_sandbox.py::test_network_namespace_alone_blocks_the_network": (
        "the kernel gives this user no network namespaces"
    ),
    "tests/rewards/test_sandbox.py::test_escaped_children_are_killed_without_the_guard[namespaces]": (
        "the kernel gives this user no PID namespaces"
    ),
    "tests/chair/test_hardening.py::test_memory_per_request_stays_bounded": (
        "the machine has no /proc to read peak memory from"
    ),
}


def _allowed(nodeid: str) -> str | None:
    if "@" in nodeid.rsplit("]", 1)[-1]:  # pytest-xdist's `@group` suffix
        nodeid = nodeid.rsplit("@", 1)[0]
    return ALLOWED_SKIPS.get(nodeid) or ALLOWED_SKIPS.get(nodeid.split("[")[0])


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
        if not report.skipped or hasattr(report, "wasxfail"):
            return
        if isinstance(report, pytest.TestReport) and _allowed(report.nodeid):
            return
        reason = _skip_reason(report)
        report.outcome = "failed"
        report.longrepr = (
            f"CI=true: {report.nodeid or 'collection'} was skipped ({reason}); in CI a skip "
            "fails unless its test id is in ALLOWED_SKIPS (tests/conftest.py): install what "
            "is missing or mend what is broken"
        )

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
            if _allowed(report.nodeid):
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
