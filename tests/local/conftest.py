"""Shared fixtures for the local runner: tokenizers are built once per session in a temp cache."""

from __future__ import annotations

import os

import pytest


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
    from entropyrl.models.tokenizer import build_qwen_tokenizer

    return build_qwen_tokenizer(8192)


@pytest.fixture(scope="session")
def full_tokenizer(entropyrl_cache):
    from entropyrl.models.tokenizer import build_qwen_tokenizer

    return build_qwen_tokenizer(None)
