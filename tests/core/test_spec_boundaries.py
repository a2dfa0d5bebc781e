"""Every range a section documents, probed at its edge: the value on the edge is accepted or
refused as its docstring says, and a refusal is the exact one line a user reads, naming
`<section>.<key>` (`entropyrl.core.specs`)."""

from __future__ import annotations

import math

import pytest
from omegaconf import OmegaConf

from entropyrl.core import specs as S

INF = math.inf
NAN = math.nan

# (spec class, settings, the exact message or None where the settings are accepted)
EDGES: list[tuple[type[S.Spec], dict, str | None]] = [
    # clip_schedule: low/high/threshold/neutral finite and >= 0
    (S.ClipScheduleSpec, {"low": 0, "high": 0, "threshold": 0, "neutral": 0}, None),
    (S.ClipScheduleSpec, {"low": -0.1}, "clip_schedule.low: must be finite and >= 0, got -0.1"),
    (S.ClipScheduleSpec, {"high": INF}, "clip_schedule.high: must be finite and >= 0, got inf"),
    (
        S.ClipScheduleSpec,
        {"threshold": -1e-9},
        "clip_schedule.threshold: must be finite and >= 0, got -1e-09",
    ),
    (
        S.ClipScheduleSpec,
        {"neutral": -1},
        "clip_schedule.neutral: must be finite and >= 0, got -1.0",
    ),
    (
        S.ClipScheduleSpec,
        {"neutral": INF},
        "clip_schedule.neutral: must be finite and >= 0, got inf",
    ),
    (
        S.ClipScheduleSpec,
        {"rule": "Step"},
        "clip_schedule.rule: must be one of ('step', 'linear', 'sigmoid'), got 'Step'",
    ),
    (
        S.ClipScheduleSpec,
        {"direction": "high"},
        "clip_schedule.direction: must be one of ('hallucinated_high', 'hallucinated_low'), got 'high'",
    ),
    (S.ClipScheduleSpec, {"direction": "hallucinated_low"}, None),
    # the linear rule needs saturation > threshold; other rules do not read it
    (
        S.ClipScheduleSpec,
        {"rule": "linear", "threshold": 0.25, "saturation": 0.25},
        "clip_schedule.saturation: must be > threshold for rule 'linear', got 0.25",
    ),
    (S.ClipScheduleSpec, {"rule": "linear", "threshold": 0.25, "saturation": 0.2500001}, None),
    (S.ClipScheduleSpec, {"rule": "step", "threshold": 0.25, "saturation": 0.0}, None),
    # the sigmoid rule needs temperature > 0; other rules do not read it
    (
        S.ClipScheduleSpec,
        {"rule": "sigmoid", "temperature": 0},
        "clip_schedule.temperature: must be > 0, got 0.0",
    ),
    (S.ClipScheduleSpec, {"rule": "sigmoid", "temperature": 1e-9}, None),
    (S.ClipScheduleSpec, {"rule": "linear", "temperature": 0}, None),
    # clip_low_schedule: every bound below 1
    (S.ClipLowScheduleSpec, {"low": 0.999, "high": 0.999, "neutral": 0.999}, None),
    (
        S.ClipLowScheduleSpec,
        {"low": 1},
        "clip_low_schedule.low: must be < 1 (at 1 the ratio has no floor), got 1.0",
    ),
    (
        S.ClipLowScheduleSpec,
        {"high": 1},
        "clip_low_schedule.high: must be < 1 (at 1 the ratio has no floor), got 1.0",
    ),
    (
        S.ClipLowScheduleSpec,
        {"neutral": 1},
        "clip_low_schedule.neutral: must be < 1 (at 1 the ratio has no floor), got 1.0",
    ),
    (
        S.ClipLowScheduleSpec,
        {"low": -0.5},
        "clip_low_schedule.low: must be finite and >= 0, got -0.5",
    ),
    # token_penalty: beta finite and >= 0
    (S.TokenPenaltySpec, {"beta": 0}, None),
    (S.TokenPenaltySpec, {"beta": -0.5}, "token_penalty.beta: must be >= 0, got -0.5"),
    (S.TokenPenaltySpec, {"beta": INF}, "token_penalty.beta: must be >= 0, got inf"),
    # token_clip: low in [0, 1), high >= 0
    (S.TokenClipSpec, {"low": 0, "high": 0}, None),
    (S.TokenClipSpec, {"low": 0.999, "high": 1.0}, None),
    (
        S.TokenClipSpec,
        {"low": 1},
        "token_clip.low: must be < 1 (at 1 the ratio has no floor), got 1.0",
    ),
    (S.TokenClipSpec, {"low": -0.1}, "token_clip.low: must be finite and >= 0, got -0.1"),
    (S.TokenClipSpec, {"high": INF}, "token_clip.high: must be finite and >= 0, got inf"),
    # entropy: named choices
    (S.EntropySpec, {"mode": "thinking", "source": "nll"}, None),
    (
        S.EntropySpec,
        {"mode": "Answer"},
        "entropy.mode: must be one of ('answer', 'thinking', 'full')",
    ),
    (S.EntropySpec, {"source": "logit"}, "entropy.source: must be one of ('logits', 'nll')"),
    # egpo_bonus: lam >= 0, alpha > lam (> 0)
    (S.EgpoBonusSpec, {"lam": 0, "alpha": 1e-9}, None),
    (S.EgpoBonusSpec, {"lam": -0.1}, "egpo_bonus.lam: must be >= 0, got -0.1"),
    (S.EgpoBonusSpec, {"lam": INF}, "egpo_bonus.lam: must be >= 0, got inf"),
    (S.EgpoBonusSpec, {"lam": 0, "alpha": 0}, "egpo_bonus.alpha: must be > 0, got 0.0"),
    (S.EgpoBonusSpec, {"alpha": INF}, "egpo_bonus.alpha: must be > 0, got inf"),
    (
        S.EgpoBonusSpec,
        {"lam": 0.5, "alpha": 0.5},
        "egpo_bonus.alpha: must be > lam (0.5), got 0.5: at or below it the bonus can cancel or "
        "flip a negative advantage",
    ),
    (S.EgpoBonusSpec, {"lam": 0.5, "alpha": 0.5000001}, None),
    # egpo_ratio: 0 <= lambda_min <= lambda_max, both finite; entropy_epsilon > 0
    (S.EgpoRatioSpec, {"lambda_min": 0, "lambda_max": 0}, None),
    (S.EgpoRatioSpec, {"lambda_min": 1.5, "lambda_max": 1.5}, None),
    (
        S.EgpoRatioSpec,
        {"lambda_min": 2.5, "lambda_max": 2.0},
        "egpo_ratio.lambda_min: need 0 <= lambda_min <= lambda_max, got 2.5 and 2.0",
    ),
    (
        S.EgpoRatioSpec,
        {"lambda_min": -0.1},
        "egpo_ratio.lambda_min: need 0 <= lambda_min <= lambda_max, got -0.1 and 2.0",
    ),
    (
        S.EgpoRatioSpec,
        {"lambda_max": INF},
        "egpo_ratio.lambda_min: lambda_min and lambda_max must be finite",
    ),
    (
        S.EgpoRatioSpec,
        {"lambda_min": NAN},
        "egpo_ratio.lambda_min: lambda_min and lambda_max must be finite",
    ),
    (S.EgpoRatioSpec, {"entropy_epsilon": 0}, "egpo_ratio.entropy_epsilon: must be > 0"),
    (S.EgpoRatioSpec, {"entropy_epsilon": 1e-12}, None),
    # entropy_adv: alpha >= 0, kappa > 0, both finite
    (S.TokenShapingSpec, {"alpha": 0, "kappa": 1e-9}, None),
    (S.TokenShapingSpec, {"alpha": -0.1}, "entropy_adv.alpha: must be >= 0, got -0.1"),
    (S.TokenShapingSpec, {"alpha": INF}, "entropy_adv.alpha: must be >= 0, got inf"),
    (S.TokenShapingSpec, {"kappa": 0}, "entropy_adv.kappa: must be > 0, got 0.0"),
    (S.TokenShapingSpec, {"kappa": INF}, "entropy_adv.kappa: must be > 0, got inf"),
    # maxent: tau, beta >= 0 with tau + beta > 0; temperature > 0
    (S.MaxEntSpec, {"tau": 0, "beta": 1e-9}, None),
    (S.MaxEntSpec, {"tau": 1e-9, "beta": 0}, None),
    (S.MaxEntSpec, {"tau": 0, "beta": 0}, "maxent.tau: tau + beta must be > 0"),
    (S.MaxEntSpec, {"tau": -0.1}, "maxent.tau: must be >= 0, got -0.1"),
    (S.MaxEntSpec, {"tau": INF}, "maxent.tau: must be >= 0, got inf"),
    (S.MaxEntSpec, {"beta": -0.1}, "maxent.beta: must be >= 0, got -0.1"),
    (S.MaxEntSpec, {"beta": INF}, "maxent.beta: must be >= 0, got inf"),
    (S.MaxEntSpec, {"source": "rank"}, "maxent.source: must be one of ('rewards', 'ranks')"),
    (S.MaxEntSpec, {"source": "ranks", "temperature": 1e-9}, None),
    (S.MaxEntSpec, {"temperature": 0}, "maxent.temperature: must be > 0, got 0.0"),
    # ppo: clip_low/clip_high finite and >= 0; clip_c > 1
    (S.PpoClipSpec, {"clip_low": 0, "clip_high": 0, "clip_c": 1.0000001}, None),
    (S.PpoClipSpec, {"clip_low": -0.2}, "ppo.clip_low: must be finite and >= 0, got -0.2"),
    (S.PpoClipSpec, {"clip_high": INF}, "ppo.clip_high: must be finite and >= 0, got inf"),
    (S.PpoClipSpec, {"clip_c": 1}, "ppo.clip_c: must be > 1, got 1.0"),
    # lost_samples, chair_fallback: a share in [0, 1]
    (S.LostSamplesSpec, {"max_fraction": 0}, None),
    (S.LostSamplesSpec, {"max_fraction": 1}, None),
    (
        S.LostSamplesSpec,
        {"max_fraction": 1.01},
        "lost_samples.max_fraction: must be in [0, 1], got 1.01",
    ),
    (
        S.LostSamplesSpec,
        {"max_fraction": -0.01},
        "lost_samples.max_fraction: must be in [0, 1], got -0.01",
    ),
    (
        S.LostSamplesSpec,
        {"max_fraction": NAN},
        "lost_samples.max_fraction: must be in [0, 1], got nan",
    ),
    (S.ChairFallbackSpec, {"max_fraction": 0}, None),
    (S.ChairFallbackSpec, {"max_fraction": 1}, None),
    (
        S.ChairFallbackSpec,
        {"max_fraction": 1.5},
        "chair_fallback.max_fraction: must be in [0, 1], got 1.5",
    ),
    (
        S.ChairFallbackSpec,
        {"max_fraction": -0.5},
        "chair_fallback.max_fraction: must be in [0, 1], got -0.5",
    ),
    # values are typed before they are checked
    (S.ClipScheduleSpec, {"enable": 1}, "clip_schedule.enable: expected true or false, got 1"),
    (S.ClipScheduleSpec, {"low": True}, "clip_schedule.low: expected a number, got True"),
    (S.ClipScheduleSpec, {"low": "0.3"}, "clip_schedule.low: expected a number, got '0.3'"),
    (S.ClipScheduleSpec, {"rule": 3}, "clip_schedule.rule: expected a string, got 3"),
    (S.ClipScheduleSpec, {"neutral": "low"}, "clip_schedule.neutral: expected a number, got 'low'"),
]


def _id(case: tuple[type[S.Spec], dict, str | None]) -> str:
    cls, settings, _ = case
    return f"{cls.SECTION}-{'-'.join(f'{k}={v}' for k, v in settings.items())}"


@pytest.mark.parametrize("case", EDGES, ids=[_id(c) for c in EDGES])
def test_each_documented_edge(case):
    cls, settings, message = case
    if message is None:
        spec = cls.from_mapping(settings)
        assert {key: getattr(spec, key) for key in settings} == settings
        return
    with pytest.raises(S.SpecError) as error:
        cls.from_mapping(settings)
    assert str(error.value) == message


def test_numbers_arrive_as_floats():
    spec = S.ClipScheduleSpec.from_mapping({"low": 1, "neutral": 0})
    assert type(spec.low) is float and type(spec.neutral) is float


def test_unknown_keys_are_named_in_one_or_several():
    with pytest.raises(S.SpecError) as one:
        S.TokenPenaltySpec.from_mapping({"betta": 1})
    assert str(one.value) == "token_penalty: unknown key 'betta'; accepted: enable, beta"
    with pytest.raises(S.SpecError) as two:
        S.TokenPenaltySpec.from_mapping({"b": 1, "a": 2}, where="algorithm.token_penalty")
    assert str(two.value) == (
        "algorithm.token_penalty: unknown keys 'a', 'b'; accepted: enable, beta"
    )


def test_null_keeps_the_default_and_where_prefixes_the_key():
    assert S.TokenClipSpec.from_mapping({"low": None}).low == S.TokenClipSpec.low
    with pytest.raises(S.SpecError) as error:
        S.TokenClipSpec.from_mapping({"low": 2}, where="algorithm.token_clip")
    assert str(error.value) == (
        "algorithm.token_clip.low: must be < 1 (at 1 the ratio has no floor), got 2.0"
    )


def test_algorithm_specs_reads_dataclasses_dictconfigs_and_nested_mappings():
    want = S.AlgorithmSpecs(token_penalty=S.TokenPenaltySpec(enable=True, beta=0.5))
    from_dataclass = S.algorithm_specs(want)
    from_dictconfig = S.algorithm_specs(
        OmegaConf.create({"adv_estimator": "grpo", "token_penalty": {"enable": True, "beta": 0.5}})
    )
    from_dict = S.algorithm_specs({"token_penalty": {"enable": True, "beta": 0.5}})
    assert from_dataclass == from_dictconfig == from_dict == want
    assert S.algorithm_specs(None) == S.AlgorithmSpecs()


def test_algorithm_specs_refuses_a_section_that_is_not_a_mapping():
    with pytest.raises(S.SpecError) as error:
        S.algorithm_specs({"token_clip": True}, where="cfg")
    assert str(error.value) == "cfg.token_clip: expected a mapping, got True"
    with pytest.raises(S.SpecError) as whole:
        S.algorithm_specs([1, 2])
    assert str(whole.value) == "algorithm: expected a mapping, got list"


def test_the_removed_egpo_section_names_each_key():
    with pytest.raises(S.SpecError) as one:
        S.algorithm_specs({"egpo": {"mystery": 1}})
    assert str(one.value) == (
        "algorithm.egpo was removed (its keys moved to entropy.* and egpo_ratio.*); unknown "
        "key 'mystery'"
    )
    with pytest.raises(S.SpecError) as two:
        S.algorithm_specs({"egpo": {"b": 1, "a": 1}})
    assert str(two.value).endswith("unknown keys 'a', 'b'")


@pytest.mark.parametrize("other", ["clip_schedule", "clip_low_schedule"])
def test_the_conflict_names_both_switches_under_where(other):
    specs = {"token_clip": {"enable": True}, other: {"enable": True}}
    with pytest.raises(S.SpecError) as error:
        S.algorithm_specs(specs, where="")
    assert str(error.value) == (
        f"token_clip.enable=true contradicts {other}.enable=true (both set hallucinating "
        "samples' bounds): set one of them false"
    )
    assert S.algorithm_specs({"token_clip": {"enable": True}}).conflicts() == []
