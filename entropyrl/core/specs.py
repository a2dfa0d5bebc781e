"""One frozen spec per algorithm piece: the only place its defaults are written.

Both engines read the same sections: verl from `algorithm.<section>` of its Hydra config, the
local runner from the same-named nested settings (and `entropyrl demo --<section>-<field>`).
`from_mapping` refuses a key the spec does not have, naming it and the accepted ones, so a
misspelt knob fails at start instead of silently keeping its default. The core functions take
their keyword defaults from these classes (`lam: float = EgpoBonusSpec.lam`).

Sections:
- `clip_schedule`: per-sample clip_high from a hallucination score
  (`entropyrl.core.clip_schedules`).
- `clip_low_schedule`: per-sample clip_low from CHAIR_i, the side on which hallucinating samples
  are clipped (`clip_schedules.clip_low_bounds`).
- `token_penalty`: -beta on the advantage of each hallucinated mention's tokens
  (`token_credit.token_penalty_advantage`).
- `token_clip`: the hallucinated tokens' own PPO bounds (`token_credit.token_clip_bounds`).
- `entropy`: which per-token quantity and which tokens form a sample's entropy H_i.
- `egpo_bonus`: the additive EGPO bonus (`advantages.egpo_bonus_advantage`).
- `egpo_ratio`: the multiplicative entropy-ratio calibration (`advantages.egpo_ratio_advantage`).
- `entropy_adv`: token-level entropy shaping (`advantages.entropy_shaped_token_advantage`).
- `maxent`: the MaxEnt-GRPO sequence-level target (`maxent.maxent_advantage`).
- `ppo`: the clipped surrogate's constants (local runner; verl takes them from the actor config).
- `lost_samples`: how many rollout samples a verl step may lose before the run stops
  (`entropyrl.verl.failures.lost_samples`; the local runner loses none).
- `chair_fallback`: how many of a verl step's samples may go without a CHAIR score (the service
  did not answer) before the run stops (`entropyrl.verl.failures.chair_fallback`).

`AlgorithmSpecs.check` refuses sections that contradict each other (the token clip beside a
per-sample schedule), in one line naming both switches.

`LIMIT_KEYS` names the keys that are limits on a run, not part of its algorithm: a resume may
change them (`entropyrl.verl.checks.checkpoints`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

__all__ = [
    "CLIP_RULES",
    "DIRECTIONS",
    "ENTROPY_MODES",
    "ENTROPY_SOURCES",
    "LIMIT_KEYS",
    "MAXENT_SOURCES",
    "REMOVED_KEYS",
    "SPEC_CLASSES",
    "AlgorithmSpecs",
    "ChairFallbackSpec",
    "ClipLowScheduleSpec",
    "ClipScheduleSpec",
    "EgpoBonusSpec",
    "EgpoRatioSpec",
    "EntropySpec",
    "LostSamplesSpec",
    "MaxEntSpec",
    "PpoClipSpec",
    "SpecError",
    "TokenClipSpec",
    "TokenPenaltySpec",
    "TokenShapingSpec",
    "algorithm_specs",
]

CLIP_RULES = ("step", "linear", "sigmoid")
DIRECTIONS = ("hallucinated_high", "hallucinated_low")
ENTROPY_MODES = ("answer", "thinking", "full")
ENTROPY_SOURCES = ("logits", "nll")
MAXENT_SOURCES = ("rewards", "ranks")

S = TypeVar("S", bound="Spec")


class SpecError(ValueError):
    """A setting of an algorithm section is unknown or out of range (names the key)."""


def _help(default: Any, text: str, choices: tuple[str, ...] | None = None) -> Any:
    metadata: dict[str, Any] = {"help": text}
    if choices:
        metadata["choices"] = choices
    return field(default=default, metadata=metadata)


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise SpecError(f"{key}: {message}")


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Spec:
    """Base of the section specs: typed fields, strict construction from a mapping."""

    SECTION: ClassVar[str] = ""

    @classmethod
    def from_mapping(cls: type[S], mapping: Mapping[str, Any] | None, where: str = "") -> S:
        """The spec of a config section; unknown keys raise `SpecError` naming them.

        `None` values keep the default (Hydra's `null`); `where` prefixes messages
        (e.g. "algorithm.clip_schedule").
        """
        where = where or cls.SECTION
        mapping = dict(mapping or {})
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(mapping) - set(names))
        if unknown:
            raise SpecError(
                f"{where}: unknown key{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(repr(k) for k in unknown)}; accepted: {', '.join(names)}"
            )
        values = {}
        for f in dataclasses.fields(cls):
            if mapping.get(f.name) is None:
                continue
            values[f.name] = _coerce(mapping[f.name], f, f"{where}.{f.name}")
        try:
            return cls(**values)
        except SpecError as error:
            raise SpecError(f"{where}.{error}") from None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _coerce(value: Any, f: dataclasses.Field, key: str) -> Any:
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    if kind.startswith("bool"):
        _check(isinstance(value, bool), key, f"expected true or false, got {value!r}")
        return value
    if kind.startswith("float"):
        _check(
            isinstance(value, int | float) and not isinstance(value, bool),
            key,
            f"expected a number, got {value!r}",
        )
        return float(value)
    if kind.startswith("str"):
        _check(isinstance(value, str), key, f"expected a string, got {value!r}")
        return value
    return value


@dataclass(frozen=True)
class ClipScheduleSpec(Spec):
    """Per-sample PPO clip_high from each sample's hallucination score (CHAIR_i).

    Checked here, once: `entropyrl.core.clip_schedules.clip_high_bounds` applies the rule to a
    built spec and relies on these checks (the bounds lie in [min(low, high), max(low, high)]
    or are `neutral`, all finite and >= 0).
    """

    SECTION: ClassVar[str] = "clip_schedule"

    enable: bool = _help(False, "give each sample its own clip_high from its CHAIR_i")
    rule: str = _help("step", "shape of the map from CHAIR_i to clip_high", CLIP_RULES)
    low: float = _help(0.3, "clip_high of a clean sample (the EntropyRL recipe: 0.3)")
    high: float = _help(0.5, "clip_high of a hallucinating sample (the EntropyRL recipe: 0.5)")
    threshold: float = _help(1e-4, "CHAIR_i at which a sample counts as hallucinating")
    direction: str = _help(
        "hallucinated_high", "which end of [low, high] hallucinating samples get", DIRECTIONS
    )
    neutral: float | None = _help(
        None, "clip_high of a sample without a CHAIR score (default: low)"
    )
    saturation: float = _help(1.0, "CHAIR_i where the linear rule reaches its far end")
    temperature: float = _help(0.05, "width of the sigmoid rule's step, in CHAIR_i")

    def __post_init__(self) -> None:
        _check(self.rule in CLIP_RULES, "rule", f"must be one of {CLIP_RULES}, got {self.rule!r}")
        _check(
            self.direction in DIRECTIONS,
            "direction",
            f"must be one of {DIRECTIONS}, got {self.direction!r}",
        )
        for name in ("low", "high", "threshold"):
            value = getattr(self, name)
            _check(_finite(value) and value >= 0, name, f"must be finite and >= 0, got {value}")
        if self.neutral is not None:
            _check(
                _finite(self.neutral) and self.neutral >= 0,
                "neutral",
                f"must be finite and >= 0, got {self.neutral}",
            )
        if self.rule == "linear":
            _check(
                self.saturation > self.threshold,
                "saturation",
                f"must be > threshold for rule 'linear', got {self.saturation}",
            )
        if self.rule == "sigmoid":
            _check(self.temperature > 0, "temperature", f"must be > 0, got {self.temperature}")


@dataclass(frozen=True)
class ClipLowScheduleSpec(ClipScheduleSpec):
    """Per-sample PPO clip_low (the ratio's floor is 1 - clip_low) from each sample's CHAIR_i.

    Hallucinating samples mostly carry a negative advantage, so PPO clips them on the low side;
    this rule moves that bound. The rule's shape and keys are the clip schedule's, read on this
    side (`entropyrl.core.clip_schedules.clip_low_bounds`); every bound stays below 1, where the
    floor would vanish.
    """

    SECTION: ClassVar[str] = "clip_low_schedule"

    enable: bool = _help(False, "give each sample its own clip_low from its CHAIR_i")
    rule: str = _help("step", "shape of the map from CHAIR_i to clip_low", CLIP_RULES)
    low: float = _help(0.2, "clip_low of a clean sample (PPO's 0.2)")
    high: float = _help(0.4, "clip_low of a hallucinating sample")
    neutral: float | None = _help(None, "clip_low of a sample without a CHAIR score (default: low)")

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("low", "high", "neutral"):
            value = getattr(self, name)
            if value is not None:
                _check(value < 1, name, f"must be < 1 (at 1 the ratio has no floor), got {value}")


@dataclass(frozen=True)
class TokenPenaltySpec(Spec):
    """-beta on the advantage of every token of a hallucinated mention; the other tokens keep
    their group advantage (the sequence-level CHAIR penalty's counterpart). Needs the caption
    reward's hallucinated token positions (CHAIR on)."""

    SECTION: ClassVar[str] = "token_penalty"

    enable: bool = _help(False, "subtract beta from the hallucinated tokens' advantages")
    beta: float = _help(1.0, "penalty per hallucinated token (a mention's count penalty is 1.0)")

    def __post_init__(self) -> None:
        _check(_finite(self.beta) and self.beta >= 0, "beta", f"must be >= 0, got {self.beta}")


@dataclass(frozen=True)
class TokenClipSpec(Spec):
    """The tokens of hallucinated mentions get their own PPO bounds [1 - low, 1 + high]; every
    other token keeps the base bounds (the per-sample rule at the granularity of tokens). Needs
    the caption reward's hallucinated token positions (CHAIR on)."""

    SECTION: ClassVar[str] = "token_clip"

    enable: bool = _help(False, "give hallucinated tokens their own clip bounds")
    low: float = _help(0.2, "clip_low of a hallucinated token (the ratio's floor is 1 - low)")
    high: float = _help(0.5, "clip_high of a hallucinated token")

    def __post_init__(self) -> None:
        for name in ("low", "high"):
            value = getattr(self, name)
            _check(_finite(value) and value >= 0, name, f"must be finite and >= 0, got {value}")
        _check(self.low < 1, "low", f"must be < 1 (at 1 the ratio has no floor), got {self.low}")


@dataclass(frozen=True)
class EntropySpec(Spec):
    """How a sample's entropy H_i is measured for the entropy-guided estimators."""

    SECTION: ClassVar[str] = "entropy"

    mode: str = _help(
        "answer",
        "tokens that form H_i: answer (after the last </think>), thinking (inside "
        "<think>...</think>) or full (the whole response)",
        ENTROPY_MODES,
    )
    source: str = _help(
        "logits",
        "per-token quantity: logits (full-vocabulary entropy of the rollout policy) or nll "
        "(the sampled token's negative log-likelihood)",
        ENTROPY_SOURCES,
    )

    def __post_init__(self) -> None:
        _check(self.mode in ENTROPY_MODES, "mode", f"must be one of {ENTROPY_MODES}")
        _check(self.source in ENTROPY_SOURCES, "source", f"must be one of {ENTROPY_SOURCES}")


@dataclass(frozen=True)
class EgpoBonusSpec(Spec):
    """EGPO additive bonus A + lam * clip(H, -|A|/alpha, |A|/alpha) (Hao et al. 2025)."""

    SECTION: ClassVar[str] = "egpo_bonus"

    lam: float = _help(0.4, "weight of the entropy bonus (Hao et al. 2025: 0.4)")
    alpha: float = _help(2.0, "bonus cap |A|/alpha (Hao et al. 2025: 2; needs alpha > lam)")

    def __post_init__(self) -> None:
        _check(_finite(self.lam) and self.lam >= 0, "lam", f"must be >= 0, got {self.lam}")
        _check(_finite(self.alpha) and self.alpha > 0, "alpha", f"must be > 0, got {self.alpha}")
        _check(
            self.alpha > self.lam,
            "alpha",
            f"must be > lam ({self.lam:g}), got {self.alpha:g}: at or below it the bonus can "
            "cancel or flip a negative advantage",
        )


@dataclass(frozen=True)
class EgpoRatioSpec(Spec):
    """EGPO calibration A * clip(mean_group(H) / (H + eps), lambda_min, lambda_max)."""

    SECTION: ClassVar[str] = "egpo_ratio"

    lambda_min: float = _help(0.5, "smallest weight on a sample's advantage")
    lambda_max: float = _help(2.0, "largest weight on a sample's advantage")
    entropy_epsilon: float = _help(1e-6, "added to H before dividing")

    def __post_init__(self) -> None:
        _check(
            _finite(self.lambda_min) and _finite(self.lambda_max),
            "lambda_min",
            "lambda_min and lambda_max must be finite",
        )
        _check(
            0 <= self.lambda_min <= self.lambda_max,
            "lambda_min",
            f"need 0 <= lambda_min <= lambda_max, got {self.lambda_min} and {self.lambda_max}",
        )
        _check(self.entropy_epsilon > 0, "entropy_epsilon", "must be > 0")


@dataclass(frozen=True)
class TokenShapingSpec(Spec):
    """Token-level shaping A + min(alpha * h_t, |A| / kappa) (Cheng et al. 2025)."""

    SECTION: ClassVar[str] = "entropy_adv"

    alpha: float = _help(0.4, "weight of the token entropy (Cheng et al. 2025: 0.4)")
    kappa: float = _help(2.0, "cap |A|/kappa on the shaping term (Cheng et al. 2025: 2)")

    def __post_init__(self) -> None:
        _check(_finite(self.alpha) and self.alpha >= 0, "alpha", f"must be >= 0, got {self.alpha}")
        _check(_finite(self.kappa) and self.kappa > 0, "kappa", f"must be > 0, got {self.kappa}")


@dataclass(frozen=True)
class MaxEntSpec(Spec):
    """MaxEnt-GRPO's closed-form listwise target (experimental)."""

    SECTION: ClassVar[str] = "maxent"

    tau: float = _help(1.0, "entropy temperature of the target (tau + beta > 0)")
    beta: float = _help(0.1, "weight of the reference policy (needs its log-probs when > 0)")
    source: str = _help(
        "rewards", "listwise preference from the rewards or their ranks", MAXENT_SOURCES
    )
    temperature: float = _help(1.0, "softmax temperature of the listwise preference")

    def __post_init__(self) -> None:
        _check(_finite(self.tau) and self.tau >= 0, "tau", f"must be >= 0, got {self.tau}")
        _check(_finite(self.beta) and self.beta >= 0, "beta", f"must be >= 0, got {self.beta}")
        _check(self.tau + self.beta > 0, "tau", "tau + beta must be > 0")
        _check(self.source in MAXENT_SOURCES, "source", f"must be one of {MAXENT_SOURCES}")
        _check(self.temperature > 0, "temperature", f"must be > 0, got {self.temperature}")


@dataclass(frozen=True)
class PpoClipSpec(Spec):
    """The PPO clipped surrogate's constants (verl reads its own `actor.clip_ratio_*`)."""

    SECTION: ClassVar[str] = "ppo"

    clip_low: float = _help(0.2, "the ratio's lower clip is 1 - clip_low")
    clip_high: float = _help(
        0.28, "clip_high of every sample when no clip schedule is enabled (DAPO clip-higher)"
    )
    clip_c: float = _help(3.0, "dual-clip constant for negative advantages (> 1)")

    def __post_init__(self) -> None:
        for name in ("clip_low", "clip_high"):
            value = getattr(self, name)
            _check(_finite(value) and value >= 0, name, f"must be finite and >= 0, got {value}")
        _check(self.clip_c > 1, "clip_c", f"must be > 1, got {self.clip_c}")


@dataclass(frozen=True)
class LostSamplesSpec(Spec):
    """How many samples a step may lose to failed sessions (a reward call that raised, a failed
    generation) and still train on the rest; more stop the run. A refused CHAIR token, or a
    batch that received nothing, stops it whatever this says."""

    SECTION: ClassVar[str] = "lost_samples"

    max_fraction: float = _help(
        0.01,
        "share of a batch's samples (prompts x rollout.n) that may be lost before the run stops",
    )

    def __post_init__(self) -> None:
        _check(
            _finite(self.max_fraction) and 0 <= self.max_fraction <= 1,
            "max_fraction",
            f"must be in [0, 1], got {self.max_fraction}",
        )


@dataclass(frozen=True)
class ChairFallbackSpec(Spec):
    """How many of a step's samples may go without a CHAIR score because the CHAIR service gave
    no answer (down, or unreachable from a reward worker's node) and the step still train: such
    a sample takes the clip schedule's neutral bound and no CHAIR penalty. More stop the run;
    `CHAIR_OPTIONAL=1` (environment) lifts the limit and says so at every step."""

    SECTION: ClassVar[str] = "chair_fallback"

    max_fraction: float = _help(
        0.05,
        "share of a step's real samples that may lack a CHAIR score before the run stops",
    )

    def __post_init__(self) -> None:
        _check(
            _finite(self.max_fraction) and 0 <= self.max_fraction <= 1,
            "max_fraction",
            f"must be in [0, 1], got {self.max_fraction}",
        )


# `<section>.<key>` of the settings that bound how much a run may lose before it stops, not what
# it computes: raising one after a stop resumes the same run (the resume check leaves them out).
LIMIT_KEYS: tuple[str, ...] = (
    f"{LostSamplesSpec.SECTION}.max_fraction",
    f"{ChairFallbackSpec.SECTION}.max_fraction",
)

# Keys of 0.1's first configs, removed in 0.2: refused with the key that replaced them (ignored,
# they would silently keep the default).
REMOVED_KEYS: dict[str, str] = {
    "egpo_lambda": "egpo_bonus.lam",
    "egpo_alpha": "egpo_bonus.alpha",
    "egpo.entropy_mode": "entropy.mode",
    "egpo.entropy_source": "entropy.source",
    "egpo.lambda_min": "egpo_ratio.lambda_min",
    "egpo.lambda_max": "egpo_ratio.lambda_max",
    "egpo.entropy_epsilon": "egpo_ratio.entropy_epsilon",
}


@dataclass(frozen=True)
class AlgorithmSpecs:
    """Every algorithm section of one run."""

    clip_schedule: ClipScheduleSpec = field(default_factory=ClipScheduleSpec)
    entropy: EntropySpec = field(default_factory=EntropySpec)
    egpo_bonus: EgpoBonusSpec = field(default_factory=EgpoBonusSpec)
    egpo_ratio: EgpoRatioSpec = field(default_factory=EgpoRatioSpec)
    entropy_adv: TokenShapingSpec = field(default_factory=TokenShapingSpec)
    maxent: MaxEntSpec = field(default_factory=MaxEntSpec)
    lost_samples: LostSamplesSpec = field(default_factory=LostSamplesSpec)
    chair_fallback: ChairFallbackSpec = field(default_factory=ChairFallbackSpec)
    clip_low_schedule: ClipLowScheduleSpec = field(default_factory=ClipLowScheduleSpec)
    token_penalty: TokenPenaltySpec = field(default_factory=TokenPenaltySpec)
    token_clip: TokenClipSpec = field(default_factory=TokenClipSpec)

    def conflicts(self) -> list[tuple[str, str]]:
        """The pairs of enabled sections that contradict each other, e.g.
        `[("token_clip", "clip_schedule")]`.

        The token clip sets the bounds of the hallucinated tokens; beside a per-sample schedule
        those tokens would take the token clip's bounds and the rest of the sample the
        schedule's, a mixture neither mechanism describes (and a comparison that measures
        neither)."""
        if not self.token_clip.enable:
            return []
        return [
            (TokenClipSpec.SECTION, other.SECTION)
            for other in (self.clip_schedule, self.clip_low_schedule)
            if other.enable
        ]

    def check(self, where: str = "algorithm") -> None:
        """Refuse the first of `conflicts`, in one line naming both switches."""
        prefix = f"{where}." if where else ""
        for one, other in self.conflicts()[:1]:
            raise SpecError(
                f"{prefix}{one}.enable=true contradicts {prefix}{other}.enable=true (both set "
                "hallucinating samples' bounds): set one of them false"
            )


def _sections() -> tuple[type[Spec], ...]:
    """The spec classes of `AlgorithmSpecs`'s fields, in its order: the one list of sections
    (a field named other than its class's `SECTION` could never be read from a config)."""
    classes = []
    for item in dataclasses.fields(AlgorithmSpecs):
        spec_cls = item.default_factory  # type: ignore[misc]
        if not (isinstance(spec_cls, type) and issubclass(spec_cls, Spec)):
            raise TypeError(f"AlgorithmSpecs.{item.name}: not a Spec section")
        if item.name != spec_cls.SECTION:
            raise TypeError(f"AlgorithmSpecs.{item.name} holds section {spec_cls.SECTION!r}")
        classes.append(spec_cls)
    return tuple(classes)


# Every algorithm section, declared once as a field of `AlgorithmSpecs`.
SPEC_CLASSES: tuple[type[Spec], ...] = _sections()


def _plain(value: Any) -> Any:
    """OmegaConf containers -> plain dicts (without importing omegaconf here)."""
    to_container = getattr(type(value), "to_container", None)
    if callable(to_container):  # DictConfig
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def algorithm_specs(algorithm: Any, where: str = "algorithm") -> AlgorithmSpecs:
    """All sections of an algorithm config (a mapping, DictConfig or None), validated.

    Other keys of `algorithm` (the engine's own, e.g. verl's `adv_estimator`) are not looked at;
    inside our sections every key must be known, and a key of 0.1's first configs
    (`REMOVED_KEYS`) is refused with the one that replaced it; sections that contradict each
    other are refused by `AlgorithmSpecs.check`.
    """
    config = _plain(algorithm) or {}
    if not isinstance(config, Mapping):
        raise SpecError(f"{where}: expected a mapping, got {type(algorithm).__name__}")
    config = {
        key: (dict(value) if isinstance(value, Mapping) else value) for key, value in config.items()
    }
    sections: dict[str, dict[str, Any]] = {}
    for spec_cls in SPEC_CLASSES:
        value = config.get(spec_cls.SECTION)
        if value is not None and not isinstance(value, Mapping):
            raise SpecError(f"{where}.{spec_cls.SECTION}: expected a mapping, got {value!r}")
        sections[spec_cls.SECTION] = dict(value or {})
    old_egpo = config.get("egpo") or {}
    removed = [
        old
        for old in REMOVED_KEYS
        if (old in config if "." not in old else old.split(".", 1)[1] in old_egpo)
    ]
    if removed:
        raise SpecError(
            "; ".join(
                f"{where}.{old} was removed: use {where}.{REMOVED_KEYS[old]}" for old in removed
            )
        )
    if old_egpo:
        raise SpecError(
            f"{where}.egpo was removed (its keys moved to entropy.* and egpo_ratio.*); unknown "
            f"key{'s' if len(old_egpo) > 1 else ''} {', '.join(repr(k) for k in sorted(old_egpo))}"
        )
    specs = AlgorithmSpecs(
        **{
            spec_cls.SECTION: spec_cls.from_mapping(
                sections[spec_cls.SECTION], f"{where}.{spec_cls.SECTION}"
            )
            for spec_cls in SPEC_CLASSES
        }
    )
    specs.check(where)
    return specs
