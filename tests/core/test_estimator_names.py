"""Every list of estimator names derives from the table's declarations (`@estimator` in
`entropyrl/core/algorithms.py`), read by import and, without torch, from the source."""

from __future__ import annotations

import pytest
import torch

from entropyrl.core import estimator_names
from entropyrl.core.algorithms import ESTIMATORS, EstimatorInputs, estimate
from entropyrl.core.specs import AlgorithmSpecs, MaxEntSpec


def test_the_source_reading_sees_what_the_import_registers():
    """The torch-free reading of the decorators gives the table the import builds."""
    assert {
        name: {"entropy": e.entropy, "reference": e.reference, "in_verl": e.in_verl}
        for name, e in ESTIMATORS.items()
    } == estimator_names.ESTIMATOR_NEEDS
    assert estimator_names.VERL_ESTIMATORS == ("egpo", "egpo_ratio", "entropy_adv", "maxent_grpo")


def test_an_estimator_is_defined_once():
    from entropyrl.core.algorithms import estimator

    with pytest.raises(ValueError, match="defined twice"):
        estimator("egpo")(lambda inputs, specs: None)


def test_every_reader_uses_the_names():
    from entropyrl.rig.local import config
    from entropyrl.rig.smoke import check as smoke_check

    assert tuple(ESTIMATORS) == config.ADV_ESTIMATORS
    assert set(smoke_check.ENTROPY_ESTIMATORS) <= set(ESTIMATORS)


def test_entropy_estimators_are_those_that_fall_back_without_entropy():
    """`ENTROPY_ESTIMATORS` (the smoke check requires `egpo/entropy/missing` from them) are
    exactly the estimators that, without per-token entropy, count every sample as missing."""
    n = 4
    inputs = EstimatorInputs(
        scores=torch.tensor([1.0, 0.0, 0.5, 0.25]),
        group=torch.tensor([0, 0, 1, 1]),
        mask=torch.ones(n, 3),
    )
    specs = AlgorithmSpecs(maxent=MaxEntSpec(beta=0.0))  # no reference log-probs either
    counting = {
        name
        for name in ESTIMATORS
        if estimate(name, inputs, specs).metrics.get("egpo/entropy/missing") == n
    }
    assert counting == set(estimator_names.ENTROPY_ESTIMATORS)


def test_verl_registers_every_name():
    pytest.importorskip("verl")
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

    import entropyrl.verl.plugin as plugin

    assert tuple(plugin.ESTIMATORS) == estimator_names.VERL_ESTIMATORS
    for name in estimator_names.VERL_ESTIMATORS:
        assert name in ADV_ESTIMATOR_REGISTRY, name
    assert "grpo" in ADV_ESTIMATOR_REGISTRY  # verl's own
