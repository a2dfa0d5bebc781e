"""Check a run's config where verl checks its own: in the driver, before Ray.

`python -m verl.trainer.main_ppo` calls `verl.utils.config.validate_config` before `ray.init`.
The plugin wraps that function (imported by `main_ppo` after `import verl` has loaded the
plugin) so that, in a run that uses the plugin (`uses_entropyrl`: the entropy-aware trainer,
one of our estimators or our loss; any other run gets verl's validation alone), these mistakes
stop the run at once instead of after Ray, TransferQueue, the workers, the rollout and the
log-prob passes have run:

- an unknown or out-of-range key of our `algorithm.*` sections (`entropyrl.core.specs`), e.g.
  `algorithm.clip_schedule.treshold`;
- a batch geometry verl would assert on later (`entropyrl.verl.checks.geometry`), e.g. a micro-batch
  that does not divide a rank's share of the mini-batch on this layout;
- with the entropy-aware trainer only (`trainer.v1.trainer_mode=entropyrl`; a run that uses none
  of the plugin's parts keeps verl's behaviour): an advantage estimator or policy loss verl does
  not know (e.g. `egpo-ratio`), with the registered ones; a `policy_loss.loss_mode` that
  contradicts a per-sample bound's switch (`algorithm.clip_schedule.enable=true` or
  `algorithm.clip_low_schedule.enable=true` runs the `per_sample_clip` loss: only that name or
  verl's default `vanilla` agree with it); an `actor.clip_ratio_high` (`clip_ratio_low`) the
  schedule on its side would leave unread (a value other than the schedule's `low` or verl's
  default); a training set with fewer rows than one step's prompts (verl would train nothing, exit 0); with verl's length filter off, a prompt longer than `data.max_prompt_length` or a data folder
  that records no image sizes to prove otherwise, and a vLLM context shorter than a prompt and
  its response (`entropyrl.verl.checks.prompt_bound`);
- with verl's own trainer (another `trainer.v1.trainer_mode`, or `trainer.use_v1=false`):
  `algorithm.clip_schedule.enable=true` or `algorithm.clip_low_schedule.enable=true`, which that
  trainer ignores, and an estimator that reads
  per-token entropy (`egpo`, `egpo_ratio`, ...), which under that trainer trains plain GRPO;
- a checkpoint folder holding another run's checkpoint, which `resume_mode: auto` would
  continue (`entropyrl.verl.checks.checkpoints`); a run whose checkpoint is already at its last step
  says there is nothing left to do and exits 0.

Under Hydra's command line each problem is one line on stderr and the process exits with 2 (no
traceback: Hydra prints its full one when `HYDRA_FULL_ERROR=1` is set, and then so do we).
Called from Python, the same problems raise `ConfigRefusal`. The entropy-aware trainer checks
the algorithm sections again when it is built (a run started another way).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from entropyrl.core.specs import SpecError, algorithm_specs
from entropyrl.verl.names import PER_SAMPLE_CLIP_LOSS


class ConfigRefusal(ValueError):
    """The config cannot run; `problems` holds one line per reason, each with its fix."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def check_algorithm(config: Any) -> None:
    """Raise `entropyrl.core.specs.SpecError` for an unknown or out-of-range algorithm setting."""
    algorithm = config.get("algorithm") if hasattr(config, "get") else None
    algorithm_specs(algorithm)


def config_problems(
    config: Any, *, use_reference_policy: bool, use_critic: bool = False
) -> list[str]:
    """Every reason this config cannot train, one line each (empty when it can)."""
    from entropyrl.verl.checks.geometry import geometry_problems

    problems = []
    try:
        check_algorithm(config)
    except SpecError as error:  # a section that contradicts another is said once, here
        problems.append(str(error))
    problems += geometry_problems(
        config, use_reference_policy=use_reference_policy, use_critic=use_critic
    )
    if not uses_our_trainer(config):  # verl's own trainer: only what verl itself would refuse
        return problems + trainer_problems(config)
    from entropyrl.verl.checks.prompt_bound import prompt_bound

    problems = registry_problems(config) + problems + clip_schedule_problems(config)
    problems += data_problems(config)
    return problems + [line for ok, line in prompt_bound(config) if not ok]


# The policy losses the per-sample bound's loss stands in for when the schedule is on: verl's
# default (`vanilla`, which `per_sample_clip` equals without bounds) and its own name.
SCHEDULE_LOSSES = ("vanilla", PER_SAMPLE_CLIP_LOSS)


def schedule_loss_problem(
    enabled: bool, loss_mode: Any, section: str = "clip_schedule"
) -> str | None:
    """Why the entropy-aware trainer's loss key contradicts `algorithm.<section>.enable` (a
    per-sample bound: `clip_schedule` or `clip_low_schedule`), or None.

    The switch is `enable` alone: with it on, the trainer computes each sample's bound and
    trains with the `per_sample_clip` loss whether `policy_loss.loss_mode` names it or keeps
    verl's default, `vanilla`; any other loss contradicts it."""
    loss_mode = "vanilla" if loss_mode is None else str(loss_mode)
    if not enabled or loss_mode in SCHEDULE_LOSSES:
        return None
    return (
        f"algorithm.{section}.enable=true trains with the {PER_SAMPLE_CLIP_LOSS} loss, "
        f"which actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode} contradicts; drop "
        f"the loss_mode override, or set algorithm.{section}.enable=false"
    )


def clip_schedule_problems(config: Any) -> list[str]:
    """Each per-sample bound's switch (the clip schedule on the high side, the clip-low schedule
    on the low one) against the loss key (`schedule_loss_problem`) and the actor's constant
    bound on its side (`schedule_bound_problem`); for runs of the entropy-aware trainer, the one
    that computes the bounds."""
    from omegaconf import OmegaConf

    try:
        specs = algorithm_specs(config.get("algorithm"))
    except SpecError:  # said by check_algorithm
        return []
    actor = "actor_rollout_ref.actor"
    problems = []
    for spec, key in (
        (specs.clip_schedule, "clip_ratio_high"),
        (specs.clip_low_schedule, "clip_ratio_low"),
    ):
        constant = OmegaConf.select(config, f"{actor}.{key}", default=None)
        problem = schedule_bound_problem(spec, constant, key=key)
        problems += [problem] if problem else []
    loss_mode = OmegaConf.select(config, f"{actor}.policy_loss.loss_mode", default=None)
    names = registered_names()
    if loss_mode is not None and names is not None and str(loss_mode) not in names[1]:
        return problems  # a loss verl does not know: registry_problems says so, in one line
    refused = [
        problem
        for spec in (specs.clip_schedule, specs.clip_low_schedule, specs.token_clip)
        if (problem := schedule_loss_problem(spec.enable, loss_mode, spec.SECTION))
    ]
    return refused + problems


def _section_enabled(config: Any, section: str) -> bool:
    """`algorithm.<section>.enable` is true (our sections: no plain verl config has them)."""
    from omegaconf import OmegaConf

    return OmegaConf.select(config, f"algorithm.{section}.enable", default=False) is True


# The per-sample bounds the entropy-aware trainer computes from CHAIR_i (each `enable` alone).
BOUND_SECTIONS = ("clip_schedule", "clip_low_schedule")
# The token-level mechanisms it applies from the caption reward's hallucinated spans, mapped to
# the response's own token ids (`entropyrl.verl.hooks.token_positions_from_spans`).
TOKEN_SECTIONS = ("token_penalty", "token_clip")


def trainer_problems(config: Any) -> list[str]:
    """A run of verl's own trainer that uses a part only ours makes work: the clip schedule
    (that trainer never computes the per-sample bounds) or an estimator that reads per-token
    entropy (that trainer pops the entropies before the estimator runs, which then falls back to
    GRPO and counts it in a metric that trainer never logs). Either would train without a word."""
    from omegaconf import OmegaConf

    from entropyrl.core.estimator_names import ENTROPY_ESTIMATORS
    from entropyrl.verl.names import VERL_TRAINER_MODE

    ours = f"trainer.v1.trainer_mode={VERL_TRAINER_MODE} with trainer.use_v1=true"
    problems = []
    estimator = OmegaConf.select(config, "algorithm.adv_estimator", default=None)
    if estimator is not None and str(estimator) in ENTROPY_ESTIMATORS:
        problems.append(
            f"algorithm.adv_estimator={estimator} reads per-token entropy, which only the "
            f"entropy-aware trainer ({ours}) hands it: verl's own trainer would train plain "
            "GRPO; set it, or algorithm.adv_estimator=grpo"
        )
    for section in BOUND_SECTIONS:
        if _section_enabled(config, section):
            problems.append(
                f"algorithm.{section}.enable=true needs the entropy-aware trainer "
                f"(trainer.v1.trainer_mode={VERL_TRAINER_MODE}): verl's own trainer never "
                f"computes the per-sample bounds; set it, or algorithm.{section}.enable=false"
            )
    for section in TOKEN_SECTIONS:
        if _section_enabled(config, section):
            problems.append(
                f"algorithm.{section}.enable=true needs the entropy-aware trainer "
                f"(trainer.v1.trainer_mode={VERL_TRAINER_MODE}): verl's own trainer never "
                f"reads the hallucinated tokens; set it, or algorithm.{section}.enable=false"
            )
    return problems


def verl_source_dir() -> Path | None:
    """verl's installed package folder, found without importing verl (None when it is not
    installed): what the checks that run before `import verl` read verl's own files from."""
    import importlib.util

    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def verl_actor_default(key: str) -> float:
    """verl's own default of `actor.<key>` (e.g. `clip_ratio_high`), from the actor config every
    verl trainer config composes (`verl/trainer/config/actor/actor.yaml`), read without importing
    verl: the launch scripts' pre-flight checks a config in about a second, before verl is
    imported."""
    from omegaconf import OmegaConf

    folder = verl_source_dir()
    if folder is None:
        raise RuntimeError("verl is not installed: its actor config is not there to read")
    return float(OmegaConf.load(folder / "trainer" / "config" / "actor" / "actor.yaml")[key])


def verl_clip_ratio_high_default() -> float:
    """verl's own default of `actor.clip_ratio_high` (`verl_actor_default`)."""
    return verl_actor_default("clip_ratio_high")


def schedule_bound_problem(
    spec: Any, constant: Any, verl_default: float | None = None, key: str = "clip_ratio_high"
) -> str | None:
    """Why the actor's constant bound on a schedule's side (`clip_ratio_high` for the clip
    schedule, `clip_ratio_low` for the clip-low schedule) contradicts it when enabled, or None.

    With the schedule on the loss takes each sample's bound from it and never reads the
    constant. The recipes set the constant to the schedule's `low` (a clean sample's bound, what
    every sample gets with the schedule off), and verl's own default is what a config that never
    names it holds; any other value is a bound the user expects to act, and it would not."""
    import math

    if not spec.enable or constant is None:
        return None
    value = float(constant)
    default = verl_actor_default(key) if verl_default is None else verl_default
    if math.isclose(value, spec.low) or math.isclose(value, default):
        return None
    return (
        f"actor_rollout_ref.actor.{key}={value:g} is not read with "
        f"algorithm.{spec.SECTION}.enable=true: each sample's bound comes from the schedule "
        f"(algorithm.{spec.SECTION}.low={spec.low:g} for a clean caption, high={spec.high:g} "
        f"for a hallucinating one); set those, or drop the {key} override"
    )


def uses_entropyrl(config: Any) -> bool:
    """Whether the run uses a part of the plugin verl would not have without it: the
    entropy-aware trainer, one of our advantage estimators, our policy loss, or one of our
    sections switched on (`BOUND_SECTIONS`, `TOKEN_SECTIONS`). The plugin loads into every
    verl process of the environment; a run that uses none of these is validated exactly as verl
    alone validates it."""
    from omegaconf import OmegaConf

    from entropyrl.core.estimator_names import VERL_ESTIMATORS
    from entropyrl.verl.names import VERL_POLICY_LOSSES

    def value(key: str) -> str | None:
        found = OmegaConf.select(config, key, default=None)
        return None if found is None else str(found)

    return (
        uses_our_trainer(config)
        or any(_section_enabled(config, section) for section in BOUND_SECTIONS)
        or any(_section_enabled(config, section) for section in TOKEN_SECTIONS)
        or value("algorithm.adv_estimator") in VERL_ESTIMATORS
        or value("actor_rollout_ref.actor.policy_loss.loss_mode") in VERL_POLICY_LOSSES
    )


def uses_our_trainer(config: Any) -> bool:
    """Whether the run trains with the entropy-aware trainer (`trainer.v1.trainer_mode`): the
    checks below change what verl would do (a refusal where verl runs on or exits 0), so a run
    that uses none of the plugin's parts does not get them."""
    from omegaconf import OmegaConf

    from entropyrl.verl.names import VERL_TRAINER_MODE

    mode = OmegaConf.select(config, "trainer.v1.trainer_mode", default=None)
    # `trainer.use_v1=false` runs verl's legacy trainer (main_ppo_v0), whatever the mode says
    v1 = OmegaConf.select(config, "trainer.use_v1", default=True) is not False
    return mode == VERL_TRAINER_MODE and v1


def registered_names() -> tuple[set[str], set[str]] | None:
    """(advantage estimators, policy losses) verl will know in this environment.

    After `import verl` (main_ppo's driver, every plugin loaded): verl's own registries. Before
    it (the launch's preflight, which does not import verl): the names verl 0.9.1 registers in
    `core_algos` (its `register_adv_est` / `register_policy_loss` decorators and the
    `AdvantageEstimator` enum, read from its source) and the plugin's. None when a verl plugin
    other than ours is installed: its names are known only by importing it."""
    import ast
    import importlib.metadata

    core = sys.modules.get("verl.trainer.ppo.core_algos")
    if core is not None:
        return set(core.ADV_ESTIMATOR_REGISTRY), set(core.POLICY_LOSS_REGISTRY)
    from entropyrl.core.estimator_names import VERL_ESTIMATORS
    from entropyrl.verl.names import VERL_POLICY_LOSSES

    plugins = {entry.name for entry in importlib.metadata.entry_points(group="verl.plugins")}
    folder = verl_source_dir()
    if plugins - {"entropyrl"} or folder is None:
        return None
    source = folder / "trainer/ppo/core_algos.py"
    try:
        tree = ast.parse(source.read_text())
    except (OSError, SyntaxError):
        return None
    enum: dict[str, str] = {}
    estimators, losses = set(VERL_ESTIMATORS), set(VERL_POLICY_LOSSES)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "AdvantageEstimator":
            for item in node.body:
                if isinstance(item, ast.Assign) and isinstance(item.value, ast.Constant):
                    enum[item.targets[0].id] = item.value.value  # type: ignore[attr-defined]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
            arg = node.args[0]
            name = (
                arg.value
                if isinstance(arg, ast.Constant)
                else enum.get(arg.attr)
                if isinstance(arg, ast.Attribute)
                else None
            )
            if node.func.id == "register_adv_est" and name:
                estimators.add(name)
            if node.func.id == "register_policy_loss" and name:
                losses.add(name)
    return estimators, losses


def registry_problems(config: Any) -> list[str]:
    """An advantage estimator or policy loss verl does not know: verl would fail only at the
    first step's advantages or the first update, after Ray, the rollout and the log-prob
    passes."""
    from omegaconf import OmegaConf

    names = registered_names()
    if names is None:
        return []
    problems = []
    for key, known in (
        ("algorithm.adv_estimator", names[0]),
        ("actor_rollout_ref.actor.policy_loss.loss_mode", names[1]),
    ):
        value = OmegaConf.select(config, key, default=None)
        if value is not None and str(value) not in known:
            problems.append(
                f"{key}={value} is not registered with verl; known: " + ", ".join(sorted(known))
            )
    return problems


def data_problems(config: Any) -> list[str]:
    """A training set with fewer rows than one step's prompts: verl would train no step and
    exit 0. Counted from the parquet files' metadata (no row is read); files that are not there
    or not parquet are left to verl's own error."""
    from omegaconf import OmegaConf

    from entropyrl.verl.checks.budget import data_files, parquet_rows

    files = data_files(config, "data.train_files")
    batch = OmegaConf.select(config, "data.train_batch_size", default=None)
    if not files or batch is None:
        return []
    rows = parquet_rows(files)  # None: missing, empty or not parquet, which verl says itself
    if rows is None or rows >= int(batch):
        return []
    return [
        f"data.train_files hold {rows} row(s) ({', '.join(map(str, files))}), fewer than "
        f"data.train_batch_size={int(batch)}: no training step would run; prepare more data or "
        "lower data.train_batch_size"
    ]


def refuse(problems: Sequence[str]) -> None:
    """Stop for `problems`: one line each and exit 2 under Hydra's CLI, else ConfigRefusal."""
    if not problems:
        return
    if _hydra_command_line() and not os.environ.get("HYDRA_FULL_ERROR"):
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr, flush=True)
        raise SystemExit(2)
    raise ConfigRefusal(problems)


def _hydra_command_line() -> bool:
    try:
        from hydra.core.hydra_config import HydraConfig
    except ImportError:
        return False
    return HydraConfig.initialized()


def check_resume(config: Any) -> None:
    """Refuse to continue another run's checkpoint; stop (exit 0) when nothing is left to do.

    Only under Hydra's command line: called from Python, verl's own resume logic stands."""
    if not _hydra_command_line():
        return
    from entropyrl.verl.checks.checkpoints import resume_decision

    decision = resume_decision(config)
    if decision.kind == "other_run":
        refuse([decision.line])
    if decision.kind == "finished":
        print(decision.line, file=sys.stderr, flush=True)
        raise SystemExit(0)
    if decision.kind in ("resume", "unknown"):
        print(decision.line, file=sys.stderr, flush=True)


def install() -> None:
    """Make verl's `validate_config` check our sections and the batch geometry too (idempotent).

    The plugin's one wrapper of a verl object: verl 0.9.1 has no extension point between Hydra's
    config and Ray's start (`main_ppo.main` calls `validate_config`, then `run_ppo`), and a
    refusal after Ray starts costs a user minutes. It acts only on runs that use entropyrl
    (`uses_entropyrl`); every other run gets verl's own function, unchanged."""
    from verl.utils import config as verl_config

    original = verl_config.validate_config
    if getattr(original, "_entropyrl", False):
        return

    def validate_config(
        config: Any, use_reference_policy: bool = False, use_critic: bool = False, **kwargs: Any
    ) -> Any:
        if uses_entropyrl(config):  # any other run: verl's own validation, nothing else
            refuse(
                config_problems(
                    config, use_reference_policy=use_reference_policy, use_critic=use_critic
                )
            )
            check_resume(config)
        return original(
            config, use_reference_policy=use_reference_policy, use_critic=use_critic, **kwargs
        )

    validate_config.__wrapped__ = original
    validate_config.__doc__ = original.__doc__
    validate_config._entropyrl = True  # type: ignore[attr-defined]
    verl_config.validate_config = validate_config
