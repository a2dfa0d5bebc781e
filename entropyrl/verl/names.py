"""The names the plugin registers with verl beyond the estimators, importable without verl or
torch: the policy loss, the trainer mode, and the CPU wing's platform and rollout (registered
only in a process that selects the CPU platform).

The estimator names are the core's (`entropyrl.core.estimator_names`); these are the plugin's
own. This module imports none of ours, so it is never half-imported when verl's plugin loader
reaches `entropyrl.verl.plugin` from inside another of our modules (it imports only `os`).
"""

import os

# The per-sample clip bound's policy loss (`entropyrl.verl.loss`).
PER_SAMPLE_CLIP_LOSS = "per_sample_clip"
# The policy losses the plugin registers with verl (`entropyrl.verl.loss`).
VERL_POLICY_LOSSES: tuple[str, ...] = (PER_SAMPLE_CLIP_LOSS,)
# `trainer.v1.trainer_mode` of the entropy-aware trainer (`entropyrl.verl.trainer`).
VERL_TRAINER_MODE = "entropyrl"
# The CPU wing (`entropyrl.rig.cpu`): verl's own platform override variable, the platform and
# the rollout it registers. A process loads the wing only when this variable selects it.
VERL_PLATFORM_ENV = "VERL_PLATFORM"
CPU_PLATFORM = "cpu"
HF_ROLLOUT = "hf"


def cpu_selected(environ: dict[str, str] | None = None) -> bool:
    """Whether this process is asked to run verl on the CPU platform (`VERL_PLATFORM=cpu`)."""
    value = (os.environ if environ is None else environ).get(VERL_PLATFORM_ENV, "")
    return value.strip().lower() == CPU_PLATFORM
