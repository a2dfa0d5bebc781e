"""The RL step's per-group metrics: entropy and clip fractions of hallucinating vs clean samples."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from entropyrl.rig.local.rl import RewardOutput, hallucination_split_metrics, rl_step


def test_split_metrics_against_hand_computed_values():
    # Three samples: hallucinated (CHAIR_i 0.5), clean (0.0), unscored (NaN).
    chair_i = np.array([0.5, 0.0, np.nan])
    entropy = torch.tensor([[1.0, 2.0, 9.0], [0.5, 0.5, 0.5], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1]])
    # Two PPO epochs: token counts seen are 2 x 2 = 4 (hallucinated) and 2 x 3 = 6 (clean).
    high = torch.tensor([1.0, 3.0, 5.0])
    low = torch.tensor([2.0, 0.0, 5.0])
    got = hallucination_split_metrics(chair_i, entropy, mask, high, low, updates=2)
    assert got == pytest.approx(
        {
            "entropy/hallucinated": 1.5,  # (1 + 2) / 2; the padded 9 is left out
            "entropy/clean": 0.5,
            "clip_frac_high/hallucinated": 1 / 4,
            "clip_frac_low/hallucinated": 2 / 4,
            "clip_frac_high/clean": 3 / 6,
            "clip_frac_low/clean": 0.0,
        }
    )


def test_split_metrics_leave_out_an_empty_group_and_need_chair():
    entropy = torch.ones(2, 2)
    mask = torch.ones(2, 2)
    zeros = torch.zeros(2)
    got = hallucination_split_metrics(np.array([0.0, 0.0]), entropy, mask, zeros, zeros, 1)
    assert set(got) == {"entropy/clean", "clip_frac_high/clean", "clip_frac_low/clean"}
    assert hallucination_split_metrics(None, entropy, mask, zeros, zeros, 1) == {}
    unscored = np.array([np.nan, np.nan])
    assert hallucination_split_metrics(unscored, entropy, mask, zeros, zeros, 1) == {}


class _TextTask:
    """Fixed text prompts; even rollout rows hallucinate (CHAIR_i 0.5), odd ones are clean."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids = tokenizer.encode("describe the picture")

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
        return RewardOutput(scores=scores, chair_i=chair_i, metrics={})


def _step(small_tokenizer, monkeypatch, *, lr: float, epochs: int, minibatches: int):
    """One GRPO step of a tiny text model; returns (metrics, response mask of the rollout)."""
    import entropyrl.rig.local.rl as rl
    from entropyrl.rig.local.config import DemoConfig
    from entropyrl.rig.local.runner import rl_settings
    from entropyrl.rig.tiny import TinyModelConfig, build_tiny_qwen2

    seen = {}
    plain_generate = rl.generate

    def generate(*args, **kwargs):
        seen["responses"], seen["mask"] = plain_generate(*args, **kwargs)
        return seen["responses"], seen["mask"]

    monkeypatch.setattr(rl, "generate", generate)
    cfg = DemoConfig(
        adv="grpo",
        samples_per_prompt=4,
        max_new_tokens=8,
        ppo_epochs=epochs,
        num_minibatches=minibatches,
        clip_schedule={"enable": False},
        ppo={"clip_high": 0.05, "clip_low": 0.05},
    )
    torch.manual_seed(0)
    model = build_tiny_qwen2(small_tokenizer, TinyModelConfig(hidden_size=64), seed=0)
    metrics = rl_step(
        model,
        torch.optim.SGD(model.parameters(), lr=lr),
        _TextTask(small_tokenizer),
        [0, 1],
        rl_settings(cfg, cfg.variants()[0]),
        tokenizer=small_tokenizer,
        suppress=[],
        generator=torch.Generator().manual_seed(0),
    )
    return metrics, seen["mask"]


def test_rl_step_splits_are_consistent_with_the_batch_metrics(small_tokenizer, monkeypatch):
    m, mask = _step(small_tokenizer, monkeypatch, lr=5.0, epochs=3, minibatches=1)
    for group in ("hallucinated", "clean"):
        for key in ("entropy", "clip_frac_high", "clip_frac_low"):
            assert math.isfinite(m[f"{key}/{group}"]), (key, group)
    # Large steps on tight bounds: some tokens are clipped.
    assert m["clip_frac_high"] + m["clip_frac_low"] > 0
    # One mini-batch: the batch fraction is clipped tokens / tokens over the epochs, so it is
    # the token-weighted mean of the two groups' fractions; the same holds for the entropy.
    tokens = mask.sum(-1).double()
    share = float(tokens[0::2].sum() / tokens.sum())  # even rows hallucinate
    for key in ("clip_frac_high", "clip_frac_low", "entropy"):
        combined = share * m[f"{key}/hallucinated"] + (1 - share) * m[f"{key}/clean"]
        assert combined == pytest.approx(m[key], rel=1e-5, abs=1e-9), key


def test_rl_step_without_a_policy_change_clips_nothing(small_tokenizer, monkeypatch):
    m, _ = _step(small_tokenizer, monkeypatch, lr=0.0, epochs=2, minibatches=2)
    for group in ("hallucinated", "clean"):
        assert m[f"clip_frac_high/{group}"] == 0.0 and m[f"clip_frac_low/{group}"] == 0.0
