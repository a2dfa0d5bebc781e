"""Our estimators called through verl's own `compute_advantage` on a DataProto.

They must give the numbers of `entropyrl.core.advantages` / `entropyrl.core.maxent` called
directly, and plain verl GRPO when no entropy is available.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo.ray_trainer import compute_advantage

import entropyrl.verl.plugin  # noqa: F401  (registers the estimators)
from entropyrl.core import advantages as core
from entropyrl.core.maxent import maxent_advantage
from entropyrl.core.specs import SpecError, algorithm_specs
from entropyrl.verl.estimators import group_ids
from entropyrl.verl.inputs import Step, with_step

ALGORITHM = OmegaConf.create(
    {
        "adv_estimator": "egpo",
        "norm_adv_by_std_in_grpo": True,
        "egpo_bonus": {"lam": 0.4, "alpha": 2.0},
        "egpo_ratio": {"lambda_min": 0.5, "lambda_max": 2.0, "entropy_epsilon": 1e-6},
        "entropy_adv": {"alpha": 0.4, "kappa": 2.0},
        "maxent": {"tau": 0.7, "beta": 0.2, "source": "rewards", "temperature": 1.0},
    }
)


def make_batch(seed: int, groups: int = 3, per_group: int = 4, width: int = 7):
    """Rewards on each response's last token, string uids in shuffled order, random entropies."""
    gen = torch.Generator().manual_seed(seed)
    batch = groups * per_group
    lengths = torch.randint(1, width + 1, (batch,), generator=gen)
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).float()
    scores = torch.randint(0, 3, (batch,), generator=gen).float() / 2
    rewards = torch.zeros(batch, width)
    rewards[torch.arange(batch), lengths - 1] = scores
    uid = np.array([f"prompt-{(i * 7) % groups}" for i in range(batch)], dtype=object)
    entropy = torch.rand(batch, width, generator=gen) * 3 * mask
    ref = -torch.rand(batch, width, generator=gen) * mask
    return rewards, mask, uid, scores, entropy, ref


def through_verl(name: str, rewards, mask, uid, step: Step | None, config=ALGORITHM):
    """verl's advantage step for `name` inside `step`: (advantages, returns, metrics)."""
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards.clone(), "response_mask": mask.clone()},
        non_tensors={"uid": uid},
    )
    if step is None:
        out, metrics = compute_advantage(data, adv_estimator=name, config=config), {}
    else:
        out, metrics = with_step(
            step, lambda: compute_advantage(data, adv_estimator=name, config=config)
        )
    return out.batch["advantages"], out.batch["returns"], metrics


def reference_entropy(entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Plain per-row mean over the mask; NaN for an empty row."""
    rows = []
    for e, m in zip(entropy, mask):
        picked = [float(v) for v, keep in zip(e, m) if keep > 0]
        rows.append(sum(picked) / len(picked) if picked else float("nan"))
    return torch.tensor(rows)


def int_groups(uid) -> torch.Tensor:
    labels = sorted(set(uid))
    return torch.tensor([labels.index(u) for u in uid])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_egpo_equals_core(seed):
    rewards, mask, uid, scores, entropy, _ = make_batch(seed)
    adv, returns, got = through_verl("egpo", rewards, mask, uid, Step(token_entropy=entropy))
    expected, metrics = core.egpo_bonus_advantage(
        scores, reference_entropy(entropy, mask), int_groups(uid), lam=0.4, alpha=2.0
    )
    torch.testing.assert_close(adv, expected.unsqueeze(-1) * mask)
    torch.testing.assert_close(returns, adv)
    assert got["egpo/bonus/mean"] == pytest.approx(metrics["egpo/bonus/mean"])
    assert got["egpo/entropy/missing"] == 0


@pytest.mark.parametrize("name", ["egpo", "egpo_ratio", "entropy_adv"])
def test_without_entropy_is_verl_grpo(name):
    rewards, mask, uid, *_ = make_batch(3)
    verl_grpo, _, _ = through_verl("grpo", rewards, mask, uid, None)
    ours, _, metrics = through_verl(name, rewards, mask, uid, Step())
    torch.testing.assert_close(ours, verl_grpo, atol=1e-5, rtol=1e-5)
    assert metrics["egpo/entropy/missing"] == mask.shape[0]
    # No context at all (verl's stock trainer): the same fallback.
    ours, _, _ = through_verl(name, rewards, mask, uid, None)
    torch.testing.assert_close(ours, verl_grpo, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", [0, 4])
def test_egpo_ratio_equals_core_on_segment(seed):
    rewards, mask, uid, scores, entropy, _ = make_batch(seed)
    # Entropy over a segment: drop each response's first token.
    segment = mask.clone()
    segment[:, 0] = 0
    step = Step(token_entropy=entropy, segment_mask=segment.bool())
    adv, _, metrics = through_verl("egpo_ratio", rewards, mask, uid, step)
    expected, _ = core.egpo_ratio_advantage(
        scores,
        reference_entropy(entropy, segment),
        int_groups(uid),
        lambda_min=0.5,
        lambda_max=2.0,
        entropy_eps=1e-6,
    )
    torch.testing.assert_close(adv, expected.unsqueeze(-1) * mask)
    # One-token responses have an empty segment: counted as missing, plain GRPO for them.
    empty = int((segment.sum(-1) == 0).sum())
    assert metrics["egpo/entropy/missing"] == empty


def test_entropy_adv_equals_core():
    rewards, mask, uid, scores, entropy, _ = make_batch(5)
    adv, _, _ = through_verl("entropy_adv", rewards, mask, uid, Step(token_entropy=entropy))
    base = core.grpo_advantage(scores, int_groups(uid))
    expected = core.entropy_shaped_token_advantage(base, entropy, mask, alpha=0.4, kappa=2.0)
    torch.testing.assert_close(adv, expected)


def test_maxent_equals_core_and_needs_reference():
    rewards, mask, uid, scores, _, ref = make_batch(6)
    adv, _, _ = through_verl("maxent_grpo", rewards, mask, uid, Step(ref_log_prob=ref))
    expected, _ = maxent_advantage(
        scores, (ref * mask).sum(-1), int_groups(uid), tau=0.7, beta=0.2, source="rewards"
    )
    torch.testing.assert_close(adv, expected.unsqueeze(-1) * mask)
    with pytest.raises(ValueError, match="reference policy"):
        through_verl("maxent_grpo", rewards, mask, uid, Step())


def test_group_ids_from_uid_strings():
    ids = group_ids(np.array(["b", "a", "b", "c", "a"], dtype=object), 5)
    assert ids.dtype == torch.long
    assert ids[0] == ids[2] and ids[1] == ids[4]
    assert len(set(ids.tolist())) == 3
    assert group_ids(None, 3).tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="index"):
        group_ids(np.array(["a", "b"], dtype=object), 3)


def test_permuting_the_batch_permutes_the_advantages():
    rewards, mask, uid, _, entropy, _ = make_batch(7)
    perm = torch.randperm(mask.shape[0], generator=torch.Generator().manual_seed(0))
    adv, _, _ = through_verl("egpo", rewards, mask, uid, Step(token_entropy=entropy))
    adv_p, _, _ = through_verl(
        "egpo",
        rewards[perm],
        mask[perm],
        uid[perm.numpy()],
        Step(token_entropy=entropy[perm]),
    )
    torch.testing.assert_close(adv_p, adv[perm])


def test_a_removed_key_stops_the_estimator_with_its_new_name():
    rewards, mask, uid, _, entropy, _ = make_batch(8)
    old = OmegaConf.create({"adv_estimator": "egpo", "egpo_lambda": 0.3})
    with pytest.raises(
        SpecError, match=r"algorithm\.egpo_lambda was removed: use algorithm\.egpo_bonus\.lam"
    ):
        through_verl("egpo", rewards, mask, uid, Step(token_entropy=entropy), old)


def test_misspelt_key_is_refused_naming_it():
    rewards, mask, uid, _, entropy, _ = make_batch(9)
    bad = OmegaConf.create({"adv_estimator": "egpo", "egpo_bonus": {"lamda": 0.3}})
    with pytest.raises(ValueError, match=r"'lamda'.*accepted: lam, alpha"):
        through_verl("egpo", rewards, mask, uid, Step(token_entropy=entropy), bad)


def test_each_estimator_is_defined_under_its_verl_name():
    """Registered where defined (as verl's own core_algos), one per declared name."""
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

    from entropyrl.core.estimator_names import VERL_ESTIMATORS
    from entropyrl.verl import estimators

    for name in VERL_ESTIMATORS:
        registered = ADV_ESTIMATOR_REGISTRY[name]
        assert registered.__name__ == f"compute_{name}_advantage"
        assert getattr(estimators, registered.__name__) is registered


def test_the_step_carries_the_parsed_specs():
    """Inside a step the estimator reads the run's specs, parsed once, not verl's config."""
    rewards, mask, uid, scores, entropy, _ = make_batch(10)
    specs = algorithm_specs({"egpo_bonus": {"lam": 0.1}})
    bad = OmegaConf.create({"adv_estimator": "egpo", "egpo_bonus": {"lamda": 0.3}})
    step = Step(specs=specs, token_entropy=entropy)
    adv, _, _ = through_verl("egpo", rewards, mask, uid, step, bad)
    expected, _ = core.egpo_bonus_advantage(
        scores, reference_entropy(entropy, mask), int_groups(uid), lam=0.1, alpha=2.0
    )
    torch.testing.assert_close(adv, expected.unsqueeze(-1) * mask)


def verl_grpo(rewards, mask, uid, norm_by_std: bool) -> torch.Tensor:
    """verl's own GRPO advantages with its `norm_adv_by_std_in_grpo` argument."""
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards.clone(), "response_mask": mask.clone()},
        non_tensors={"uid": uid},
    )
    out = compute_advantage(data, adv_estimator="grpo", norm_adv_by_std_in_grpo=norm_by_std)
    return out.batch["advantages"]


def algo_config(norm: bool):
    """`algorithm` as verl's trainer hands it over: its AlgoConfig dataclass."""
    from verl.trainer.config import AlgoConfig

    return AlgoConfig(adv_estimator="egpo", norm_adv_by_std_in_grpo=norm)


@pytest.mark.parametrize("form", ["dictconfig", "algo_config"])
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("name", ["egpo", "egpo_ratio", "entropy_adv"])
def test_norm_adv_by_std_in_grpo_is_verl_s_switch(name, norm, form):
    """`algorithm.norm_adv_by_std_in_grpo=false` (Dr. GRPO's centring only) reaches our estimators
    as it reaches verl's GRPO, in both forms verl's trainer passes `algorithm` in."""
    rewards, mask, uid, *_ = make_batch(11)
    if form == "dictconfig":
        config = OmegaConf.merge(ALGORITHM, {"norm_adv_by_std_in_grpo": norm})
    else:
        config = algo_config(norm)
    ours, _, _ = through_verl(name, rewards, mask, uid, Step(), config)
    torch.testing.assert_close(ours, verl_grpo(rewards, mask, uid, norm), atol=1e-5, rtol=1e-5)
    # The two settings differ on this batch, so the test tells them apart.
    assert not torch.allclose(
        verl_grpo(rewards, mask, uid, True), verl_grpo(rewards, mask, uid, False)
    )


def test_norm_by_std_reads_attributes_and_defaults_to_verl_s():
    """A config object without `get` is read by attribute; None or missing is verl's default."""
    from types import SimpleNamespace

    from entropyrl.verl.estimators import estimator_inputs, norm_by_std

    assert norm_by_std(None) is True
    assert norm_by_std(OmegaConf.create({})) is True
    assert norm_by_std(OmegaConf.create({"norm_adv_by_std_in_grpo": None})) is True
    assert norm_by_std(OmegaConf.create({"norm_adv_by_std_in_grpo": False})) is False
    assert norm_by_std(SimpleNamespace()) is True
    assert norm_by_std(SimpleNamespace(norm_adv_by_std_in_grpo=None)) is True
    assert norm_by_std(SimpleNamespace(norm_adv_by_std_in_grpo=False)) is False
    assert norm_by_std(SimpleNamespace(norm_adv_by_std_in_grpo=0)) is False
    rewards, mask, uid, *_ = make_batch(12)
    off = SimpleNamespace(norm_adv_by_std_in_grpo=False)
    assert estimator_inputs(rewards, mask, off, uid).norm_by_std is False
    assert estimator_inputs(rewards, mask, None, uid).norm_by_std is True


def test_group_ids_from_a_tensor_index():
    """Integer uids as a tensor (a custom dataset's) group as their values do."""
    ids = group_ids(torch.tensor([7, 3, 7, 9, 3]), 5)
    assert ids.dtype == torch.long and ids.shape == (5,)
    assert ids.tolist() == [1, 0, 1, 2, 0]
