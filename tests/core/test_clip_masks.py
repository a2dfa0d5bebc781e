"""The loss's `ClipMasks` mark exactly the tokens the clipped surrogate counts as clipped."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from entropyrl.core.losses import ppo_clip_loss

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _plain_masks(log_prob, old, adv, mask, clip_low, clip_high):
    """Reference: one token at a time, the textbook conditions."""
    bsz, length = log_prob.shape
    high = [[False] * length for _ in range(bsz)]
    low = [[False] * length for _ in range(bsz)]
    for b in range(bsz):
        bound = float(clip_high[b]) if isinstance(clip_high, torch.Tensor) else clip_high
        for t in range(length):
            if not mask[b, t]:
                continue
            a = float(adv[b] if adv.dim() == 1 else adv[b, t])
            ratio = math.exp(float(log_prob[b, t]) - float(old[b, t]))
            high[b][t] = a > 0 and ratio > 1.0 + bound
            low[b][t] = a < 0 and ratio < 1.0 - clip_low
    return torch.tensor(high), torch.tensor(low)


def test_hand_computed_masks():
    # ratios 1.5, 0.5, 1.1, 0.9 for the four tokens of sample 0; sample 1 is the same with
    # opposite advantages and a wider bound; the last token of sample 1 is padding.
    ratios = torch.tensor([[1.5, 0.5, 1.1, 0.9], [1.5, 0.5, 1.1, 0.9]], dtype=torch.float64)
    old = torch.zeros_like(ratios)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0], [-1.0, -1.0, 1.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    _, _, (high, low) = ppo_clip_loss(
        ratios.log(), old, adv, mask, clip_low=0.2, clip_high=torch.tensor([0.3, 0.6])
    )
    # sample 0: token 0 (A > 0, 1.5 > 1.3) clipped high; token 3 (A < 0, 0.9 > 0.8) not;
    # sample 1: token 1 (A < 0, 0.5 < 0.8) clipped low; token 0 has A < 0, so ratio 1.5 is
    # not cut by the upper bound.
    assert high.tolist() == [[True, False, False, False], [False, False, False, False]]
    assert low.tolist() == [[False, False, False, False], [False, True, False, False]]


@SETTINGS
@given(st.integers(0, 2**31), st.booleans(), st.booleans())
def test_masks_equal_a_plain_loop_and_the_loss_fractions(seed, per_sample, token_adv):
    g = torch.Generator().manual_seed(seed)
    bsz, length = 6, 9
    old = -torch.rand(bsz, length, generator=g, dtype=torch.float64) * 3
    log_prob = old + torch.randn(bsz, length, generator=g, dtype=torch.float64) * 0.5
    shape = (bsz, length) if token_adv else (bsz,)
    adv = torch.randn(*shape, generator=g, dtype=torch.float64)
    mask = (torch.rand(bsz, length, generator=g) < 0.8).long()
    clip_high = torch.rand(bsz, generator=g, dtype=torch.float64) if per_sample else 0.28
    _, metrics, (high, low) = ppo_clip_loss(
        log_prob, old, adv, mask, clip_low=0.2, clip_high=clip_high
    )
    want_high, want_low = _plain_masks(log_prob, old, adv, mask, 0.2, clip_high)
    assert torch.equal(high, want_high) and torch.equal(low, want_low)
    tokens = max(int(mask.sum()), 1)
    assert metrics["clip/frac_high"] == pytest.approx(int(high.sum()) / tokens, abs=1e-12)
    assert metrics["clip/frac_low"] == pytest.approx(int(low.sum()) / tokens, abs=1e-12)


def test_float32_bound_at_the_edge_agrees_with_the_loss():
    # A ratio rounded to exactly 1 + clip_high in float32 is not clipped, for a float bound and a
    # tensor bound alike; the masks are the tokens the metrics count.
    log_prob = torch.tensor([[math.log(1.3), math.log(1.3000001)]], dtype=torch.float32)
    old = torch.zeros_like(log_prob)
    adv = torch.ones(1)
    mask = torch.ones(1, 2)
    for bound in (0.3, torch.tensor([0.3])):
        _, metrics, clipped = ppo_clip_loss(log_prob, old, adv, mask, clip_high=bound)
        assert clipped.high.tolist() == [[False, True]]
        assert metrics["clip/frac_high"] == int(clipped.high.sum()) / 2


def test_bad_shapes_are_refused():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="advantages"):
        ppo_clip_loss(x, x, torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="clip_high"):
        ppo_clip_loss(x, x, torch.zeros(2), torch.ones(2, 3), clip_high=torch.zeros(3))
