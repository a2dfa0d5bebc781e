"""The names the plugin registers with verl (and of `entropyrl.algorithms.ESTIMATORS`), without imports.

The table itself needs torch; these names are read where that is too heavy or too early: the
local runner's CLI (stdlib only), the smoke check, and the verl plugin, which runs while one of
our verl modules may still be half-imported and so may read no attribute of it.
`tests/core/test_estimator_names.py` holds them against the table and verl's registry.
"""

ESTIMATOR_NAMES: tuple[str, ...] = ("grpo", "egpo", "egpo_ratio", "entropy_adv", "maxent_grpo")
# verl ships its own `grpo`; the plugin registers the others.
VERL_ESTIMATORS: tuple[str, ...] = tuple(name for name in ESTIMATOR_NAMES if name != "grpo")
# Those that read per-token entropy: without it a sample keeps its plain GRPO advantage and is
# counted in `egpo/entropy/missing`.
ENTROPY_ESTIMATORS: tuple[str, ...] = ("egpo", "egpo_ratio", "entropy_adv")
# The policy losses the plugin registers with verl (`entropyrl.verl.loss`).
VERL_POLICY_LOSSES: tuple[str, ...] = ("per_sample_clip",)
# `trainer.v1.trainer_mode` of the entropy-aware trainer (`entropyrl.verl.trainer`).
VERL_TRAINER_MODE = "entropyrl"
# The CPU wing (`entropyrl.verl.cpu`): verl's own platform override variable, the platform and
# the rollout it registers. A process loads the wing only when this variable selects it.
VERL_PLATFORM_ENV = "VERL_PLATFORM"
CPU_PLATFORM = "cpu"
HF_ROLLOUT = "hf"


def cpu_selected(environ: dict[str, str] | None = None) -> bool:
    """Whether this process is asked to run verl on the CPU platform (`VERL_PLATFORM=cpu`)."""
    import os

    value = (os.environ if environ is None else environ).get(VERL_PLATFORM_ENV, "")
    return value.strip().lower() == CPU_PLATFORM
