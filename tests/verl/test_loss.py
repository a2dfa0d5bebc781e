"""The per-sample clip-high loss through verl's own `ppo_loss` (hand-built micro-batches).

Without a `clip_high` field it must be verl's `vanilla`; with one, each row's gradient is
gated by its own clip_high, with verl's global normalisation, KL and entropy terms kept.
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu

import entropyrl.verl.plugin  # noqa: F401  (registers the policy loss)
from entropyrl.verl.loss import CLIP_FIELD, LOSS_NAME, PerSampleClipPPOLoss
from entropyrl.verl.rank_metrics import global_batch_metrics

PROMPT = 3


def actor_config(chair_config, **changes):
    actor = OmegaConf.create(OmegaConf.to_container(chair_config.actor_rollout_ref.actor))
    for key, value in changes.items():
        OmegaConf.update(actor, key, value)
    return actor


def micro_batch(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    lengths: torch.Tensor,
    *,
    clip_high: torch.Tensor | None = None,
    batch_num_tokens: int | None = None,
    global_batch_size: int | None = None,
    dp_size: int = 1,
):
    """(model_output, data) laid out as verl's engines hand them to the loss (padded mode)."""
    batch, width = log_prob.shape
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).float()
    # Flat model output: per sample, prompt + response tokens; the log-prob of response token j
    # sits at position PROMPT - 1 + j (verl shifts model outputs by one).
    pieces = []
    for i in range(batch):
        n = int(lengths[i])
        pieces += [torch.zeros(PROMPT - 1), log_prob[i, :n], torch.zeros(1)]
    values = torch.cat(pieces)
    attention = torch.cat([torch.ones(batch, PROMPT), mask], dim=1).long()
    fields = {
        "prompts": torch.ones(batch, PROMPT, dtype=torch.long),
        "responses": torch.ones(batch, width, dtype=torch.long),
        "attention_mask": attention,
        "response_mask": mask,
        "old_log_probs": old_log_prob,
        "advantages": advantages.unsqueeze(-1) * mask,
        "ref_log_prob": old_log_prob - 0.1,
    }
    if clip_high is not None:
        fields[CLIP_FIELD] = clip_high
    data = TensorDict(fields, batch_size=batch)
    tu.assign_non_tensor(
        data,
        dp_size=dp_size,
        batch_num_tokens=batch_num_tokens,
        global_batch_size=global_batch_size,
    )
    return {"log_probs": values, "entropy": values.detach().abs()}, data


def case(seed: int = 0, batch: int = 4, width: int = 5):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, width, generator=gen) - 0.5
    # Ratios between 0.5 and 1.8: both clip bounds are crossed somewhere.
    log_ratio = torch.empty(batch, width).uniform_(-0.7, 0.6, generator=gen)
    lengths = torch.randint(2, width + 1, (batch,), generator=gen)
    adv = torch.randn(batch, generator=gen)
    return old + log_ratio, old, adv, lengths


def metric(value) -> float:
    """verl wraps metrics in `Metric` objects holding a list of values."""
    values = getattr(value, "values", [value])
    return float(torch.as_tensor(values[-1]))


def run(loss_fn, log_prob, old, adv, lengths, **kwargs):
    leaf = log_prob.clone().requires_grad_(True)
    model_output, data = micro_batch(leaf, old, adv, lengths, **kwargs)
    loss, metrics = loss_fn(model_output, data)
    loss.backward()
    return loss.detach(), leaf.grad, metrics


def test_without_field_equals_vanilla(chair_config):
    from verl.workers.utils.losses import ppo_loss

    ours = PerSampleClipPPOLoss(actor_config(chair_config))
    vanilla_config = PerSampleClipPPOLoss(
        actor_config(chair_config, **{"policy_loss.loss_mode": "vanilla"})
    ).config()

    def vanilla(model_output, data):
        return ppo_loss(vanilla_config, model_output, data)

    for seed in range(3):
        log_prob, old, adv, lengths = case(seed)
        loss_a, grad_a, metrics_a = run(ours, log_prob, old, adv, lengths, batch_num_tokens=40)
        loss_b, grad_b, metrics_b = run(vanilla, log_prob, old, adv, lengths, batch_num_tokens=40)
        assert torch.equal(loss_a, loss_b)
        assert torch.equal(grad_a, grad_b)
        assert set(metrics_a) == set(metrics_b)


@pytest.mark.parametrize(
    "agg",
    [
        "token-mean",
        "token-sum",
        "seq-mean-token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-sum-norm",
    ],
)
def test_constant_field_matches_vanilla_with_global_normalisation(chair_config, agg):
    """A field equal to the config's clip_high everywhere reproduces vanilla, incl. dp scaling."""
    from verl.workers.utils.losses import ppo_loss

    ours = PerSampleClipPPOLoss(actor_config(chair_config, loss_agg_mode=agg))
    vanilla_config = PerSampleClipPPOLoss(
        actor_config(chair_config, loss_agg_mode=agg, **{"policy_loss.loss_mode": "vanilla"})
    ).config()
    log_prob, old, adv, lengths = case(1)
    eps = torch.full((4,), float(chair_config.actor_rollout_ref.actor.clip_ratio_high))
    kwargs = {"batch_num_tokens": 37, "global_batch_size": 7, "dp_size": 2}
    loss_a, grad_a, metrics_a = run(ours, log_prob, old, adv, lengths, clip_high=eps, **kwargs)

    def vanilla(model_output, data):
        loss, metrics = ppo_loss(vanilla_config, model_output, data)
        return loss, global_batch_metrics(metrics, data)  # as our loss callable reports them

    loss_b, grad_b, metrics_b = run(vanilla, log_prob, old, adv, lengths, **kwargs)
    torch.testing.assert_close(loss_a, loss_b)
    torch.testing.assert_close(grad_a, grad_b)
    for key in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
        assert metric(metrics_a[key]) == pytest.approx(metric(metrics_b[key]), abs=1e-6), key


def reference_pg_loss(log_prob, old, adv, mask, clip_low, clip_high, clip_c, num_tokens):
    """Plain per-token PPO clipped surrogate with a per-row clip_high (token-mean over num_tokens)."""
    total = 0.0
    for i in range(log_prob.shape[0]):
        for t in range(log_prob.shape[1]):
            if mask[i, t] == 0:
                continue
            ratio = torch.exp(log_prob[i, t] - old[i, t])
            clipped = min(max(ratio, 1 - clip_low), 1 + clip_high[i])
            loss = max(-adv[i] * ratio, -adv[i] * clipped)
            if adv[i] < 0:
                loss = min(loss, -adv[i] * clip_c)
            total = total + loss
    return total / num_tokens


def test_field_gates_gradients_per_row(chair_config):
    actor = actor_config(chair_config, use_kl_loss=False, entropy_coeff=0.0)
    ours = PerSampleClipPPOLoss(actor)
    width = 3
    old = torch.zeros(2, width)
    # Both rows: ratio 1.4 on every token, positive advantage.
    log_prob = old + torch.log(torch.tensor(1.4))
    adv = torch.tensor([1.0, 1.0])
    lengths = torch.tensor([width, width])
    eps = torch.tensor([0.3, 0.5])
    loss, grad, metrics = run(ours, log_prob, old, adv, lengths, clip_high=eps)
    # Row 0 (eps 0.3): 1.4 > 1.3 is clipped, no gradient. Row 1 (eps 0.5): not clipped.
    assert torch.all(grad[0] == 0)
    assert torch.all(grad[1] != 0)
    # d/dlogp of -A * ratio / num_tokens = -1.4 / 6
    torch.testing.assert_close(grad[1], torch.full((width,), -1.4 / 6))
    mask = torch.ones(2, width)
    expected = reference_pg_loss(log_prob, old, adv, mask, 0.2, eps.tolist(), 3.0, 6)
    torch.testing.assert_close(loss, torch.as_tensor(expected, dtype=loss.dtype))
    assert metric(metrics["actor/pg_clipfrac"]) == pytest.approx(0.5)
    # Swapping the bounds swaps which row learns.
    _, grad_swapped, _ = run(ours, log_prob, old, adv, lengths, clip_high=eps.flip(0))
    assert torch.all(grad_swapped[1] == 0) and torch.all(grad_swapped[0] != 0)


def test_random_rows_match_reference(chair_config):
    actor = actor_config(chair_config, use_kl_loss=False, entropy_coeff=0.0)
    ours = PerSampleClipPPOLoss(actor)
    log_prob, old, adv, lengths = case(2, batch=6, width=6)
    eps = torch.tensor([0.3, 0.5, 0.3, 0.5, 0.1, 0.9])
    loss, grad, _ = run(ours, log_prob, old, adv, lengths, clip_high=eps)
    mask = (torch.arange(6).unsqueeze(0) < lengths.unsqueeze(1)).float()
    leaf = log_prob.clone().requires_grad_(True)
    expected = reference_pg_loss(leaf, old, adv, mask, 0.2, eps.tolist(), 3.0, mask.sum())
    expected.backward()
    torch.testing.assert_close(loss, expected.detach())
    torch.testing.assert_close(grad, leaf.grad)


def test_field_with_other_loss_mode_is_an_error(chair_config):
    loss_fn = PerSampleClipPPOLoss(
        actor_config(chair_config, **{"policy_loss.loss_mode": "vanilla"})
    )
    log_prob, old, adv, lengths = case(0)
    with pytest.raises(ValueError, match=LOSS_NAME):
        run(loss_fn, log_prob, old, adv, lengths, clip_high=torch.full((4,), 0.3))


def test_field_travels_with_rows_through_minibatches_and_epochs():
    """verl's mini-batch iterator and micro-batch split keep `clip_high` row-aligned."""
    rows = 8
    ids = torch.nested.as_nested_tensor(
        [torch.full((i % 3 + 1,), float(i)) for i in range(rows)], layout=torch.jagged
    )
    data = TensorDict({"row": ids, CLIP_FIELD: torch.arange(rows).float() / 10}, batch_size=rows)
    seen = []
    for mini in tu.make_iterator(
        data, mini_batch_size=4, epochs=2, seed=3, dataloader_kwargs={"shuffle": True}
    ):
        for micro in tu.chunk_tensordict(mini, 2):
            row = micro["row"].to_padded_tensor(-1.0)[:, 0]
            torch.testing.assert_close(micro[CLIP_FIELD], row / 10)
            seen += row.tolist()
    assert sorted(seen) == sorted(list(range(rows)) * 2)


def test_loss_callable_pickles_without_the_built_config(chair_config):
    import pickle

    loss_fn = PerSampleClipPPOLoss(actor_config(chair_config))
    loss_fn.config()
    clone = pickle.loads(pickle.dumps(loss_fn))
    assert clone._config is None
    assert clone.config().policy_loss.loss_mode == LOSS_NAME


def test_rollout_correction_weights_reach_the_per_sample_loss(chair_config):
    """Rollout correction on (verl's `rollout_is_weights` [B, T]): with a constant field the loss
    and its gradient equal verl's vanilla loss with the same weights, row by row."""
    from verl.workers.utils.losses import ppo_loss

    ours = PerSampleClipPPOLoss(actor_config(chair_config))
    vanilla_config = PerSampleClipPPOLoss(
        actor_config(chair_config, **{"policy_loss.loss_mode": "vanilla"})
    ).config()
    log_prob, old, adv, lengths = case(2)
    weights = torch.linspace(0.2, 2.0, log_prob.numel()).reshape(log_prob.shape)
    eps = torch.full((4,), float(chair_config.actor_rollout_ref.actor.clip_ratio_high))

    def weighted(loss_fn, **kwargs):
        leaf = log_prob.clone().requires_grad_(True)
        model_output, data = micro_batch(
            leaf, old, adv, lengths, batch_num_tokens=20, global_batch_size=4, **kwargs
        )
        data["rollout_is_weights"] = weights
        loss, _ = loss_fn(model_output, data)
        loss.backward()
        return loss.detach(), leaf.grad

    loss_a, grad_a = weighted(ours, clip_high=eps)
    loss_b, grad_b = weighted(lambda out, data: ppo_loss(vanilla_config, out, data))
    torch.testing.assert_close(loss_a, loss_b)
    torch.testing.assert_close(grad_a, grad_b)
