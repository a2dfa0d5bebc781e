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
