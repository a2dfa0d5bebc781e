"""Parity with verl 0.9.1's own GRPO estimators and vanilla PPO loss (skipped without verl)."""

import numpy as np
import pytest
import torch

verl_algos = pytest.importorskip("verl.trainer.ppo.core_algos")

from entropyrl.core.advantages import grpo_advantage  # noqa: E402
from entropyrl.core.losses import AGG_MODES, ppo_clip_loss  # noqa: E402


def random_groups(seed, n_groups=40, max_size=8):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(2, max_size + 1, size=n_groups)  # verl treats singletons differently
    uids = rng.permutation(np.unique(rng.integers(0, 10**12, size=2 * n_groups)))[:n_groups]
    index = np.repeat(uids, sizes)
    perm = rng.permutation(len(index))
    index = index[perm]
    if seed % 2:
        scores = rng.integers(0, 2, size=len(index)).astype(np.float32)  # binary rewards
    else:
        scores = rng.normal(size=len(index)).astype(np.float32)
    return torch.from_numpy(scores), index


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("norm", [True, False])
def test_grpo_matches_verl(seed, norm):
    scores, index = random_groups(seed)
    seq = 5
    mask = torch.ones(len(index), seq)
    mask[:, 3:] = 0
    rewards = torch.zeros(len(index), seq)
    rewards[:, 2] = scores  # verl sums token rewards into the outcome score
    ours = grpo_advantage(scores, torch.from_numpy(index), norm_by_std=norm)
    # verl's uids are uuid strings; its vectorised path would use large integers directly as
    # table indices (a terabyte allocation for these ids), so give verl the ids as strings.
    uid_strings = np.array([f"uid-{u}" for u in index], dtype=object)
    for fn in (
        verl_algos.compute_grpo_outcome_advantage,
        verl_algos.compute_grpo_vectorized_outcome_advantage,
    ):
        adv, _ = fn(
            token_level_rewards=rewards.clone(),
            response_mask=mask,
            index=uid_strings,
            epsilon=1e-6,
            norm_adv_by_std_in_grpo=norm,
        )
        torch.testing.assert_close(adv[:, 0], ours, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(adv, ours.unsqueeze(-1) * mask, atol=1e-5, rtol=1e-5)


def test_grpo_singleton_difference_is_deliberate():
    # verl: a group of one has mean 0, std 1 -> r / (1 + eps); ours: 0 (nothing to compare to).
    scores = torch.tensor([0.7, 1.0, 0.0])
    index = np.array([5, 9, 9])
    adv, _ = verl_algos.compute_grpo_outcome_advantage(
        scores.unsqueeze(-1), torch.ones(3, 1), index
    )
    assert float(adv[0, 0]) == pytest.approx(0.7 / (1 + 1e-6))
    ours = grpo_advantage(scores, torch.from_numpy(index))
    assert float(ours[0]) == 0.0
    torch.testing.assert_close(ours[1:], adv[1:, 0])


def actor_config(clip_high, clip_c):
    from verl.workers.config import ActorConfig

    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size=2,
        clip_ratio=0.2,
        clip_ratio_low=0.2,
        clip_ratio_high=clip_high,
        clip_ratio_c=clip_c,
    )


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("seed", range(4))
def test_vanilla_loss_and_gradient_match_verl(agg, seed):
    gen = torch.Generator().manual_seed(seed)
    bsz, seq = 6, 9
    old = -torch.rand(bsz, seq, generator=gen) * 3
    new = old + torch.randn(bsz, seq, generator=gen) * 0.8
    adv = torch.randn(bsz, seq, generator=gen)
    mask = (torch.rand(bsz, seq, generator=gen) > 0.3).float()
    mask[:, 0] = 1
    clip_high = [0.28, 0.5, 0.2, 0.3][seed]
    config = actor_config(clip_high, 3.0)

    a = new.clone().requires_grad_(True)
    theirs, their_metrics = verl_algos.compute_policy_loss_vanilla(
        old_log_prob=old,
        log_prob=a,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode=agg,
        config=config,
    )
    theirs.backward()
    b = new.clone().requires_grad_(True)
    ours, metrics, _ = ppo_clip_loss(
        b, old, adv, mask, clip_low=0.2, clip_high=clip_high, clip_c=3.0, agg=agg
    )
    ours.backward()
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(b.grad, a.grad, atol=1e-7, rtol=1e-5)
    assert metrics["clip/frac_high"] + metrics["clip/frac_low"] == pytest.approx(
        their_metrics["actor/pg_clipfrac"], abs=1e-6
    )
    assert metrics["clip/frac_dual"] == pytest.approx(
        their_metrics["actor/pg_clipfrac_lower"], abs=1e-6
    )
    assert metrics["ppo_kl"] == pytest.approx(their_metrics["actor/ppo_kl"], abs=1e-6)
