"""One check's verdict, and the small readers every check shares (no verl import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Finding:
    """One check's verdict: `ok` False means the run cannot start as configured."""

    check: str  # config | stack | gpus | inputs | nodes
    ok: bool
    line: str
    # False: the run may still start (a version off verl's pins): a warning in the launch
    # scripts, the dry run and the doctor alike.
    blocking: bool = True


def select(config: Any, key: str, default: Any = None) -> Any:
    from omegaconf import OmegaConf

    value = OmegaConf.select(config, key, default=default, throw_on_missing=False)
    return default if value is None else value


def installed_version(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def run_roles(config: Any) -> tuple[bool, bool]:
    """(reference policy, critic) as verl's `need_reference_policy` and `need_critic` decide
    them (verl/trainer/ppo/utils.py), without importing verl (tested equal)."""
    reference = bool(select(config, "algorithm.use_kl_in_reward", False)) or bool(
        select(config, "actor_rollout_ref.actor.use_kl_loss", False)
    )
    critic = select(config, "critic.enable")
    if critic is None:
        critic = select(config, "algorithm.adv_estimator") == "gae"
    return reference, bool(critic)
