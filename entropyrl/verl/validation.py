"""Check a run's config where verl checks its own: in the driver, before Ray.

`python -m verl.trainer.main_ppo` calls `verl.utils.config.validate_config` before `ray.init`.
The plugin wraps that function (imported by `main_ppo` after `import verl` has loaded the
plugin) so that two kinds of mistakes stop the run at once instead of after Ray, TransferQueue,
the workers, the rollout and the log-prob passes have run:

- an unknown or out-of-range key of our `algorithm.*` sections (`entropyrl.specs`), e.g.
  `algorithm.clip_schedule.treshold`;
- a batch geometry verl would assert on later (`entropyrl.verl.geometry`), e.g. a micro-batch
  that does not divide a rank's share of the mini-batch on this layout;
- a training set with fewer rows than one step's prompts (verl would train nothing, exit 0);
- with verl's length filter off, a prompt longer than `data.max_prompt_length` or a data folder
  that records no image sizes to prove otherwise, and a vLLM context shorter than a prompt and
  its response (`entropyrl.verl.prompt_bound`);
- a checkpoint folder holding another run's checkpoint, which `resume_mode: auto` would
  continue (`entropyrl.verl.checkpoints`); a run whose checkpoint is already at its last step
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
from typing import Any

from entropyrl.specs import SpecError, algorithm_specs


class ConfigRefusal(ValueError):
    """The config cannot run; `problems` holds one line per reason, each with its fix."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def check_algorithm(config: Any) -> None:
    """Raise `entropyrl.specs.SpecError` for an unknown or out-of-range algorithm setting."""
    algorithm = config.get("algorithm") if hasattr(config, "get") else None
    algorithm_specs(algorithm)


def config_problems(
    config: Any, *, use_reference_policy: bool, use_critic: bool = False
) -> list[str]:
    """Every reason this config cannot train, one line each (empty when it can)."""
    from entropyrl.verl.geometry import geometry_problems

    problems = []
    try:
        check_algorithm(config)
    except SpecError as error:
        problems.append(str(error))
    problems += geometry_problems(
        config, use_reference_policy=use_reference_policy, use_critic=use_critic
    )
    problems += data_problems(config)
    from entropyrl.verl.prompt_bound import prompt_bound

    problems += [line for ok, line in prompt_bound(config) if not ok]
    return problems


def data_problems(config: Any) -> list[str]:
    """A training set with fewer rows than one step's prompts: verl would train no step and
    exit 0. Counted from the parquet files' metadata (no row is read); files that are not there
    or not parquet are left to verl's own error."""
    from omegaconf import OmegaConf

    files = OmegaConf.select(config, "data.train_files", default=None)
    files = [files] if isinstance(files, str) else list(files or [])
    batch = OmegaConf.select(config, "data.train_batch_size", default=None)
    if not files or batch is None:
        return []
    try:
        import pyarrow.parquet as pq

        rows = sum(pq.ParquetFile(str(f)).metadata.num_rows for f in files)
    except Exception:  # missing, empty or not parquet: verl says so itself
        return []
    if rows >= int(batch):
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
    from entropyrl.verl.checkpoints import resume_decision

    decision = resume_decision(config)
    if decision.kind == "other_run":
        refuse([decision.line])
    if decision.kind == "finished":
        print(decision.line, file=sys.stderr, flush=True)
        raise SystemExit(0)
    if decision.kind in ("resume", "unknown"):
        print(decision.line, file=sys.stderr, flush=True)


def install() -> None:
    """Make verl's `validate_config` check our sections and the batch geometry too (idempotent)."""
    from verl.utils import config as verl_config

    original = verl_config.validate_config
    if getattr(original, "_entropyrl", False):
        return

    def validate_config(
        config: Any, use_reference_policy: bool = False, use_critic: bool = False, **kwargs: Any
    ) -> Any:
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
