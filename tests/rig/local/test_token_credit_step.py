"""The local runner's RL step with the token penalty, the token clip and the clip-low schedule.

The step's own loss call is watched: what reaches `ppo_clip_loss` must equal the written-out
formula on the rollout's hallucinated tokens (the reward's positions).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import entropyrl.rig.local.rl as rl
from entropyrl.core.specs import ClipScheduleSpec
from entropyrl.rig.local.rl import RewardOutput, rl_step


class _SpanTask:
    """Even rows hallucinate (CHAIR_i 0.5) on their first two response tokens."""

    def __init__(self, tokenizer, positions: bool = True) -> None:
        self.tokenizer = tokenizer
        self.ids = tokenizer.encode("describe the picture")
        self.positions = positions

    def prompts(self, items):
        n = len(items)
        return {
            "input_ids": torch.tensor([self.ids] * n),
            "attention_mask": torch.ones(n, len(self.ids), dtype=torch.long),
        }

    def reward(self, texts, items, responses=None):
        n = len(texts)
        scores = np.array([len(t) % 5 for t in texts], dtype=np.float64)
        chair_i = np.where(np.arange(n) % 2 == 0, 0.5, 0.0)
        spans = [[0, 1] if i % 2 == 0 else [] for i in range(n)] if self.positions else None
        return RewardOutput(scores, chair_i, {}, hallucinated_positions=spans)


def _run(small_tokenizer, monkeypatch, positions: bool = True, **token):
    from entropyrl.rig.local.config import DemoConfig
    from entropyrl.rig.local.runner import rl_settings
    from entropyrl.rig.tiny import TinyModelConfig, build_tiny_qwen2

    calls, seen = [], {}
    plain_loss, plain_generate = rl.ppo_clip_loss, rl.generate

    def loss(log_prob, old, adv, mask, **kwargs):
        calls.append({"adv": adv.detach().clone(), "mask": mask.clone(), **kwargs})
        return plain_loss(log_prob, old, adv, mask, **kwargs)

    def generate(*args, **kwargs):
        seen["responses"], seen["mask"] = plain_generate(*args, **kwargs)
        return seen["responses"], seen["mask"]

    monkeypatch.setattr(rl, "ppo_clip_loss", loss)
    monkeypatch.setattr(rl, "generate", generate)
    cfg = DemoConfig(
        adv="grpo",
        samples_per_prompt=4,
        max_new_tokens=6,
        ppo_epochs=1,
        num_minibatches=1,
        clip_schedule={"enable": False},
    )
    settings = rl_settings(cfg, cfg.variants()[0])
    for key, value in token.items():
        setattr(settings, key, value)
    torch.manual_seed(0)
    model = build_tiny_qwen2(small_tokenizer, TinyModelConfig(hidden_size=64), seed=0)
    metrics = rl_step(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        _SpanTask(small_tokenizer, positions),
        [0, 1],
        settings,
        tokenizer=small_tokenizer,
        suppress=[],
        generator=torch.Generator().manual_seed(0),
    )
    (call,) = calls  # one epoch, one mini-batch: every row, in the generator's order
    return metrics, call, seen["mask"], settings


def _hall(mask, order):
    hall = torch.zeros(mask.shape)
    for row, sample in enumerate(order.tolist()):
        if sample % 2 == 0:
            hall[row, :2] = 1.0
    return hall * mask


def test_token_penalty_moves_only_hallucinated_tokens(small_tokenizer, monkeypatch):
    _, plain, _, _ = _run(small_tokenizer, monkeypatch)
    metrics, pen, mask, _ = _run(small_tokenizer, monkeypatch, token_penalty_beta=0.7)
    order = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    hall = _hall(mask[order], order)
    m = pen["mask"].bool()
    want = plain["adv"].expand(m.shape) - 0.7 * hall
    torch.testing.assert_close(pen["adv"][m], want[m])
    assert metrics["hallucinated_token_frac"] == pytest.approx(float(hall.sum() / m.sum()))


def test_token_clip_bounds_reach_the_loss(small_tokenizer, monkeypatch):
    _, call, mask, settings = _run(small_tokenizer, monkeypatch, token_clip=(0.05, 0.6))
    order = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    hall = _hall(mask[order], order).bool()
    m = call["mask"].bool()
    low, high = call["clip_low"], call["clip_high"]
    assert low.shape == high.shape == m.shape
    assert (high[hall] == 0.6).all() and (low[hall] == 0.05).all()
    base = m & ~hall
    assert torch.allclose(high[base], torch.tensor(settings.ppo.clip_high, dtype=high.dtype))
    assert torch.allclose(low[base], torch.tensor(settings.ppo.clip_low, dtype=low.dtype))


def test_clip_low_schedule_reaches_the_loss(small_tokenizer, monkeypatch):
    spec = ClipScheduleSpec(enable=True, low=0.2, high=0.4)
    metrics, call, _, _ = _run(small_tokenizer, monkeypatch, clip_low_schedule=spec)
    order = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    want = torch.where(order % 2 == 0, 0.4, 0.2)
    torch.testing.assert_close(call["clip_low"], want.to(call["clip_low"].dtype))
    assert metrics["clip_low"] == pytest.approx(0.3)


def test_a_reward_without_positions_is_refused(small_tokenizer, monkeypatch):
    with pytest.raises(ValueError, match="hallucinated token positions"):
        _run(small_tokenizer, monkeypatch, positions=False, token_penalty_beta=0.5)
