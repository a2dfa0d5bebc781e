"""The token clip and the clip-low bound through verl's own `ppo_loss` (hand-built micro-batches).

Each token of a hallucinated mention gets the token clip's (low, high), every other token the
sample's bounds; the loss and its gradient equal a written-out per-token loop.
"""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu

import entropyrl.verl.plugin  # noqa: F401  (registers the policy loss)
from entropyrl.verl.loss import (
    CLIP_FIELD,
    CLIP_LOW_FIELD,
    HALLUCINATED_FIELD,
    PerSampleClipPPOLoss,
)

PROMPT = 3


def actor_config(chair_config, **changes):
    actor = OmegaConf.create(OmegaConf.to_container(chair_config.actor_rollout_ref.actor))
    for key, value in {"use_kl_loss": False, "entropy_coeff": 0.0, **changes}.items():
        OmegaConf.update(actor, key, value)
    return actor


def micro_batch(log_prob, old, adv, lengths, fields):
    """(model_output, data) laid out as verl's engines hand them to the loss (padded mode)."""
    batch, width = log_prob.shape
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).float()
    pieces = []
    for i in range(batch):
        n = int(lengths[i])
        pieces += [torch.zeros(PROMPT - 1), log_prob[i, :n], torch.zeros(1)]
    values = torch.cat(pieces)
    data = TensorDict(
        {
            "prompts": torch.ones(batch, PROMPT, dtype=torch.long),
            "responses": torch.ones(batch, width, dtype=torch.long),
            "attention_mask": torch.cat([torch.ones(batch, PROMPT), mask], dim=1).long(),
            "response_mask": mask,
            "old_log_probs": old,
            "advantages": adv.unsqueeze(-1) * mask,
            **fields,
        },
        batch_size=batch,
    )
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    return {"log_probs": values, "entropy": values.detach().abs()}, data, mask


def reference(log_prob, old, adv, mask, hall, low, high, tok, clip_c=3.0):
    """Per-token loop: the token's bounds chosen by hand; token mean over the response."""
    total, count = 0.0, 0
    for i in range(log_prob.shape[0]):
        for t in range(log_prob.shape[1]):
            if mask[i, t] == 0:
                continue
            lo, hi = tok if hall[i, t] == 1 else (low[i], high[i])
            ratio = torch.exp(log_prob[i, t] - old[i, t])
            loss = torch.maximum(-adv[i] * ratio, -adv[i] * ratio.clamp(1 - lo, 1 + hi))
            if adv[i] < 0:
                loss = torch.minimum(loss, -adv[i] * clip_c)
            total, count = total + loss, count + 1
    return total / count


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("per_sample", [False, True])
def test_token_clip_matches_reference(chair_config, seed, per_sample):
    gen = torch.Generator().manual_seed(seed)
    batch, width = 5, 6
    old = -torch.rand(batch, width, generator=gen) - 0.5
    log_prob = old + torch.empty(batch, width).uniform_(-0.7, 0.6, generator=gen)
    lengths = torch.randint(1, width + 1, (batch,), generator=gen)
    adv = torch.randn(batch, generator=gen)
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).float()
    hall = (torch.rand(batch, width, generator=gen) < 0.4).float() * mask
    tok = (0.05, 0.6)
    actor = actor_config(chair_config)
    base_low, base_high = float(actor.clip_ratio_low), float(actor.clip_ratio_high)
    fields = {HALLUCINATED_FIELD: hall}
    low, high = [base_low] * batch, [base_high] * batch
    if per_sample:
        low = torch.rand(batch, generator=gen).mul(0.5).tolist()
        high = torch.rand(batch, generator=gen).mul(0.5).tolist()
        fields[CLIP_LOW_FIELD] = torch.tensor(low)
        fields[CLIP_FIELD] = torch.tensor(high)
    loss_fn = PerSampleClipPPOLoss(actor, token_clip=tok)
    leaf = log_prob.clone().requires_grad_(True)
    model_output, data, _ = micro_batch(leaf, old, adv, lengths, fields)
    loss, metrics = loss_fn(model_output, data)
    loss.backward()
    ref_leaf = log_prob.clone().requires_grad_(True)
    # the bounds the loss sees are float32, as the batch carries them
    f32 = [[float(torch.tensor(v, dtype=torch.float32)) for v in row] for row in (low, high)]
    want = reference(ref_leaf, old, adv, mask, hall, f32[0], f32[1], tok)
    want.backward()
    torch.testing.assert_close(loss, want.detach())
    torch.testing.assert_close(leaf.grad, ref_leaf.grad)
    assert math.isfinite(float(torch.as_tensor(metrics["actor/pg_clipfrac"].values[-1])))


def test_hallucinated_token_gets_its_own_bound(chair_config):
    # ratio 1.4, A > 0 on 2 tokens: the clean token is clipped at 1 + clip_ratio_high (0.28 in
    # the recipe), the hallucinated one under the token clip's high 0.6 is not.
    actor = actor_config(chair_config, clip_ratio_high=0.28)
    old = torch.zeros(1, 2)
    log_prob = (old + math.log(1.4)).requires_grad_(True)
    hall = torch.tensor([[0.0, 1.0]])
    loss_fn = PerSampleClipPPOLoss(actor, token_clip=(0.2, 0.6))
    model_output, data, _ = micro_batch(
        log_prob, old, torch.tensor([1.0]), torch.tensor([2]), {HALLUCINATED_FIELD: hall}
    )
    loss, _ = loss_fn(model_output, data)
    loss.backward()
    assert log_prob.grad[0, 0] == 0 and log_prob.grad[0, 1] != 0


def test_a_missing_or_unexpected_mask_is_refused(chair_config):
    old = torch.zeros(2, 3)
    args = (old + 0.1, old, torch.ones(2), torch.tensor([3, 2]))
    with pytest.raises(ValueError, match="lacks 'hallucinated_tokens'"):
        model_output, data, _ = micro_batch(*args, {})
        PerSampleClipPPOLoss(actor_config(chair_config), token_clip=(0.2, 0.5))(model_output, data)
    with pytest.raises(ValueError, match="carries 'hallucinated_tokens'"):
        model_output, data, _ = micro_batch(*args, {HALLUCINATED_FIELD: torch.zeros(2, 3)})
        PerSampleClipPPOLoss(actor_config(chair_config))(model_output, data)


def test_token_clip_pickles(chair_config):
    import pickle

    clone = pickle.loads(
        pickle.dumps(PerSampleClipPPOLoss(actor_config(chair_config), token_clip=(0.1, 0.6)))
    )
    assert clone.token_clip == (0.1, 0.6) and clone._config is None
