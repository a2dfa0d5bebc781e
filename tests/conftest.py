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


# --- CI skip policy (tests/test_ci_policy.py runs this block on its own) ---

# In CI (`CI=true`) nothing the suite needs may be missing: a test that would skip because a
# dependency does not import (pytest.importorskip, or a skip naming a missing package) fails
# instead. Skips for what a machine cannot do (no PID namespaces) or what runs only before a
# release (ENTROPYRL_FULL_SMOKE=1) stay skips. Users' partial installs still skip.
IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
MISSING = (
    "could not import",
    "no module named",
    "not installed",
    "not importable",
    "not buildable",
)


def _fail_missing_dependency(report: pytest.TestReport | pytest.CollectReport) -> None:
    if not IN_CI or not report.skipped:
        return
    reason = str(report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr)
    if any(marker in reason.lower() for marker in MISSING):
        report.outcome = "failed"
        report.longrepr = f"CI=true: a dependency of these tests is missing: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    _fail_missing_dependency(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    # a module or conftest calling pytest.importorskip at import skips its whole folder
    outcome = yield
    _fail_missing_dependency(outcome.get_result())


# --- end of the CI skip policy ---
