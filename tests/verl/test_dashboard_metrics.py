"""Dashboard figures recomputed from the per-sample values they summarise."""

from __future__ import annotations

import pytest
import torch

from entropyrl.core.specs import ClipScheduleSpec
from entropyrl.verl.hooks import clip_high_from_chair


def test_hallucinated_frac_is_the_share_of_scored_samples_given_the_hallucinated_bound() -> None:
    """A sample exactly at the threshold gets the hallucinated bound, so the dashboard counts it."""
    spec = ClipScheduleSpec(enable=True, threshold=0.25)
    chair_i = torch.tensor([0.0, 0.25, 0.5, float("nan")])
    bounds, metrics = clip_high_from_chair(chair_i, spec)
    scored = torch.isfinite(chair_i)
    expected = (bounds[scored] == spec.high).float().mean().item()
    assert metrics["chair/hallucinated_frac"] == pytest.approx(expected) == pytest.approx(2 / 3)
    assert metrics["chair/chair_i_mean"] == pytest.approx(chair_i[scored].mean().item())
    assert metrics["chair/unavailable"] == 1.0
    assert metrics["clip/bound_mean"] == pytest.approx(bounds.mean().item())


def test_egpo_ratio_max_is_over_the_samples_that_have_an_entropy() -> None:
    """A sample without entropy (NaN) must not inflate the dashboard's raw-ratio maximum."""
    from entropyrl.core.advantages import egpo_ratio_advantage

    scores = torch.tensor([1.0, 0.0, 1.0, 0.0])
    entropy = torch.tensor([0.5, 1.5, float("nan"), 1.0])
    group = torch.tensor([0, 0, 1, 1])
    _, metrics = egpo_ratio_advantage(scores, entropy, group)
    # group 0: mean 1.0 -> ratios 2.0, 0.667; group 1: mean over the one available sample: 1.0
    eps = 1e-6  # the default entropy_eps makes the ratios a hair below these
    assert metrics["egpo/ratio/max"] == pytest.approx(1.0 / (0.5 + eps), rel=1e-4)
    assert metrics["egpo/entropy/missing"] == 1.0
    assert metrics["egpo/entropy/seq_mean"] == pytest.approx(1.0)
