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
