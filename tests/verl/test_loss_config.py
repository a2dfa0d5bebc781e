"""The per-sample clip loss reads what the step does not carry from the actor's config.

A user's `actor.clip_ratio`, `clip_ratio_low`, `clip_ratio_high` and `clip_ratio_c` must mean in
`per_sample_clip` what they mean in verl's `vanilla`: with the step's bound equal to the
config's, the two losses (and gradients) are the same, whatever the config says; without any
bound in the step, the call is verl's own, its aggregation and rollout-correction weights kept.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

import entropyrl.verl.plugin  # noqa: F401  (registers the policy loss)
from entropyrl.verl.inputs import Step
from entropyrl.verl.loss import (
    HALLUCINATED_FIELD,
    PerSampleClipPPOLoss,
    clip_high_field,
    hallucinated_tokens_field,
    per_sample_clip_loss,
)


def actor(chair_config, **changes):
    """verl's ActorConfig dataclass (as the worker builds it) from the recipe's actor section."""
    section = OmegaConf.create(OmegaConf.to_container(chair_config.actor_rollout_ref.actor))
    for key, value in changes.items():
        OmegaConf.update(section, key, value)
    return PerSampleClipPPOLoss(section).config()


def case(seed: int = 0, batch: int = 6, width: int = 5):
    """Ratios from 0.4 to 2.2 and advantages of both signs: every bound (dual clip too) binds."""
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, width, generator=gen) - 0.5
    log_prob = old + torch.empty(batch, width).uniform_(-0.9, 0.8, generator=gen)
    lengths = torch.randint(2, width + 1, (batch,), generator=gen)
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).float()
    adv = torch.randn(batch, generator=gen).unsqueeze(-1) * mask
    return log_prob, old, adv, mask


def both(step, config, agg="token-mean", weights=None, seed=0):
    """(ours, vanilla): loss and gradient of each on the same case."""
    log_prob, old, adv, mask = case(seed)
    out = []
    for fn in (lambda **kw: per_sample_clip_loss(step, **kw), compute_policy_loss_vanilla):
        leaf = log_prob.clone().requires_grad_(True)
        loss, metrics = fn(
            old_log_prob=old,
            log_prob=leaf,
            advantages=adv,
            response_mask=mask,
            loss_agg_mode=agg,
            config=config,
            rollout_is_weights=weights,
        )
        loss.backward()
        out.append((loss.detach(), leaf.grad, metrics))
    return out


CONFIGS = {
    # clip_ratio alone: both bounds fall back to it, as in vanilla
    "clip_ratio only": {"clip_ratio": 0.1, "clip_ratio_low": None, "clip_ratio_high": None},
    "asymmetric": {"clip_ratio": 0.1, "clip_ratio_low": 0.15, "clip_ratio_high": 0.35},
    "dual clip 1.5": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 1.5},
}


def bounds(config) -> tuple[float, float]:
    low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    return low, high


@pytest.mark.parametrize("carried", ["clip_high", "clip_low"])
@pytest.mark.parametrize("changes", list(CONFIGS.values()), ids=list(CONFIGS))
def test_the_bound_the_step_leaves_out_is_the_config_s(chair_config, changes, carried):
    config = actor(chair_config, **changes)
    low, high = bounds(config)
    value = high if carried == "clip_high" else low
    step = Step(**{carried: torch.full((6,), value)})
    (loss_a, grad_a, metrics_a), (loss_b, grad_b, metrics_b) = both(step, config)
    torch.testing.assert_close(loss_a, loss_b)
    torch.testing.assert_close(grad_a, grad_b)
    for key in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
        assert float(metrics_a[key]) == pytest.approx(metrics_b[key], abs=1e-6), key
    # ... and the config's values matter: the default bounds give another loss here.
    default = actor(chair_config)
    (loss_d, _, _), _ = both(Step(**{carried: torch.full((6,), value)}), default)
    assert not torch.allclose(loss_a, loss_d)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_without_bounds_it_is_verl_s_call_with_its_aggregation_and_weights(chair_config, agg):
    config = actor(chair_config)
    weights = torch.linspace(0.3, 1.7, 30).reshape(6, 5)
    (loss_a, grad_a, _), (loss_b, grad_b, _) = both(Step(), config, agg=agg, weights=weights)
    assert torch.equal(loss_a, loss_b) and torch.equal(grad_a, grad_b)
    # the weights and the mode reach the call: without them the loss differs
    (plain, _, _), _ = both(Step(), config, agg="token-sum")
    assert not torch.allclose(loss_a, plain)


def test_the_default_aggregation_is_verl_s_token_mean(chair_config):
    config = actor(chair_config)
    log_prob, old, adv, mask = case(3)
    step = Step(clip_high=torch.full((6,), 0.28))
    common = dict(old_log_prob=old, log_prob=log_prob, advantages=adv, response_mask=mask)
    implicit, _ = per_sample_clip_loss(step, config=config, **common)
    explicit, _ = per_sample_clip_loss(step, config=config, loss_agg_mode="token-mean", **common)
    assert torch.equal(implicit, explicit)


def reference(log_prob, old, adv, mask, low, high, clip_c):
    """Plain token-mean of the dual-clip PPO surrogate."""
    ratio = torch.exp(log_prob - old)
    surrogate = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - low, 1 + high))
    surrogate = torch.where(adv < 0, torch.minimum(surrogate, -adv * clip_c), surrogate)
    return (surrogate * mask).sum() / mask.sum()


def test_without_a_config_the_bounds_are_ppo_s_defaults():
    """No actor config (a direct call): clip 0.2 both ways and dual clip 3.0 (`PpoClipSpec`)."""
    log_prob, old, adv, mask = case(4)
    step = Step(clip_high=torch.full((6,), 0.2))
    common = dict(old_log_prob=old, log_prob=log_prob, advantages=adv, response_mask=mask)
    loss, _ = per_sample_clip_loss(step, config=None, **common)
    torch.testing.assert_close(loss, reference(log_prob, old, adv, mask, 0.2, 0.2, 3.0))
    # A config object that names only some fields: the others fall back the same way.
    sparse = SimpleNamespace(clip_ratio=0.1, global_batch_info={})
    loss, _ = per_sample_clip_loss(step, config=sparse, **common)
    torch.testing.assert_close(loss, reference(log_prob, old, adv, mask, 0.1, 0.2, 3.0))


def test_the_token_clip_refuses_a_missing_or_misshapen_mask():
    log_prob, old, adv, mask = case(5)
    common = dict(old_log_prob=old, log_prob=log_prob, advantages=adv, response_mask=mask)
    with pytest.raises(ValueError, match=r"token clip needs .*\[6, 5\], got None"):
        per_sample_clip_loss(Step(token_clip=(0.1, 0.1)), **common)
    wrong = Step(token_clip=(0.1, 0.1), hallucinated_tokens=torch.zeros(6, 3))
    with pytest.raises(ValueError, match=r"\[6, 5\], got \[6, 3\]"):
        per_sample_clip_loss(wrong, **common)


def test_batch_fields_are_read_per_row_and_checked():
    from tensordict import TensorDict

    per_token = torch.tensor([[0.3, 0.3, 0.3], [0.5, 0.5, 0.5]], dtype=torch.float64)
    data = TensorDict({"clip_high": per_token}, batch_size=2)
    got = clip_high_field(data)
    assert got.dtype == torch.float32 and got.tolist() == pytest.approx([0.3, 0.5])
    assert clip_high_field(data, "clip_low") is None
    with pytest.raises(TypeError, match="'clip_high' must be a tensor, got"):
        clip_high_field({"clip_high": [0.3, 0.5]})
    mask = TensorDict({HALLUCINATED_FIELD: torch.tensor([[1, 0], [0, 0]])}, batch_size=2)
    got = hallucinated_tokens_field(mask)
    assert got.dtype == torch.float32 and got.tolist() == [[1.0, 0.0], [0.0, 0.0]]
    with pytest.raises(TypeError, match=r"must be a \[B, T\] tensor"):
        hallucinated_tokens_field({HALLUCINATED_FIELD: torch.ones(2)})
    with pytest.raises(TypeError, match=r"must be a \[B, T\] tensor"):
        hallucinated_tokens_field({HALLUCINATED_FIELD: [[1, 0]]})


def test_a_pickled_loss_keeps_its_field_and_token_clip(chair_config):
    import pickle

    section = chair_config.actor_rollout_ref.actor
    loss = PerSampleClipPPOLoss(section, field="my_clip", token_clip=(0.05, 0.1))
    clone = pickle.loads(pickle.dumps(loss))
    assert clone.field == "my_clip" and clone.token_clip == (0.05, 0.1)
    # a loss pickled before the token clip existed loads with it off
    old = PerSampleClipPPOLoss.__new__(PerSampleClipPPOLoss)
    old.__setstate__({"actor_config": section, "field": "clip_high", "_config": None})
    assert old.token_clip is None
