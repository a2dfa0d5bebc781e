"""Per-sample clip-high bound (eps_high) from a hallucination score such as CHAIR_i."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from entropyrl.specs import CLIP_RULES, DIRECTIONS, ClipScheduleSpec

__all__ = ["CLIP_RULES", "DIRECTIONS", "clip_high_from_hallucination", "per_sample_clip_high"]


def _finite_nonneg(value: float, name: str) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def clip_high_from_hallucination(
    chair_i: Tensor,
    *,
    rule: str = ClipScheduleSpec.rule,
    low: float = ClipScheduleSpec.low,
    high: float = ClipScheduleSpec.high,
    threshold: float = ClipScheduleSpec.threshold,
    direction: str = ClipScheduleSpec.direction,
    neutral: float | None = ClipScheduleSpec.neutral,
    saturation: float = ClipScheduleSpec.saturation,
    temperature: float = ClipScheduleSpec.temperature,
) -> Tensor:
    """Map each sample's hallucination score to its PPO eps_high.

    With ``direction="hallucinated_high"`` (EntropyRL's), the bound moves from ``low`` for a
    clean caption to ``high`` for a hallucinating one, giving hallucinating samples more room
    to move; ``"hallucinated_low"`` swaps the two ends (nobody has published which direction
    helps, so both are offered). Let s(x) in [0, 1] be the "hallucinated" share of the rule:

    - ``step`` (EntropyRL): s = 0 if chair_i < threshold else 1; compared in float32, so a
      score stored as the threshold counts as at the threshold.
    - ``linear``: s = clamp((chair_i - threshold) / (saturation - threshold), 0, 1), i.e. the
      bound ramps linearly from ``threshold`` (about 0) to ``saturation`` (default 1.0).
    - ``sigmoid``: s = sigmoid((chair_i - threshold) / temperature), a smooth step centred on
      ``threshold`` whose width is ``temperature``.

    Result: low + (high - low) * s (flipped: high + (low - high) * s).

    A NaN score (the CHAIR service was unreachable for that sample) gets ``neutral``, which
    defaults to ``low``, so a missing score never widens the update. Callers count NaNs in their
    metrics. Defaults: `entropyrl.specs.ClipScheduleSpec`.

    Args:
        chair_i: Tensor[B] scores >= 0 (NaN = missing).

    Returns:
        Tensor[B] float32 on ``chair_i``'s device.
    """
    if rule not in CLIP_RULES:
        raise ValueError(f"rule must be one of {CLIP_RULES}, got {rule!r}")
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    _finite_nonneg(low, "low")
    _finite_nonneg(high, "high")
    if neutral is None:
        neutral = low
    _finite_nonneg(neutral, "neutral")
    if not isinstance(chair_i, Tensor):
        chair_i = torch.as_tensor(chair_i)
    if chair_i.dim() != 1:
        raise ValueError(f"chair_i must be 1-D [B], got shape {tuple(chair_i.shape)}")
    x = chair_i.to(torch.float32)
    missing = torch.isnan(x)
    if (x[~missing] < 0).any():
        raise ValueError("chair_i must be >= 0 (NaN marks a missing score)")
    x = torch.where(missing, torch.zeros_like(x), x)

    if rule == "step":
        share = (x >= threshold).to(torch.float32)
    elif rule == "linear":
        if not saturation > threshold:
            raise ValueError(
                f"saturation must be > threshold for rule 'linear', got {saturation} <= {threshold}"
            )
        share = ((x - threshold) / (saturation - threshold)).clamp(0.0, 1.0)
    else:
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0 for rule 'sigmoid', got {temperature}")
        share = torch.sigmoid((x - threshold) / temperature)

    start, end = (low, high) if direction == "hallucinated_high" else (high, low)
    bound = start + (end - start) * share
    return torch.where(missing, torch.full_like(bound, neutral), bound)


def per_sample_clip_high(
    chair_i: Tensor | None, spec: ClipScheduleSpec, constant: float, batch_size: int
) -> Tensor:
    """eps_high per sample [B]: the schedule's bounds, or `constant` when it is disabled.

    `constant` is the engine's own eps_high (verl's `actor.clip_ratio_high`, the local runner's
    `ppo.clip_high`); without CHAIR scores (`chair_i` None) every sample gets the neutral bound.
    """
    if not spec.enable:
        return torch.full((batch_size,), float(constant), dtype=torch.float32)
    if chair_i is None:
        chair_i = torch.full((batch_size,), float("nan"))
    bounds = spec.bounds(torch.as_tensor(chair_i, dtype=torch.float32).reshape(-1))
    if bounds.shape[0] != batch_size:
        raise ValueError(f"chair_i has {bounds.shape[0]} rows, the batch has {batch_size}")
    return bounds
