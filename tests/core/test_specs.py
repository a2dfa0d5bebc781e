"""`entropyrl.core.specs`: one holder per default, strict parsing, deprecated keys."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from entropyrl.core import advantages, clip_schedules, losses, maxent
from entropyrl.core.specs import (
    REMOVED_KEYS,
    SPEC_CLASSES,
    AlgorithmSpecs,
    ClipScheduleSpec,
    EgpoBonusSpec,
    EgpoRatioSpec,
    MaxEntSpec,
    PpoClipSpec,
    SpecError,
    TokenShapingSpec,
    algorithm_specs,
)

# (core function, its keyword, spec class, spec field): the function's default is the spec's.
# (The clip schedule's function takes the spec itself: `clip_schedules.clip_high_bounds`.)
SIGNATURE_DEFAULTS = [
    (advantages.egpo_bonus_advantage, "lam", EgpoBonusSpec, "lam"),
    (advantages.egpo_bonus_advantage, "alpha", EgpoBonusSpec, "alpha"),
    (advantages.egpo_ratio_advantage, "lambda_min", EgpoRatioSpec, "lambda_min"),
    (advantages.egpo_ratio_advantage, "lambda_max", EgpoRatioSpec, "lambda_max"),
    (advantages.egpo_ratio_advantage, "entropy_eps", EgpoRatioSpec, "entropy_epsilon"),
    (advantages.entropy_shaped_token_advantage, "alpha", TokenShapingSpec, "alpha"),
    (advantages.entropy_shaped_token_advantage, "kappa", TokenShapingSpec, "kappa"),
    (maxent.maxent_advantage, "tau", MaxEntSpec, "tau"),
    (maxent.maxent_advantage, "beta", MaxEntSpec, "beta"),
    (maxent.maxent_advantage, "source", MaxEntSpec, "source"),
    (maxent.maxent_advantage, "temperature", MaxEntSpec, "temperature"),
    (losses.ppo_clip_loss, "clip_low", PpoClipSpec, "clip_low"),
    (losses.ppo_clip_loss, "clip_high", PpoClipSpec, "clip_high"),
    (losses.ppo_clip_loss, "clip_c", PpoClipSpec, "clip_c"),
]


@pytest.mark.parametrize(("fn", "keyword", "spec", "name"), SIGNATURE_DEFAULTS)
def test_core_defaults_are_the_specs(fn, keyword, spec, name):
    default = inspect.signature(fn).parameters[keyword].default
    assert default == getattr(spec(), name)


def test_every_core_hyper_parameter_has_a_spec_field():
    """A new keyword with a default in a core estimator must come from a spec."""
    covered = {(fn.__name__, keyword) for fn, keyword, *_ in SIGNATURE_DEFAULTS}
    for fn in (
        advantages.egpo_bonus_advantage,
        advantages.egpo_ratio_advantage,
        advantages.entropy_shaped_token_advantage,
        maxent.maxent_advantage,
    ):
        for name, parameter in inspect.signature(fn).parameters.items():
            if parameter.default is not inspect.Parameter.empty and name not in (
                "norm_by_std",
                "eps",
            ):
                assert (fn.__name__, name) in covered, (fn.__name__, name)


@pytest.mark.parametrize("spec", SPEC_CLASSES)
def test_unknown_key_names_itself_and_the_accepted_ones(spec):
    with pytest.raises(SpecError) as error:
        spec.from_mapping({"no_such_key": 1}, f"algorithm.{spec.SECTION}")
    message = str(error.value)
    assert f"algorithm.{spec.SECTION}: unknown key 'no_such_key'" in message
    for f in dataclasses.fields(spec):
        assert f.name in message


def test_values_are_checked_and_typed():
    with pytest.raises(SpecError, match="rule: must be one of"):
        ClipScheduleSpec.from_mapping({"rule": "cubic"})
    with pytest.raises(SpecError, match=r"clip_schedule\.low: expected a number"):
        ClipScheduleSpec.from_mapping({"low": "high"})
    with pytest.raises(SpecError, match="enable: expected true or false"):
        ClipScheduleSpec.from_mapping({"enable": "yes"})
    with pytest.raises(SpecError, match="lambda_min <= lambda_max"):
        EgpoRatioSpec(lambda_min=3.0, lambda_max=2.0)
    with pytest.raises(SpecError, match="saturation"):
        ClipScheduleSpec(rule="linear", threshold=0.5, saturation=0.1)
    with pytest.raises(SpecError, match="tau"):
        MaxEntSpec(tau=0.0, beta=0.0)
    assert ClipScheduleSpec.from_mapping({"low": 1, "neutral": None}).low == 1.0
    assert ClipScheduleSpec.from_mapping(None) == ClipScheduleSpec()


def test_algorithm_specs_reads_only_its_sections():
    specs = algorithm_specs(
        {"adv_estimator": "egpo", "gamma": 1.0, "egpo_bonus": {"lam": 0.2}, "maxent": None}
    )
    assert specs.egpo_bonus.lam == 0.2 and specs.maxent == MaxEntSpec()
    assert algorithm_specs(None) == AlgorithmSpecs()
    with pytest.raises(SpecError, match="expected a mapping"):
        algorithm_specs({"clip_schedule": 0.3})


def test_keys_of_the_first_configs_are_refused_with_their_new_name():
    """0.1's first flat keys were removed in 0.2: ignored, they would keep the defaults in
    silence, so each is refused with the key that replaced it."""
    with pytest.raises(SpecError) as caught:
        algorithm_specs({"egpo_lambda": 0.3, "egpo": {"entropy_mode": "full"}})
    assert str(caught.value) == (
        "algorithm.egpo_lambda was removed: use algorithm.egpo_bonus.lam; "
        "algorithm.egpo.entropy_mode was removed: use algorithm.entropy.mode"
    )
    for old, new in REMOVED_KEYS.items():
        config = {"egpo": {old[5:]: 1}} if old.startswith("egpo.") else {old: 1}
        with pytest.raises(SpecError, match=rf"algorithm\.{old} was removed: use algorithm\.{new}"):
            algorithm_specs(config)
    with pytest.raises(SpecError, match=r"algorithm\.egpo was removed .* unknown key 'lamda'"):
        algorithm_specs({"egpo": {"lamda": 0.1}})
    assert algorithm_specs({"egpo": {}}) == AlgorithmSpecs()  # an empty leftover says nothing


def test_schedule_bounds_use_the_spec():
    import torch

    spec = ClipScheduleSpec(enable=True, rule="step", low=0.1, high=0.9, threshold=0.5)
    bounds = clip_schedules.clip_high_bounds(torch.tensor([0.0, 0.6, float("nan")]), spec)
    assert bounds.tolist() == pytest.approx([0.1, 0.9, 0.1])
    assert clip_schedules.clip_high_bounds(None, spec, batch_size=2).tolist() == pytest.approx(
        [0.1, 0.1]
    )


def test_specs_do_not_import_the_schedule():
    """The spec holds data and checks; the rule's math is `clip_schedules`' (no import circle)."""
    import ast
    from pathlib import Path

    import entropyrl.core.specs

    modules = set()
    for node in ast.walk(ast.parse(Path(entropyrl.core.specs.__file__).read_text())):
        if isinstance(node, ast.ImportFrom):
            modules.add(node.module or "")
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    assert not {name for name in modules if name.startswith("entropyrl")}


def test_token_sections_have_the_documented_defaults():
    specs = algorithm_specs(None)
    assert (specs.token_penalty.enable, specs.token_penalty.beta) == (False, 1.0)
    assert (specs.token_clip.enable, specs.token_clip.low, specs.token_clip.high) == (
        False,
        0.2,
        0.5,
    )
    low = specs.clip_low_schedule
    assert (low.enable, low.rule, low.low, low.high) == (False, "step", 0.2, 0.4)
    # the clip-low rule takes the clip schedule's shape and keys
    assert [f.name for f in dataclasses.fields(low)] == [
        f.name for f in dataclasses.fields(ClipScheduleSpec)
    ]


@pytest.mark.parametrize("other", ["clip_schedule", "clip_low_schedule"])
def test_token_clip_beside_a_per_sample_schedule_is_refused_in_one_line(other):
    both = {"token_clip": {"enable": True}, other: {"enable": True}}
    with pytest.raises(SpecError) as refusal:
        algorithm_specs(both)
    message = str(refusal.value)
    assert "\n" not in message
    assert message == (
        f"algorithm.token_clip.enable=true contradicts algorithm.{other}.enable=true "
        "(both set hallucinating samples' bounds): set one of them false"
    )
    # either switch alone, or the token clip beside the token penalty, is accepted
    algorithm_specs({"token_clip": {"enable": True}, "token_penalty": {"enable": True}})
    algorithm_specs({other: {"enable": True}, "token_penalty": {"enable": True}})
    algorithm_specs({"token_clip": {"enable": True}, other: {"enable": False}})


@pytest.mark.parametrize(
    ("section", "key", "value", "rule"),
    [
        ("token_penalty", "beta", -0.5, "must be >= 0"),
        ("token_penalty", "beta", float("inf"), "must be >= 0"),
        ("token_clip", "low", 1.0, "must be < 1"),
        ("token_clip", "high", -0.1, "must be finite and >= 0"),
        ("clip_low_schedule", "high", 1.0, "must be < 1"),
        ("clip_low_schedule", "neutral", 1.5, "must be < 1"),
        ("clip_low_schedule", "low", -0.1, "must be finite and >= 0"),
    ],
)
def test_token_sections_check_their_values(section, key, value, rule):
    with pytest.raises(SpecError, match=f"^algorithm.{section}.{key}: {rule}"):
        algorithm_specs({section: {key: value}})
    algorithm_specs({section: {key: 0.3}})
