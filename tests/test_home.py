"""Tests write nothing under the user's home: a representative part of the suite, run with HOME
set to an empty folder and none of the cache variables set, leaves that folder empty.

What the parts exercise, each a cache that defaults to a folder under HOME: the tokenizer build
and its cache, matplotlib's font cache and config, torch, the CHAIR service and its
ground-truth cache, and verl's dataset path (Hugging Face `datasets` and its cache). Light tests
that reach those caches, not a second run of the local runner end to end (the suite runs it
once already).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PARTS = {
    "tokenizer, matplotlib and torch": [
        "tests/models/test_tokenizer.py",
        "tests/rig/local/test_curves.py",
    ],
    "verl dataset and CHAIR commands": [
        "tests/verl/test_dataset.py::test_rlhf_dataset_reads_coco_parquet_with_images",
        "tests/chair/test_cli.py",
    ],
}
# what a user's shell may set; the suite must not depend on any of them being set or unset
CACHE_VARIABLES = (
    "XDG_CACHE_HOME",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "ENTROPYRL_CACHE",
    "CHAIR_CACHE_DIR",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HF_DATASETS_CACHE",
    "TRANSFORMERS_CACHE",
    "MPLCONFIGDIR",
    "TORCH_HOME",
    "TRITON_CACHE_DIR",
    "RAY_AUTH_TOKEN_PATH",
)


@pytest.mark.slow
@pytest.mark.parametrize("part", sorted(PARTS))
def test_a_run_with_an_empty_home_leaves_it_empty(tmp_path, part) -> None:
    pytest.importorskip("torch")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in CACHE_VARIABLES}
    env["HOME"] = str(home)
    # interpreters found through pyenv's shims look for pyenv under HOME unless told
    pyenv = Path.home() / ".pyenv"
    if "PYENV_ROOT" not in env and pyenv.is_dir():
        env["PYENV_ROOT"] = str(pyenv)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *PARTS[part]],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == []
