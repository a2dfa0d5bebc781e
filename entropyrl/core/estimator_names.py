"""The advantage estimators' names and what each reads, importable without torch.

The advantage estimators are declared once, where each is defined: the `@estimator(name, ...)`
decorators of `entropyrl/core/algorithms.py`, with what each reads (per-token entropy, reference
log-probs) and whether verl ships it. This module reads those declarations from that file's
source (`ast`, no import): the names are needed where torch is too heavy or too early (the local
runner's CLI, the smoke check, and the verl plugin, which runs while one of our verl modules may
still be half-imported and so may read no attribute of it). An import of `algorithms` cannot
serve them: it imports torch, and the plugin would read a half-imported module. The plugin's
other names (loss, trainer mode, CPU platform) are its own: `entropyrl.verl.names`.
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
