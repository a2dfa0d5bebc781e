"""One step context: what verl's fixed calls do not pass to our registered functions.

verl calls a registered estimator with rewards, mask, config and group ids only, and its
`ppo_loss` hands a policy loss fixed tensors only. The caller (the trainer on the driver, the
loss callable on an actor worker, or a test) builds one `Step` and runs verl's own call through
`with_step`, which makes the step visible to the registered functions inside and returns, beside
the call's result, the metrics they reported. Outside a step the registered functions behave
like plain GRPO / verl's `vanilla` and read the algorithm sections from verl's `config`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from entropyrl.core.specs import AlgorithmSpecs

T = TypeVar("T")


@dataclass(frozen=True)
class Step:
    """One training step's context (tensors aligned with the responses).

    specs: the run's algorithm sections, parsed once when the trainer was built (None: the
        estimator reads verl's `config`).
    token_entropy: [B, T] per-token entropy of the rollout (old) policy, or None when unavailable.
    segment_mask: [B, T] tokens whose entropy forms H_i (answer / thinking / full), or None for
        the whole response.
    ref_log_prob: [B, T] per-token log-probs of the reference policy (MaxEnt-GRPO), or None.
    clip_high: [B] each sample's PPO clip-high bound from the clip schedule, or None (verl's
        constant `actor.clip_ratio_high` for every sample).
    clip_low: [B] each sample's PPO clip-low bound from the clip-low schedule, or None (verl's
        `actor.clip_ratio_low`).
    hallucinated_tokens: [B, T] 0/1 on the response tokens of hallucinated mentions, or None.
    token_clip: (low, high) bounds of those tokens under the token clip, or None (off).
    """

    specs: AlgorithmSpecs | None = None
    token_entropy: torch.Tensor | None = None
    segment_mask: torch.Tensor | None = None
    ref_log_prob: torch.Tensor | None = None
    clip_high: torch.Tensor | None = None
    clip_low: torch.Tensor | None = None
    hallucinated_tokens: torch.Tensor | None = None
    token_clip: tuple[float, float] | None = None


@dataclass
class _Open:
    step: Step
    metrics: dict[str, float] = field(default_factory=dict)


_STEP: ContextVar[_Open | None] = ContextVar("entropyrl_step", default=None)


def with_step(step: Step, call: Callable[[], T]) -> tuple[T, dict[str, float]]:
    """`call()` with `step` visible to the registered functions; its result and their metrics."""
    opened = _Open(step)
    token = _STEP.set(opened)
    try:
        result = call()
    finally:
        _STEP.reset(token)
    return result, opened.metrics


def current_step() -> Step | None:
    """The step of the innermost `with_step` call, or None."""
    opened = _STEP.get()
    return None if opened is None else opened.step


def report(metrics: Mapping[str, float]) -> None:
    """Hand `metrics` back to the innermost `with_step` caller (dropped outside one: verl's own
    call of a registered function has no place for them)."""
    opened = _STEP.get()
    if opened is not None:
        opened.metrics.update(metrics)
