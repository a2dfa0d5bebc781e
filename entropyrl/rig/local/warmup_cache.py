"""The captioning warm-up checkpoint, kept between runs of the same settings.

The supervised warm-up is most of a quick start's compute and changes only when its settings or
its code do, while what a user varies between runs is RL (`--adv`, `--compare`, the clip
schedule). So the checkpoint, its training summary and its log lines are stored under a key of
everything that determines them: the world, the model, the warm-up's settings, the seed, the torch
thread count and device, the versions of torch, transformers and entropyrl, and the source of
the code on its path. A run with the same key loads it and continues exactly as if it had trained
it (tests/rig/local/test_warmup_cache.py). Stdlib only: the lookup runs before torch is imported.

Where: `$ENTROPYRL_CACHE/warmups/<key>/` (or `~/.cache/entropyrl/...`, as the tokenizers).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from entropyrl.core.files import atomic_folder, cache_home, source_digest

__all__ = ["WarmupEntry", "cache_root", "warmup_entry"]

# The code a warm-up's result depends on (paths under the package).
WARMUP_SOURCES = (
    "core/entropy.py",  # masked_mean, the warm-up's loss
    "rig/local/captioning.py",
    "rig/local/policy.py",
    "rig/local/rl.py",
    "rig/local/runner.py",
    "rig/local/warmup_cache.py",
    "rig/synthetic.py",
    "rig/tiny.py",
    "rig/tokenizer.py",
)
WEIGHTS = "model.pt"
SUMMARY = "warmup.json"


def cache_root() -> Path:
    """`$ENTROPYRL_CACHE/warmups`, or `$XDG_CACHE_HOME/entropyrl/warmups`, or `~/.cache/...`."""
    return cache_home() / "warmups"


@cache
def _source_digest() -> str:
    return source_digest(WARMUP_SOURCES)


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "missing"


def warmup_settings(cfg: Any, seed: int, device: str) -> dict[str, Any]:
    """Everything that determines the warm-up checkpoint of `cfg` (a `DemoConfig`) for `seed`."""
    return {
        "world": cfg.world_settings(seed=seed),
        "model": {
            "tokenizer_ranks": cfg.tokenizer_ranks,
            "hidden_size": cfg.hidden_size,
            "num_layers": cfg.num_layers,
            "vision_depth": cfg.vision_depth,
        },
        "warmup": {
            "steps": cfg.warmup_steps,
            "batch": cfg.warmup_batch,
            "lr": cfg.warmup_lr,
            "max_grad_norm": cfg.max_grad_norm,
        },
        "seed": seed,
        "threads": cfg.threads,
        "device": device,
        "versions": {name: _version(name) for name in ("torch", "transformers", "entropyrl")},
        "code": _source_digest(),
    }


@dataclass(frozen=True)
class WarmupEntry:
    """One cache slot: `folder` holds `model.pt` and `warmup.json` once it is filled."""

    folder: Path
    settings: dict[str, Any]

    @property
    def filled(self) -> bool:
        return (self.folder / WEIGHTS).is_file() and (self.folder / SUMMARY).is_file()

    def load(self) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
        """(state dict, `run_warmup`'s result, its metrics.jsonl records)."""
        import torch

        stored = json.loads((self.folder / SUMMARY).read_text(encoding="utf-8"))
        state = torch.load(self.folder / WEIGHTS, map_location="cpu", weights_only=True)
        return state, stored["result"], stored["records"]

    def save(
        self, state: dict[str, Any], result: dict[str, Any], records: list[dict[str, Any]]
    ) -> None:
        """Write the slot atomically: a reader sees the whole checkpoint or none."""
        import torch

        with atomic_folder(self.folder, lambda _: self.filled) as staging:
            torch.save(state, staging / WEIGHTS)
            payload = {"settings": self.settings, "result": result, "records": records}
            (staging / SUMMARY).write_text(json.dumps(payload, indent=1), encoding="utf-8")


def warmup_entry(cfg: Any, seed: int, device: str) -> WarmupEntry:
    """The cache slot of `cfg`'s warm-up for `seed` on `device` ("cpu", "cuda", ...)."""
    settings = warmup_settings(cfg, seed, device)
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    return WarmupEntry(cache_root() / f"captioning-seed{seed}-{key}", settings)
