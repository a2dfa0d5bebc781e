"""Per-sample PPO clip bounds (1 + clip_high, 1 - clip_low) from a hallucination score such as CHAIR_i."""

from __future__ import annotations

import torch
from torch import Tensor

from entropyrl.core.specs import CLIP_RULES, DIRECTIONS, ClipScheduleSpec

__all__ = ["CLIP_RULES", "DIRECTIONS", "clip_high_bounds", "clip_low_bounds"]


def clip_low_bounds(
    chair_i: Tensor | None, spec: ClipScheduleSpec, *, batch_size: int | None = None
) -> Tensor:
    """Each sample's PPO clip_low (the ratio's floor is 1 - clip_low) from its CHAIR_i.

    Hallucinating samples mostly carry a negative advantage, so PPO clips them on the low side:
    their ratio is floored at 1 - clip_low, and this is the bound that limits how far one
    update can push their tokens down (raising their clip_high moves almost nothing). The rules
    are `clip_high_bounds`'s, read on this side: ``spec.low`` is a clean sample's clip_low,
    ``spec.high`` a hallucinating one's, with

    - ``step``: clip_low = low if chair_i < threshold else high (float32 comparison);
    - ``linear``: low + (high - low) * clamp((chair_i - threshold) / (saturation - threshold), 0, 1);
    - ``sigmoid``: low + (high - low) * sigmoid((chair_i - threshold) / temperature);
    - ``direction="hallucinated_low"`` swaps the two ends (high for clean, low for hallucinating);
    - NaN (unscored) or no scores at all: ``neutral``, default ``low`` (a clean sample's bound).

    A clip_low at or above 1 removes the floor (the ratio is >= 0); the spec keeps it below 1.

    Args:
        chair_i: Tensor[B] scores >= 0 (NaN = missing), or None; batch_size: B (required
            without ``chair_i``).

    Returns:
        Tensor[B] float32.
    """
    return clip_high_bounds(chair_i, spec, batch_size=batch_size)


def clip_high_bounds(
    chair_i: Tensor | None, spec: ClipScheduleSpec, *, batch_size: int | None = None
) -> Tensor:
    """Map each sample's hallucination score to its PPO clip_high bound under `spec`'s rule.

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
    defaults to ``low``, so a missing score never widens the update; without any scores
    (``chair_i`` None) every one of the ``batch_size`` samples gets it. Callers count NaNs in
    their metrics. The spec's values were checked when it was built; ``spec.enable`` is the
    caller's to read (a disabled schedule means the engine's own constant clip_high).

    Args:
        chair_i: Tensor[B] scores >= 0 (NaN = missing), or None (no scores at all).
        batch_size: B; required without ``chair_i``, checked against it otherwise.

    Returns:
        Tensor[B] float32 on ``chair_i``'s device.
    """
    if chair_i is None:
        if batch_size is None:
            raise ValueError("clip_high_bounds: without chair_i, batch_size is required")
        chair_i = torch.full((batch_size,), float("nan"))
    x = torch.as_tensor(chair_i).to(torch.float32)
    if x.dim() != 1:
        raise ValueError(f"chair_i must be 1-D [B], got shape {tuple(x.shape)}")
    if batch_size is not None and x.shape[0] != batch_size:
        raise ValueError(f"chair_i has {x.shape[0]} rows, the batch has {batch_size}")
    missing = torch.isnan(x)
    if (x[~missing] < 0).any():
        raise ValueError("chair_i must be >= 0 (NaN marks a missing score)")
    x = torch.where(missing, torch.zeros_like(x), x)

    if spec.rule == "step":
        share = (x >= spec.threshold).to(torch.float32)
    elif spec.rule == "linear":
        share = ((x - spec.threshold) / (spec.saturation - spec.threshold)).clamp(0.0, 1.0)
    else:
        share = torch.sigmoid((x - spec.threshold) / spec.temperature)

    low, high = spec.low, spec.high
    start, end = (low, high) if spec.direction == "hallucinated_high" else (high, low)
    bound = start + (end - start) * share
    neutral = low if spec.neutral is None else spec.neutral
    return torch.where(missing, torch.full_like(bound, neutral), bound)
