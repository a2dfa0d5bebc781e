"""verl plugin entry point (`[project.entry-points."verl.plugins"] entropyrl`).

verl imports this module at the end of `import verl` in every process (driver, TaskRunner,
Ray workers, reward workers) unless `VERL_USE_EXTERNAL_PLUGINS=none`. Importing it registers:
- advantage estimators `egpo`, `egpo_ratio`, `entropy_adv`, `maxent_grpo`;
- the policy loss `per_sample_clip`;
- the trainer `trainer.v1.trainer_mode=entropyrl`;
- and the config checks of runs that use one of these (`entropyrl.verl.checks.validation`).
Only in a process that selects the CPU platform (`VERL_PLATFORM=cpu`, as the smoke and the CPU
runs do) it also loads the CPU wing (`entropyrl.rig.cpu`): the platform `cpu`, its backend
fixes and the rollout `actor_rollout_ref.rollout.name=hf`. A GPU run's processes import none of
it, nor the smoke's per-sample recorder (`entropyrl.rig.trace`, loaded when
`ENTROPYRL_TRACE_DIR` asks for it).
verl logs plugin import errors at DEBUG level only, so `check_registrations()` verifies the
registries and `entropyrl doctor` reports them.
"""

from __future__ import annotations

import importlib
import sys

from entropyrl.core.estimator_names import VERL_ESTIMATORS as ESTIMATORS
from entropyrl.verl import extensions
from entropyrl.verl.checks import validation
from entropyrl.verl.names import (
    CPU_PLATFORM,
    HF_ROLLOUT,
    VERL_POLICY_LOSSES,
    VERL_TRAINER_MODE,
    cpu_selected,
)

CPU_RUN = cpu_selected()
if CPU_RUN:
    # The platform before the registering modules: verl's FSDP engine module asks for it on
    # import, and the trainer imports it.
    extensions.load(extensions.CPU_BACKEND)()

# Names, not module attributes: a process whose first import is one of our verl modules (a Ray
# actor unpickling the rollout server, say) reaches this file while that module is still
# half-imported, so nothing below may read its attributes (`entropyrl.core.estimator_names` imports
# nothing, so it is never half-imported).
POLICY_LOSSES: tuple[str, ...] = VERL_POLICY_LOSSES
TRAINERS: tuple[str, ...] = (VERL_TRAINER_MODE,)
ROLLOUTS: tuple[str, ...] = (HF_ROLLOUT,) if CPU_RUN else ()
PLATFORMS: tuple[str, ...] = (CPU_PLATFORM,) if CPU_RUN else ()
_MODULES = {
    "advantage_estimators": "entropyrl.verl.estimators",
    "policy_losses": "entropyrl.verl.loss",
    "trainers": "entropyrl.verl.trainer",
}

validation.install()


def _importing(module_name: str) -> bool:
    """True while `module_name` is still being imported (its registrations are not run yet)."""
    module = sys.modules.get(module_name)
    spec = getattr(module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def _import_registering_modules() -> None:
    """Import the modules whose decorators register with verl.

    When this process's first import was one of them, it is half-imported here and a module
    that imports names from it fails; that module registers on its own first import later.
    """
    for module_name in _MODULES.values():
        try:
            importlib.import_module(module_name)
        except ImportError:
            if not any(_importing(name) for name in _MODULES.values()):
                raise


_import_registering_modules()


def registrations() -> dict[str, dict[str, bool]]:
    """What verl's registries hold of ours: {kind: {name: registered}}."""
    from verl.plugin.platform import PlatformRegistry
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.v1 import trainer_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    return {
        "advantage_estimators": {
            name: name in core_algos.ADV_ESTIMATOR_REGISTRY for name in ESTIMATORS
        },
        "policy_losses": {name: name in core_algos.POLICY_LOSS_REGISTRY for name in POLICY_LOSSES},
        "trainers": {name: name in trainer_base.TRAINER_REGISTRY for name in TRAINERS},
        "rollouts": {name: name in RolloutReplicaRegistry._registry for name in ROLLOUTS},
        "platforms": {name: PlatformRegistry.get(name) is not None for name in PLATFORMS},
    }


def check_registrations() -> None:
    """Raise RuntimeError naming whatever is not registered with verl."""
    missing = [
        f"{kind}:{name}"
        for kind, names in registrations().items()
        for name, ok in names.items()
        if not ok and not _importing(_MODULES.get(kind, ""))
    ]
    if missing:
        raise RuntimeError(f"entropyrl verl plugin: not registered: {', '.join(missing)}")


check_registrations()
