"""The demos' warm-up checkpoints: shipped for the quick starts, cached for other settings.

The supervised warm-up is most of a quick start's compute and changes only when its settings or
its code do, while what a user varies between runs is RL (`--adv`, `--compare`, the clip
schedule). So the checkpoint, its training summary and its log lines are kept, in two places:

- **the cache**, under a key of everything that determines them bit for bit: the task, its data
  (the world or the tool queries), the model, the warm-up's settings, the seed, the torch thread
  count and device, the versions of torch, transformers and entropyrl, and the source of the code
  on its path. A run with the same key loads it and continues exactly as if it had trained it
  (tests/rig/local/test_warmup_cache.py). Where: `$ENTROPYRL_CACHE/warmups/<key>/` (or
  `~/.cache/entropyrl/...`, as the tokenizers).
- **the package** (`SHIPPED`), for the quick starts' settings, under a key of the settings alone
  (not the threads, device, versions or code): a new user's first run does not pay for the
  warm-up. These are trained by `python tools/ship_warmups.py` with one CPU thread and verified
  against a fresh training by tests/rig/local/test_shipped_warmups.py; another thread count or
  processor would round differently, as any two CPUs do (README), not learn something else.

The cache comes first; `--no-warmup-cache` uses neither. Stdlib only: the lookup runs before
torch is imported.
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

__all__ = [
    "SHIPPED",
    "WarmupEntry",
    "cache_root",
    "result_settings",
    "shipped_entry",
    "stored_warmup",
    "warmup_entry",
]

# The code a warm-up's result depends on (paths under the package), and each task's own.
WARMUP_SOURCES = (
    "core/entropy.py",  # masked_mean, the warm-up's loss
    "rig/local/policy.py",
    "rig/local/rl.py",
    "rig/local/runner.py",
    "rig/local/warmup_cache.py",
    "rig/tiny.py",
    "rig/tokenizer.py",
)
TASK_SOURCES = {
    "captioning": ("rig/local/captioning.py", "rig/synthetic.py"),
    "function-calling": ("rig/local/function_calling.py",),
}
WEIGHTS = "model.pt"
SUMMARY = "warmup.json"
SHIPPED = Path(__file__).resolve().parent / "warmups"
TASKS = ("captioning", "function-calling")
# What a cache key holds beyond the settings: what makes a rerun equal bit for bit.
ENVIRONMENT = ("threads", "device", "versions", "code")


def cache_root() -> Path:
    """`$ENTROPYRL_CACHE/warmups`, or `$XDG_CACHE_HOME/entropyrl/warmups`, or `~/.cache/...`."""
    return cache_home() / "warmups"


@cache
def _source_digest(task: str) -> str:
    return source_digest(WARMUP_SOURCES + TASK_SOURCES[task])


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "missing"


def _data_settings(cfg: Any, seed: int, task: str) -> dict[str, Any]:
    """What the warm-up trains on: the synthetic world, or the tool queries and their habits."""
    if task == "captioning":
        return {"world": cfg.world_settings(seed=seed)}
    if task == "function-calling":
        return {
            "queries": {
                "num_train": cfg.num_train,
                "num_test": cfg.num_test,
                "noise_rate": cfg.noise_rate,
                "seed": seed,
            }
        }
    raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")


def warmup_settings(cfg: Any, seed: int, device: str, task: str = "captioning") -> dict[str, Any]:
    """Everything that determines the warm-up checkpoint of `cfg` (a `DemoConfig`) for `seed`."""
    model = {
        "tokenizer_ranks": cfg.tokenizer_ranks,
        "hidden_size": cfg.hidden_size,
        "num_layers": cfg.num_layers,
    }
    if task == "captioning":
        model["vision_depth"] = cfg.vision_depth
    return {
        "task": task,
        **_data_settings(cfg, seed, task),
        "model": model,
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
        "code": _source_digest(task),
    }


@dataclass(frozen=True)
class WarmupEntry:
    """One slot: `folder` holds `model.pt` and `warmup.json` once it is filled; `shipped` when
    it is the package's (read-only) rather than the cache's."""

    folder: Path
    settings: dict[str, Any]
    shipped: bool = False

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


def _key(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def result_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """`settings` without `ENVIRONMENT`: what the shipped checkpoints are keyed on."""
    return {k: v for k, v in settings.items() if k not in ENVIRONMENT}


def warmup_entry(cfg: Any, seed: int, device: str, task: str = "captioning") -> WarmupEntry:
    """The cache slot of `cfg`'s warm-up for `seed` on `device` ("cpu", "cuda", ...)."""
    settings = warmup_settings(cfg, seed, device, task)
    return WarmupEntry(cache_root() / f"{task}-seed{seed}-{_key(settings)}", settings)


def shipped_entry(
    cfg: Any, seed: int, task: str = "captioning", root: Path | None = None
) -> WarmupEntry:
    """The package's slot (in `root`, default `SHIPPED`) for `cfg`'s warm-up settings: filled
    for the quick starts only."""
    settings = result_settings(warmup_settings(cfg, seed, "cpu", task))
    folder = (SHIPPED if root is None else root) / f"{task}-seed{seed}-{_key(settings)}"
    return WarmupEntry(folder, settings, shipped=True)


def stored_warmup(cfg: Any, seed: int, device: str, task: str = "captioning") -> WarmupEntry | None:
    """The filled slot a run of `cfg` loads its warm-up from, the cache's before the
    package's, or None (train it). Nothing with `--no-warmup-cache` or `--model`."""
    if not cfg.warmup_cache or cfg.model:
        return None
    for entry in (warmup_entry(cfg, seed, device, task), shipped_entry(cfg, seed, task)):
        if entry.filled:
            return entry
    return None
