"""`ppo_clip_loss` against the clipped surrogate written out token by token, for every mix of
float, per-sample and per-token bounds (the clip-low schedule gives a [B] clip_low beside a float
clip_high), log-ratios past the +-20 clamp, masked tokens, and the metrics a dashboard reads."""

from __future__ import annotations

import math

import pytest
import torch

from entropyrl.core.losses import ppo_clip_loss

B, T = 4, 6
GEN = torch.Generator().manual_seed(3)
LOG_PROB = torch.randn(B, T, generator=GEN, dtype=torch.float64) * 0.4
OLD = torch.randn(B, T, generator=GEN, dtype=torch.float64) * 0.4
LOG_PROB[0, 0], OLD[0, 0] = 30.0, 0.0  # log-ratio +30: clamped to +20
LOG_PROB[1, 1], OLD[1, 1] = -30.0, 0.0  # -30: clamped to -20
ADV = torch.tensor([1.0, -1.0, 0.5, -2.0], dtype=torch.float64)
MASK = torch.ones(B, T)
MASK[2, 4:] = 0
MASK[3, 1] = 0


def _value(bound, b, t):
    if not isinstance(bound, torch.Tensor):
        return float(bound)
    return float(bound[b]) if bound.dim() == 1 else float(bound[b, t])


def reference(clip_low, clip_high, clip_c):
    losses = torch.zeros(B, T, dtype=torch.float64)
    high = low = dual = 0
    kl = 0.0
    for b in range(B):
        a = float(ADV[b])
        for t in range(T):
            if not MASK[b, t]:
                continue
            log_ratio = min(max(float(LOG_PROB[b, t] - OLD[b, t]), -20.0), 20.0)
            rho = math.exp(log_ratio)
            lo, hi = 1.0 - _value(clip_low, b, t), 1.0 + _value(clip_high, b, t)
            unclipped, clipped = -a * rho, -a * min(max(rho, lo), hi)
            loss = max(unclipped, clipped)
            if clipped > unclipped:
                high, low = high + (a > 0), low + (a < 0)
            if clip_c is not None and a < 0:
                if loss > -a * clip_c:
                    dual += 1
                loss = min(loss, -a * clip_c)
            losses[b, t] = loss
            kl += -log_ratio
    n = float(MASK.sum())
    return losses, {
        "clip/frac_high": high / n,
        "clip/frac_low": low / n,
        "clip/frac_dual": dual / n,
        "ppo_kl": kl / n,
    }


PER_SAMPLE = torch.tensor([0.1, 0.4, 0.25, 0.05])
PER_TOKEN = torch.rand(B, T, generator=GEN) * 0.5


@pytest.mark.parametrize(
    ("clip_low", "clip_high"),
    [
        (0.2, 0.28),
        (PER_SAMPLE, 0.28),  # the clip-low schedule alone
        (0.2, PER_SAMPLE),  # the clip schedule alone
        (PER_SAMPLE, PER_SAMPLE.flip(0)),
        (PER_TOKEN, PER_TOKEN.flip(1)),  # the token clip
    ],
    ids=["floats", "low-per-sample", "high-per-sample", "both-per-sample", "per-token"],
)
@pytest.mark.parametrize("clip_c", [3.0, None])
def test_token_losses_and_metrics_equal_the_written_out_surrogate(clip_low, clip_high, clip_c):
    token_loss, metrics, _ = ppo_clip_loss(
        LOG_PROB, OLD, ADV, MASK, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c, agg=None
    )
    want, want_metrics = reference(clip_low, clip_high, clip_c)
    torch.testing.assert_close(token_loss, want)
    assert token_loss[~MASK.bool()].abs().sum() == 0  # masked tokens carry 0, not a fill value
    for name, value in want_metrics.items():
        assert metrics[name] == pytest.approx(value, rel=1e-12, abs=1e-12), name
    mean, _, _ = ppo_clip_loss(
        LOG_PROB, OLD, ADV, MASK, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c
    )
    assert float(mean) == pytest.approx(float(want.sum() / MASK.sum()))


def test_high_mean_is_over_the_tokens_and_samples_trained_on():
    mask = torch.zeros(B, T)
    mask[0, :2] = 1  # one sample with tokens ...
    mask[3, 5] = 1  # ... and one with a single token
    per_token = torch.full((B, T), 0.9)
    per_token[0, :2] = torch.tensor([0.1, 0.3])
    per_token[3, 5] = 0.5
    _, metrics, _ = ppo_clip_loss(LOG_PROB, OLD, ADV, mask, clip_high=per_token)
    assert metrics["clip/high_mean"] == pytest.approx((0.1 + 0.3 + 0.5) / 3)
    _, metrics, _ = ppo_clip_loss(LOG_PROB, OLD, ADV, mask, clip_high=PER_SAMPLE)
    assert metrics["clip/high_mean"] == pytest.approx((0.1 + 0.05) / 2)
    one = torch.zeros(B, T)
    one[2, 3] = 1
    _, metrics, _ = ppo_clip_loss(LOG_PROB, OLD, ADV, one, clip_high=per_token)
    assert metrics["clip/high_mean"] == pytest.approx(0.9)
    _, metrics, _ = ppo_clip_loss(LOG_PROB, OLD, ADV, torch.zeros(B, T), clip_high=0.28)
    assert metrics["clip/high_mean"] == 0.0


def test_shape_refusals_name_the_argument():
    with pytest.raises(ValueError, match=r"^log_prob must be \[B, T\], got shape \(4,\)$"):
        ppo_clip_loss(LOG_PROB[:, 0], OLD[:, 0], ADV, MASK[:, 0])
    with pytest.raises(ValueError, match=r"^old_log_prob shape \(4, 5\) != log_prob \(4, 6\)$"):
        ppo_clip_loss(LOG_PROB, OLD[:, :5], ADV, MASK)
    with pytest.raises(ValueError, match=r"^mask shape \(4, 5\) != log_prob \(4, 6\)$"):
        ppo_clip_loss(LOG_PROB, OLD, ADV, MASK[:, :5])
    with pytest.raises(ValueError, match=r"^clip_high as a tensor must be \[B\] = \[4\]"):
        ppo_clip_loss(LOG_PROB, OLD, ADV, MASK, clip_high=torch.zeros(3))
    with pytest.raises(ValueError, match=r"^clip_low must be a finite float >= 0, got -0\.1$"):
        ppo_clip_loss(LOG_PROB, OLD, ADV, MASK, clip_low=-0.1)
    ppo_clip_loss(LOG_PROB, OLD, ADV, MASK, clip_low=0.0)  # zero is a bound
