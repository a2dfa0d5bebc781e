"""Both engines give the advantages and clip bounds that the formulas written out in the smoke
check (`entropyrl.rig.smoke.check`, independent of `entropyrl.core.advantages`,
`entropyrl.core.clip_schedules` and verl) give for the same spec and inputs.

verl path: the trainer's input builder (`hooks.build_step`) and verl's own
`compute_advantage` calling our registered estimator; local path: `local.rl.compute_advantages`
and `local.rl.sample_clip_high` as `rl_step` calls them. One spec, parsed once from a
verl-style `algorithm` mapping, drives both. The engines share one table of estimators by
design, so comparing them with each other alone would hold by construction: each is compared
with the written-out formula, through its own input plumbing (segments, groups, the
reference's log-probs).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo.ray_trainer import compute_advantage

import entropyrl.verl.plugin  # noqa: F401  (registers the estimators)
from entropyrl.core.algorithms import ESTIMATORS
from entropyrl.core.specs import PpoClipSpec, algorithm_specs
from entropyrl.rig.local.rl import RLSettings, compute_advantages, sample_clip_high
from entropyrl.rig.smoke.check import clip_rule, expected_advantages
from entropyrl.verl.hooks import build_step, clip_high_from_chair
from entropyrl.verl.inputs import with_step

THINK = ([90], [91])  # token ids of <think> and </think> in these hand-built responses
ALGORITHM = {
    "norm_adv_by_std_in_grpo": True,
    "entropy": {"mode": "answer", "source": "logits"},
    "egpo_bonus": {"lam": 0.3, "alpha": 1.5},
    "egpo_ratio": {"lambda_min": 0.6, "lambda_max": 1.8},
    "entropy_adv": {"alpha": 0.5, "kappa": 3.0},
    "maxent": {"tau": 0.8, "beta": 0.2, "source": "ranks"},
    "clip_schedule": {"enable": True, "rule": "sigmoid", "low": 0.25, "high": 0.45},
}


def batch(seed: int, groups: int = 3, per_group: int = 4, width: int = 8):
    gen = torch.Generator().manual_seed(seed)
    n = groups * per_group
    lengths = torch.randint(2, width + 1, (n,), generator=gen)
    mask = (torch.arange(width)[None] < lengths[:, None]).long()
    responses = torch.randint(0, 80, (n, width), generator=gen) * mask
    responses[::2, 1] = THINK[1][0]  # half the responses close a thinking segment at token 1
    scores = torch.randint(0, 4, (n,), generator=gen).float() / 3
    rewards = torch.zeros(n, width)
    rewards[torch.arange(n), lengths - 1] = scores
    group = torch.tensor([(i * 5) % groups for i in range(n)])
    entropy = torch.rand(n, width, generator=gen) * 2 * mask
    ref = -torch.rand(n, width, generator=gen) * mask
    chair = torch.rand(n, generator=gen) * 0.4
    chair[0] = 0.0  # a clean caption
    chair[3] = float("nan")
    return responses, mask, rewards, scores, group, entropy, ref, chair


def local_settings(name, specs):
    """The local runner's settings for estimator `name` with the algorithm sections `specs`."""
    return RLSettings(
        adv=name,
        specs=specs,
        ppo=PpoClipSpec(),
        samples_per_prompt=4,
        temperature=1.0,
        max_new_tokens=8,
        num_minibatches=2,
        ppo_epochs=1,
        kl_coef=0.0,
        max_grad_norm=1.0,
        think_ids=THINK,
    )


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
@pytest.mark.parametrize("seed", [0, 1])
def test_same_advantages(name, seed):
    responses, mask, rewards, scores, group, entropy, ref, _ = batch(seed)
    algorithm = OmegaConf.create({**ALGORITHM, "adv_estimator": name})
    specs = algorithm_specs(algorithm)

    step, _ = build_step(
        specs=specs,
        estimator=name,
        response_mask=mask,
        responses=responses,
        entropy=entropy,
        old_log_probs=None,
        ref_log_prob=ref,
        think_ids=THINK,
    )
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask.float()},
        non_tensors={"uid": np.array([f"p{g}" for g in group.tolist()], dtype=object)},
    )
    verl_data, _ = with_step(
        step, lambda: compute_advantage(data, adv_estimator=name, config=algorithm)
    )
    verl_adv = verl_data.batch["advantages"]

    settings = local_settings(name, specs)
    local = compute_advantages(
        settings,
        scores,
        group,
        entropy,
        mask,
        responses=responses,
        ref_seq_log_prob=(ref * mask).sum(-1),
    )
    reference = written_out(name, algorithm, responses, mask, scores, group, entropy, ref)
    tolerance = {"atol": 1e-5, "rtol": 1e-5}  # float32 against float64 arithmetic
    torch.testing.assert_close(verl_adv, reference, **tolerance)
    if name != "grpo":  # the local runner's grpo gives a group of one 0, verl's r / (1 + eps)
        torch.testing.assert_close(local.token.float(), reference, **tolerance)


def written_out(name, algorithm, responses, mask, scores, group, entropy, ref) -> torch.Tensor:
    """The smoke check's formulas on the same batch, as a [B, T] tensor (0 on padding)."""
    rows = []
    for i in range(len(scores)):
        keep = mask[i].bool()
        rows.append(
            {
                "score": float(scores[i]),
                "group": int(group[i]),
                "response": responses[i][keep].tolist(),
                "entropy": entropy[i][keep].tolist(),
                "ref_log_prob": ref[i][keep].tolist(),
                "advantages": [0.0] * int(keep.sum()),
            }
        )
    values, _ = expected_advantages(rows, OmegaConf.create({"algorithm": algorithm}), THINK[1])
    out = torch.zeros(mask.shape)
    for i, row_values in enumerate(values):
        out[i, : len(row_values)] = torch.tensor(row_values)
    return out


@pytest.mark.parametrize("rule", ["step", "linear", "sigmoid"])
@pytest.mark.parametrize("direction", ["hallucinated_high", "hallucinated_low"])
def test_same_clip_bounds(rule, direction):
    *_, chair = batch(3)
    schedule = {**ALGORITHM["clip_schedule"], "rule": rule, "direction": direction}
    specs = algorithm_specs({**ALGORITHM, "clip_schedule": schedule})
    verl_bounds, _ = clip_high_from_chair(chair, specs.clip_schedule)
    settings = local_settings("grpo", specs)
    local_bounds = sample_clip_high(settings, chair.numpy(), len(chair))
    reference = [clip_rule(None if c != c else float(c), schedule) for c in chair.tolist()]
    assert verl_bounds.tolist() == pytest.approx(reference, abs=1e-6)
    assert local_bounds.tolist() == pytest.approx(reference, abs=1e-6)
    # the batch spans the rule's range: both ends for `step`, many values for the others
    assert len({round(b, 4) for b in reference}) >= (2 if rule == "step" else 5)
    assert verl_bounds[3] == pytest.approx(0.25)  # no CHAIR score: the neutral (low) bound
