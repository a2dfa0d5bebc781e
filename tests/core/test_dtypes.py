"""The working dtypes the formulas promise, fed the dtypes users pass: integer rewards, half
precision entropies and advantages, float64 beside float32. A result that merely equals the
float32 computation when the input is already float32 is what this pins."""

from __future__ import annotations

import torch

from entropyrl.core import advantages as adv
from entropyrl.core import maxent
from entropyrl.core.entropy import sequence_entropy
from entropyrl.core.losses import ppo_clip_loss

GROUP = torch.tensor([0, 0, 0, 1, 1])
SCORES = torch.tensor([1, 0, 1, 3, 0])  # integer rewards (a pass/fail reward)


def test_integer_rewards_give_float32_advantages():
    out = adv.grpo_advantage(SCORES, GROUP)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, adv.grpo_advantage(SCORES.float(), GROUP))
    weights, _ = maxent.maxent_advantage(SCORES, torch.zeros(5), GROUP, beta=0.0)
    assert weights.dtype == torch.float32


def test_half_precision_entropy_is_read_in_the_advantages_dtype():
    entropy = torch.tensor([0.5, 1.25, 2.0, 0.75, 0.125], dtype=torch.float16)
    for fn in (adv.egpo_bonus_advantage, adv.egpo_ratio_advantage):
        half, metrics = fn(SCORES.float(), entropy, GROUP)
        full, want = fn(SCORES.float(), entropy.float(), GROUP)
        assert half.dtype == torch.float32
        torch.testing.assert_close(half, full)
        assert metrics == want


def test_token_shaping_works_in_float32_for_half_inputs():
    a = torch.tensor([1.0, -0.5], dtype=torch.float16)
    h = torch.tensor([[0.25, 3.0], [1.0, 0.0]], dtype=torch.float16)
    mask = torch.tensor([[1, 1], [1, 0]])
    out = adv.entropy_shaped_token_advantage(a, h, mask)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, adv.entropy_shaped_token_advantage(a.float(), h.float(), mask))
    assert adv.entropy_shaped_token_advantage(a, h, mask, alpha=0.0).dtype == torch.float32
    assert adv.broadcast_to_tokens(a.double(), mask).dtype == torch.float64


def test_sequence_entropy_of_half_entropies_is_float32():
    h = torch.tensor([[0.1, 0.2], [0.3, 0.4]], dtype=torch.float16)
    out = sequence_entropy(h, torch.ones(2, 2))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, sequence_entropy(h.float(), torch.ones(2, 2)))


def test_the_loss_is_in_the_log_probs_dtype():
    log_prob = torch.tensor([[-1.0, -0.5], [-2.0, -0.1]])
    old = log_prob - 0.3
    advantages = torch.tensor([1.0, -1.0], dtype=torch.float64)
    loss, metrics, _ = ppo_clip_loss(log_prob, old, advantages, torch.ones(2, 2), agg=None)
    assert loss.dtype == torch.float32
    want, _, _ = ppo_clip_loss(log_prob, old, advantages.float(), torch.ones(2, 2), agg=None)
    torch.testing.assert_close(loss, want)
    assert all(type(v) is float for v in metrics.values())
