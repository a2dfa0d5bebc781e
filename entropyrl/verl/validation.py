"""Check our `algorithm.*` sections where verl checks its config: in the driver, before Ray.

`python -m verl.trainer.main_ppo` calls `verl.utils.config.validate_config` before `ray.init`.
The plugin wraps that function (imported by `main_ppo` after `import verl` has loaded the
plugin), so a misspelt key such as `algorithm.clip_schedule.treshold` stops the run at once with
a message naming it, instead of after Ray, TransferQueue and the workers have started. The
entropy-aware trainer validates again when it is built (a run started another way).
"""

from __future__ import annotations

from typing import Any

from entropyrl.specs import algorithm_specs


def check_algorithm(config: Any) -> None:
    """Raise `entropyrl.specs.SpecError` for an unknown or out-of-range algorithm setting."""
    algorithm = config.get("algorithm") if hasattr(config, "get") else None
    algorithm_specs(algorithm)


def install() -> None:
    """Make verl's `validate_config` check our algorithm sections too (idempotent)."""
    from verl.utils import config as verl_config

    original = verl_config.validate_config
    if getattr(original, "_entropyrl", False):
        return

    def validate_config(config: Any, *args: Any, **kwargs: Any) -> Any:
        check_algorithm(config)
        return original(config, *args, **kwargs)

    validate_config.__wrapped__ = original
    validate_config.__doc__ = original.__doc__
    validate_config._entropyrl = True  # type: ignore[attr-defined]
    verl_config.validate_config = validate_config
