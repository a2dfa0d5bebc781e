"""Inputs verl does not pass to estimators and policy losses, handed over through context variables.

verl calls a registered estimator with rewards, mask, config and group ids only, and its
`ppo_loss` hands a policy loss fixed tensors only. The trainer (or a test) opens one of these
contexts around verl's own call so the registered function can read the extra tensors; outside
a context the functions behave like plain GRPO / verl's `vanilla`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch


@dataclass
class AdvantageInputs:
    """Per-step tensors for the entropy-aware estimators (all [B, T], aligned with responses).

    token_entropy: per-token entropy of the rollout (old) policy, or None when unavailable.
    segment_mask: tokens whose entropy forms H_i (answer / thinking / full), or None for the
        whole response.
    ref_log_prob: per-token log-probs of the reference policy (MaxEnt-GRPO), or None.
    metrics: filled by the estimator (`egpo/*`, `maxent/*`) for the trainer to log.
    """

    token_entropy: torch.Tensor | None = None
    segment_mask: torch.Tensor | None = None
    ref_log_prob: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)


_ADVANTAGE_INPUTS: ContextVar[AdvantageInputs | None] = ContextVar(
    "entropyrl_advantage_inputs", default=None
)
_CLIP_RATIO_HIGH: ContextVar[torch.Tensor | None] = ContextVar(
    "entropyrl_clip_ratio_high", default=None
)


@contextmanager
def advantage_inputs(inputs: AdvantageInputs) -> Iterator[AdvantageInputs]:
    """Make `inputs` visible to the registered estimators inside the block."""
    token = _ADVANTAGE_INPUTS.set(inputs)
    try:
        yield inputs
    finally:
        _ADVANTAGE_INPUTS.reset(token)


def current_advantage_inputs() -> AdvantageInputs | None:
    """The inputs of the innermost open `advantage_inputs` block, or None."""
    return _ADVANTAGE_INPUTS.get()


@contextmanager
def clip_high_for_loss(clip_ratio_high: torch.Tensor | None) -> Iterator[None]:
    """Make a per-sample epsilon_high ([B]) visible to the registered policy loss inside the block."""
    token = _CLIP_RATIO_HIGH.set(clip_ratio_high)
    try:
        yield
    finally:
        _CLIP_RATIO_HIGH.reset(token)


def current_clip_high() -> torch.Tensor | None:
    """The per-sample epsilon_high ([B]) of the innermost open block, or None."""
    return _CLIP_RATIO_HIGH.get()
