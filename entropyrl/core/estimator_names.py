"""The names the plugin registers with verl, importable without torch.

The advantage estimators are declared once, where each is defined: the `@estimator(name, ...)`
decorators of `entropyrl/core/algorithms.py`, with what each reads (per-token entropy, reference
log-probs) and whether verl ships it. This module reads those declarations from that file's
source (`ast`, no import): the names are needed where torch is too heavy or too early (the local
runner's CLI, the smoke check, and the verl plugin, which runs while one of our verl modules may
still be half-imported and so may read no attribute of it).
"""

import ast
from pathlib import Path


def _declared_estimators() -> dict[str, dict[str, bool]]:
    """{name: {"entropy": bool, "reference": bool, "in_verl": bool}} in definition order, from
    the `@estimator("name", flag=True, ...)` decorators of `entropyrl/core/algorithms.py`."""
    source = Path(__file__).with_name("algorithms.py").read_text(encoding="utf-8")
    declared: dict[str, dict[str, bool]] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            if (
                isinstance(decorator, ast.Call)
                and isinstance(decorator.func, ast.Name)
                and decorator.func.id == "estimator"
            ):
                flags = {"entropy": False, "reference": False, "in_verl": False}
                flags.update({kw.arg: ast.literal_eval(kw.value) for kw in decorator.keywords})
                declared[ast.literal_eval(decorator.args[0])] = flags
    return declared


# {name: what it reads}: the one declaration, as `entropyrl.core.algorithms.ESTIMATORS` holds it.
ESTIMATOR_NEEDS: dict[str, dict[str, bool]] = _declared_estimators()
ESTIMATOR_NAMES: tuple[str, ...] = tuple(ESTIMATOR_NEEDS)
# verl ships its own `grpo`; the plugin registers the others.
VERL_ESTIMATORS: tuple[str, ...] = tuple(
    name for name, needs in ESTIMATOR_NEEDS.items() if not needs["in_verl"]
)
# Those that read per-token entropy: without it a sample keeps its plain GRPO advantage and is
# counted in `egpo/entropy/missing`.
ENTROPY_ESTIMATORS: tuple[str, ...] = tuple(
    name for name, needs in ESTIMATOR_NEEDS.items() if needs["entropy"]
)
# Those that read the reference policy's log-probs.
REFERENCE_ESTIMATORS: tuple[str, ...] = tuple(
    name for name, needs in ESTIMATOR_NEEDS.items() if needs["reference"]
)
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
    import os

    value = (os.environ if environ is None else environ).get(VERL_PLATFORM_ENV, "")
    return value.strip().lower() == CPU_PLATFORM
