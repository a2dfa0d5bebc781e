"""Typed configuration of the local runner; the `entropyrl demo` options are generated from it.

Plain settings are fields of `DemoConfig`; each algorithm section is a nested spec from
`entropyrl.core.specs` (the same sections verl reads under `algorithm.*`), exposed on the command
line as `--<section>-<field>` (e.g. `--clip-schedule-rule linear`, `--egpo-bonus-lam 0.2`).
Why the demo's defaults are what they are: docs/quickstart.md. Stdlib only (plus the
spec classes), so the CLI stays fast to import.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from entropyrl.core.estimator_names import ESTIMATOR_NAMES as ADV_ESTIMATORS
from entropyrl.core.specs import (
    AlgorithmSpecs,
    ClipLowScheduleSpec,
    ClipScheduleSpec,
    EgpoBonusSpec,
    EgpoRatioSpec,
    EntropySpec,
    MaxEntSpec,
    PpoClipSpec,
    Spec,
    TokenClipSpec,
    TokenPenaltySpec,
    TokenShapingSpec,
)

__all__ = [
    "ADV_ESTIMATORS",
    "SPEC_FIELDS",
    "TASKS",
    "DemoConfig",
]

TASKS = ("captioning", "function-calling")


def _f(default: Any, help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


def _section(help: str) -> dict[str, Any]:
    return {"help": help, "spec": True}


@dataclass
class DemoConfig:
    """One local run: world, model, warm-up, RL, evaluation, outputs."""

    # what to run
    task: str = _f("captioning", "which task to train", choices=TASKS)
    adv: str = _f(
        "egpo",
        "advantage estimator: grpo, egpo (additive entropy bonus, Hao et al. 2025), egpo_ratio, "
        "entropy_adv (token-level shaping) or maxent_grpo",
        choices=ADV_ESTIMATORS,
    )
    compare: str | None = _f(
        None,
        "comma-separated variants run from the same warm-up checkpoint and plotted together, "
        "e.g. grpo,egpo,egpo+clip (a variant is ADV, or ADV+clip with the clip schedule on)",
    )
    steps: int = _f(60, "RL steps")
    seed: int = _f(0, "seed of the world, the model initialisation, sampling and batching")
    out: str = _f(
        "runs/demo",
        "output folder: metrics.jsonl, curves.png, summary.md/.json (one that holds an earlier "
        "run is kept: the run goes to the next free <out>-2, <out>-3, ... unless --overwrite)",
    )
    overwrite: bool = _f(False, "write into --out even when it holds an earlier run")
    model: str | None = _f(
        None,
        "local Qwen2-VL (or Qwen2 for function-calling) checkpoint folder; default: a tiny "
        "model built from a config",
    )
    device: str | None = _f(None, "torch device; default: cuda if available, else cpu")
    threads: int = _f(
        1,
        "torch CPU threads; results depend on the count, a fixed count repeats them (more "
        "than one helps only on cores nothing else uses: docs/quickstart.md)",
    )
    progress: bool = _f(True, "show progress bars")

    # synthetic world
    num_train: int = _f(1000, "training images (or tool queries)")
    num_test: int = _f(100, "held-out evaluation images (or tool queries)")
    image_size: int = _f(112, "image side in pixels (112 px = 16 image tokens)")
    noise_rate: float = _f(
        0.5,
        "share of warm-up demonstrations with a taught mistake: captions naming an absent "
        "partner object, or tool calls with the tool's habit",
    )
    max_objects: int = _f(3, "objects per image are 1..N, N <= 3")
    tokenizer_ranks: int = _f(
        4096, "keep the first N Qwen BPE ranks (a smaller, faster vocabulary)"
    )

    # tiny model
    hidden_size: int = _f(128, "text hidden size")
    num_layers: int = _f(2, "text layers")
    vision_depth: int = _f(2, "vision blocks")

    # warm-up (supervised on the noisy demonstrations)
    warmup_steps: int = _f(900, "supervised warm-up steps before RL")
    warmup_batch: int = _f(16, "warm-up batch size")
    warmup_lr: float = _f(1e-3, "warm-up AdamW learning rate, constant after 20 ramp steps")
    warmup_cache: bool = _f(
        True,
        "reuse the warm-up checkpoint of an earlier run with the same settings (kept under "
        "~/.cache/entropyrl/warmups, or $ENTROPYRL_CACHE/warmups): the same numbers, minus "
        "the warm-up's minutes",
    )
    warmup_only: bool = _f(
        False, "train (or find) the warm-up checkpoint into the cache, then stop"
    )

    # RL
    lr: float = _f(5e-5, "RL AdamW learning rate")
    prompts_per_step: int = _f(8, "prompts per RL step")
    samples_per_prompt: int = _f(8, "responses sampled per prompt (the GRPO group)")
    temperature: float = _f(1.0, "sampling temperature; entropies are taken at it")
    max_new_tokens: int = _f(24, "longest response in tokens")
    num_minibatches: int = _f(2, "PPO mini-batches per step; > 1 so that clip bounds act")
    ppo_epochs: int = _f(1, "passes over the rollout batch per step")
    kl_coef: float = _f(
        0.0, "k3 KL penalty to the frozen warm-up model (0 = off, no reference kept)"
    )
    chair_weight: float = _f(1.0, "reward = CIDEr-D - w * penalty per caption")
    chair_penalty: str = _f(
        "count",
        "hallucination penalty per caption: count = number of hallucinated objects, "
        "fraction = CHAIR_i",
        choices=("count", "fraction"),
    )
    recall_weight: float = _f(0.0, "reward + w * CHAIR recall per caption")
    max_grad_norm: float = _f(1.0, "gradient clipping")

    # algorithm sections (entropyrl.core.specs; verl reads the same under algorithm.*)
    ppo: PpoClipSpec = field(default_factory=PpoClipSpec, metadata=_section("PPO clip constants"))
    clip_schedule: ClipScheduleSpec = field(
        default_factory=lambda: ClipScheduleSpec(enable=True),
        metadata=_section("per-sample clip_high from CHAIR_i"),
    )
    entropy: EntropySpec = field(
        default_factory=lambda: EntropySpec(mode="full"),
        metadata=_section("how a response's entropy is measured"),
    )
    egpo_bonus: EgpoBonusSpec = field(
        default_factory=EgpoBonusSpec, metadata=_section("the egpo estimator")
    )
    egpo_ratio: EgpoRatioSpec = field(
        default_factory=EgpoRatioSpec, metadata=_section("the egpo_ratio estimator")
    )
    entropy_adv: TokenShapingSpec = field(
        default_factory=TokenShapingSpec, metadata=_section("the entropy_adv estimator")
    )
    maxent: MaxEntSpec = field(
        default_factory=MaxEntSpec, metadata=_section("the maxent_grpo estimator")
    )
    token_penalty: TokenPenaltySpec = field(
        default_factory=TokenPenaltySpec,
        metadata=_section("-beta on the advantages of hallucinated tokens (captioning)"),
    )
    token_clip: TokenClipSpec = field(
        default_factory=TokenClipSpec,
        metadata=_section("hallucinated tokens' own clip bounds (captioning)"),
    )
    clip_low_schedule: ClipLowScheduleSpec = field(
        default_factory=ClipLowScheduleSpec,
        metadata=_section("per-sample clip_low from CHAIR_i (captioning)"),
    )

    # evaluation
    eval_max_new_tokens: int = _f(24, "greedy evaluation length in tokens")

    # acceptance study
    acceptance: bool = _f(
        False,
        "run the acceptance study instead: per seed, warm-up vs RL vs an equal-time "
        "control continuing the warm-up from the same checkpoint",
    )
    seeds: str = _f("0,1,2", "seeds of the acceptance study")
    control_clock: str = _f(
        "cpu",
        "how the control matches RL's time: cpu = this process's CPU time (fair when other jobs "
        "share the machine), wall = wall clock",
        choices=("cpu", "wall"),
    )

    def __post_init__(self) -> None:
        # Sections given as mappings (a script, a saved summary) are checked key by key.
        for name, spec_cls in SPEC_FIELDS.items():
            value = getattr(self, name)
            if isinstance(value, Mapping):
                setattr(self, name, spec_cls.from_mapping(value, name))
            elif not isinstance(value, spec_cls):
                raise ValueError(f"{name}: expected {spec_cls.__name__}, got {value!r}")
        # name -> (holds, the rule): one line naming the option and what it takes
        checks = {
            "task": (self.task in TASKS, f"one of {', '.join(TASKS)}"),
            "adv": (self.adv in ADV_ESTIMATORS, f"one of {', '.join(ADV_ESTIMATORS)}"),
            "steps": (self.steps >= 0, ">= 0"),
            "threads": (self.threads >= 1, ">= 1"),
            "num_train": (self.num_train >= 1, ">= 1"),
            "num_test": (self.num_test >= 1, ">= 1"),
            "noise_rate": (0.0 <= self.noise_rate <= 1.0, "in [0, 1]"),
            "warmup_steps": (self.warmup_steps >= 0, ">= 0"),
            "warmup_batch": (self.warmup_batch >= 1, ">= 1"),
            "prompts_per_step": (self.prompts_per_step >= 1, ">= 1"),
            "samples_per_prompt": (self.samples_per_prompt >= 2, ">= 2 (a group needs two)"),
            "temperature": (self.temperature > 0, "> 0"),
            "max_new_tokens": (self.max_new_tokens >= 1, ">= 1"),
            "num_minibatches": (
                1 <= self.num_minibatches <= self.prompts_per_step * self.samples_per_prompt,
                "in [1, prompts_per_step x samples_per_prompt]",
            ),
            "ppo_epochs": (self.ppo_epochs >= 1, ">= 1"),
            "lr": (self.lr >= 0, ">= 0"),
            "warmup_lr": (self.warmup_lr >= 0, ">= 0"),
            "kl_coef": (self.kl_coef >= 0, ">= 0"),
            "control_clock": (self.control_clock in ("cpu", "wall"), "cpu or wall"),
            "chair_penalty": (self.chair_penalty in ("count", "fraction"), "count or fraction"),
            "max_objects": (1 <= self.max_objects <= 3, "in [1, 3]"),
        }
        for name, (ok, rule) in checks.items():
            if not ok:
                raise ValueError(f"{name}: invalid value {getattr(self, name)!r} (must be {rule})")
        for variant in self.variants():
            parse_variant(variant)
        self._check_token_sections()

    def _check_token_sections(self) -> None:
        """The token sections need CHAIR (captioning) and must not contradict a variant's clip
        schedule (`AlgorithmSpecs.conflicts`); one line naming the options."""
        token = ("token_penalty", "token_clip", "clip_low_schedule")
        if self.task != "captioning":
            for name in token:
                if getattr(self, name).enable:
                    raise ValueError(
                        f"{name}.enable: reads CHAIR's hallucinated words, which --task "
                        f"{self.task} does not score; drop --{name.replace('_', '-')}-enable"
                    )
        for variant in self.variants():
            _, clip = parse_variant(variant)
            specs = AlgorithmSpecs(
                clip_schedule=ClipScheduleSpec(enable=clip),
                clip_low_schedule=self.clip_low_schedule,
                token_clip=self.token_clip,
            )
            for one, other in specs.conflicts()[:1]:
                if other != "clip_schedule":
                    fix = "drop --clip-low-schedule-enable"
                elif self.compare:
                    fix = f"compare {variant.partition('+')[0]} without +clip"
                else:
                    fix = "add --no-clip-schedule-enable"
                raise ValueError(
                    f"{one}.enable: contradicts {other} of variant {variant} (both set "
                    f"hallucinating samples' bounds): drop --{one.replace('_', '-')}-enable, or "
                    f"{fix}"
                )

    def world_settings(self, seed: int | None = None) -> dict[str, Any]:
        """`build_synthetic_coco`'s settings of this run's world (`seed` default: the run's)."""
        return {
            "num_train": self.num_train,
            "num_test": self.num_test,
            "image_size": self.image_size,
            "noise_rate": self.noise_rate,
            "max_objects": self.max_objects,
            "seed": self.seed if seed is None else seed,
        }

    def variants(self) -> list[str]:
        """The RL variants to run: `--compare`, else the one given by `--adv`/`--clip-schedule`."""
        if self.compare:
            names = [v.strip() for v in self.compare.split(",") if v.strip()]
            if not names:
                raise ValueError("compare: no variant given")
            return names
        return [self.adv + ("+clip" if self.clip_schedule.enable else "")]

    def seed_list(self) -> list[int]:
        try:
            return [int(s) for s in self.seeds.split(",") if s.strip()]
        except ValueError as error:
            raise ValueError(
                f"seeds: expected comma-separated integers, got {self.seeds!r}"
            ) from error


def parse_variant(name: str) -> tuple[str, bool]:
    """`"egpo+clip"` -> ("egpo", True); `"grpo"` -> ("grpo", False)."""
    adv, _, suffix = name.partition("+")
    if adv not in ADV_ESTIMATORS or suffix not in ("", "clip"):
        raise ValueError(
            f"compare: unknown variant {name!r}; use ADV or ADV+clip with ADV in {ADV_ESTIMATORS}"
        )
    return adv, suffix == "clip"


def _spec_fields() -> dict[str, type[Spec]]:
    """{field: spec class} of `DemoConfig`'s sections, read from its fields' types (the one
    list; a default may be a lambda, e.g. the schedule on by default)."""
    import typing

    hints = typing.get_type_hints(DemoConfig)
    return {
        item.name: hints[item.name]
        for item in dataclasses.fields(DemoConfig)
        if isinstance(hints[item.name], type) and issubclass(hints[item.name], Spec)
    }


# The spec sections a local run reads: `ppo` (the actor's constants verl keeps in its own
# `actor.clip_ratio_*`) and the algorithm sections of `entropyrl.core.specs`, minus
# `VERL_ONLY_SECTIONS`; tests/rig/local/test_config.py checks no other section is left out.
SPEC_FIELDS: dict[str, type[Spec]] = _spec_fields()
# Sections only the verl plugin reads: a local run loses no sample to a failed worker and calls
# no CHAIR service it could lose.
VERL_ONLY_SECTIONS: tuple[str, ...] = ("lost_samples", "chair_fallback")
