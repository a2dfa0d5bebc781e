"""Per-sample clip-high bound (eps_high) from a hallucination score such as CHAIR_i."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["CLIP_RULES", "DIRECTIONS", "clip_high_from_hallucination"]

CLIP_RULES = ("step", "linear", "sigmoid")
DIRECTIONS = ("hallucinated_high", "hallucinated_low")


def _finite_nonneg(value: float, name: str) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def clip_high_from_hallucination(
    chair_i: Tensor,
    *,
    rule: str = "step",
    low: float = 0.3,
    high: float = 0.5,
    threshold: float = 1e-4,
    direction: str = "hallucinated_high",
    neutral: float | None = None,
    saturation: float = 1.0,
    temperature: float = 0.05,
) -> Tensor:
    """Map each sample's hallucination score to its PPO eps_high.

    With ``direction="hallucinated_high"`` (EntropyRL's), the bound moves from ``low`` for a
    clean caption to ``high`` for a hallucinating one, giving hallucinating samples more room
    to move; ``"hallucinated_low"`` swaps the two ends (nobody has published which direction
    helps, so both are offered). Let s(x) in [0, 1] be the "hallucinated" share of the rule:

    - ``step`` (EntropyRL): s = 0 if chair_i < threshold else 1 (0.3 below 1e-4, else 0.5);
      compared in float32, so a score stored as 1e-4 counts as at the threshold.
    - ``linear``: s = clamp((chair_i - threshold) / (saturation - threshold), 0, 1), i.e. the
      bound ramps linearly from ``threshold`` (about 0) to ``saturation`` (default 1.0).
    - ``sigmoid``: s = sigmoid((chair_i - threshold) / temperature), a smooth step centred on
      ``threshold`` whose width is ``temperature``.

    Result: low + (high - low) * s (flipped: high + (low - high) * s).

    A NaN score (the CHAIR service was unreachable for that sample) gets ``neutral``, which
    defaults to ``low``: the bound an un-shaped run would use (EasyR1's default eps_high is 0.3),
    so a missing score never widens the update. Callers count NaNs in their metrics.

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
