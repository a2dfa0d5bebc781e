"""What a launch script checks before it starts anything: the recipe as verl would compose it.

    python -m entropyrl.commands.preflight CONFIG [--mode gpu|smoke] [--dry-run] [--env-out FILE]
        -- OVERRIDE ...

CONFIG is a recipe name (`configs/<name>.yaml`) or a path to a config file; the overrides are
exactly those the training command will get. The config is composed with Hydra as
`verl.trainer.main_ppo` composes it, then checked:

- config (always refused): unknown or out-of-range `algorithm.*` keys and a batch geometry verl
  would assert on later (`entropyrl.verl.checks.geometry`), the same checks the plugin runs inside
  `main_ppo`, here before the CHAIR service, Ray or a smoke's asset build start;
- stack (GPU runs): verl, vLLM, torch and transformers against verl 0.9.1's pins, flash-attn
  when the recipe's attention needs it (`stack_problems`);
- layout (GPU runs): the GPUs this process sees against the config's `n_gpus_per_node`, and on
  more than one node a checkpoint folder every node shares;
- fits (GPU runs, always refused): a rank's GPU memory, training state + activations and vLLM's
  share, within the GPU's (`entropyrl.verl.checks.plan`), for a model whose numbers are known
  (its folder's config.json, else those shipped for the recipes' models);
- inputs (GPU runs): the model's chat template and a wandb logger's credentials, the list
  `entropyrl doctor` reports (`layout.input_findings`);
- prompts (always): with verl's length filter off, every prompt fits `data.max_prompt_length`,
  proven from the image sizes `entropyrl prepare coco` records (`prompt_findings`), and
  `rollout.max_model_len` holds a prompt and its response;
- checkpoints (always): a folder holding another run's checkpoint is refused; a run already at
  its last step is reported, and the launch script stops there (`entropyrl.verl.checks.checkpoints`).

Each problem is one line on stderr; the exit status is 2 when the run must not start. With
`--dry-run` the split of a step and the plan (GPU memory per rank, host memory per node, disk,
an estimated time) are printed too, and environment problems are notes. `--env-out`
writes what the launch script needs from the composed config (nodes, checkpoint folder) as
shell assignments. `entropyrl doctor --recipe` runs the same checks and reports each.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from entropyrl.commands.forward import add_forwarded
from entropyrl.verl.checks.findings import Finding, run_roles
from entropyrl.verl.checks.findings import installed_version as _version
from entropyrl.verl.checks.findings import select as _select
from entropyrl.verl.checks.layout import (
    budget_lines,
    fits_findings,
    gpu_findings,
    input_findings,
    node_findings,
    prompt_findings,
    visible_gpus,
)
from entropyrl.verl.checks.stack import GPU_INSTALL, NO_VERL, stack_findings

REPO_CONFIGS = Path(__file__).resolve().parents[2] / "configs"
__all__ = ["GPU_INSTALL", "NO_VERL", "Finding", "check", "compose_recipe", "main"]


def verl_installed() -> bool:
    """Whether verl's distribution is installed here (read from its metadata, no import)."""
    return _version("verl") is not None


def config_path(recipe: str) -> Path:
    """`configs/<recipe>.yaml` for a recipe name, else the path given (ValueError if neither)."""
    path = Path(recipe)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path.resolve()
    named = REPO_CONFIGS / f"{recipe}.yaml"
    if named.is_file():
        return named
    names = ", ".join(sorted(p.stem for p in REPO_CONFIGS.glob("*.yaml") if "common" not in p.stem))
    raise ValueError(f"no recipe {recipe!r}: give one of {names} or a path to a .yaml config")


def verl_config_dir() -> Path:
    """verl's own config folder (`verl/trainer/config`), found without importing verl."""
    from entropyrl.verl.checks.validation import verl_source_dir

    folder = verl_source_dir()
    if folder is None:
        raise ValueError("verl is not installed: pip install 'verl[verl-core]==0.9.1'")
    return folder / "trainer" / "config"


def compose_recipe(recipe: str, overrides: Sequence[str] = ()) -> Any:
    """The config `python -m verl.trainer.main_ppo --config-path DIR --config-name NAME
    OVERRIDES` trains with (Hydra's own composition; its `hydra.*` overrides do not matter).

    The recipes find verl's config as `pkg://verl.trainer.config`, which imports verl (torch,
    Ray, ...: seconds); the same folder is given here as a file path, so checking a config takes
    well under a second (tests/commands/test_preflight.py: the same config either way)."""
    from hydra import compose, initialize_config_dir

    path = config_path(recipe)
    job = [o for o in overrides if not o.lstrip("+~").startswith("hydra.")]
    job.append(f"hydra.searchpath=[file://{verl_config_dir()}]")
    with initialize_config_dir(config_dir=str(path.parent), version_base=None):
        return compose(config_name=path.stem, overrides=job)


def config_findings(config: Any) -> list[Finding]:
    """Algorithm settings and batch geometry: what the plugin refuses inside main_ppo."""
    from entropyrl.verl.checks.validation import config_problems

    reference, critic = run_roles(config)
    problems = config_problems(config, use_reference_policy=reference, use_critic=critic)
    return [Finding("config", False, line) for line in problems]


def run_values(config: Any, *, nothing_to_do: bool = False) -> dict[str, str]:
    """What the launcher reads from the composed config: nodes, GPUs per node, the checkpoint
    folder, and whether the checkpoint is already at the run's last step."""
    return {
        "ER_NNODES": str(int(_select(config, "trainer.nnodes", 1))),
        "ER_GPUS_PER_NODE": str(int(_select(config, "trainer.n_gpus_per_node", 0))),
        "ER_CHECKPOINT_DIR": str(_select(config, "trainer.default_local_dir", "")),
        "ER_NOTHING_TO_DO": "1" if nothing_to_do else "0",
    }


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


_NOT_IN_STRUCT = re.compile(r"Could not override '([^']+)'")


def composition_problem(recipe: str, error: Exception, overrides: Sequence[str] = ()) -> str:
    """Hydra's composition error as one line with the fix. A key the recipe does not have
    (Hydra: "Could not override ... use +key"): under one of our algorithm sections, the
    section's accepted keys (a `+` would only move the refusal to our check); elsewhere, that the
    key is not in the config, so a misspelling is the likelier cause than a missing `+`."""
    text = " ".join(str(error).split())
    match = _NOT_IN_STRUCT.search(text)
    if match:
        key = match.group(1)
        parts = key.split(".")
        if len(parts) == 3 and parts[0] == "algorithm":
            from entropyrl.core.specs import SpecError, algorithm_specs

            try:
                algorithm_specs({parts[1]: {parts[2]: None}})
            except SpecError as refusal:
                return str(refusal)
        near = _near_keys(recipe, overrides, key)
        hint = f"; did you mean {' or '.join(near)}?" if near else ""
        return (
            f"{key} is not a key of the {recipe} config{hint} (a key it lacks on purpose takes a "
            f"leading +: +{key}=...)"
        )
    return f"{recipe}: {text}"


def _near_keys(recipe: str, overrides: Sequence[str], key: str) -> list[str]:
    """Keys of the config beside `key` that look like it (composed without the override)."""
    import difflib

    from omegaconf import OmegaConf

    rest = [item for item in overrides if item.split("=", 1)[0].lstrip("+~") != key]
    try:
        parent_key, _, name = key.rpartition(".")
        config = compose_recipe(recipe, rest)
        parent = OmegaConf.select(config, parent_key) if parent_key else config
        names = [str(k) for k in parent] if OmegaConf.is_dict(parent) else []
    except Exception:  # the rest does not compose either: no suggestion
        return []
    prefix = f"{parent_key}." if parent_key else ""
    return [prefix + near for near in difflib.get_close_matches(name, names, n=2)]


def main(
    argv: Sequence[str] | None = None, prog: str = "python -m entropyrl.commands.preflight"
) -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Check a recipe with the run's overrides before anything starts.",
    )
    parser.add_argument("config", help="recipe name (configs/<name>.yaml) or a config path")
    parser.add_argument(
        "--mode",
        choices=("gpu", "smoke"),
        default="gpu",
        help="gpu: also check the stack, the GPUs and multi-node folders (default)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the step's split; environment as notes"
    )
    parser.add_argument("--env-out", type=Path, help="write ER_NNODES=... for the launch script")
    parser.epilog = "Hydra overrides follow a `--`, exactly as the training command gets them."
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.overrides = argv[split + 1 :]
    status, values = check(args.config, args.overrides, mode=args.mode, dry_run=args.dry_run)
    if args.env_out is not None and values:
        args.env_out.write_text(
            "".join(f"{key}={shlex.quote(value)}\n" for key, value in values.items())
        )
    return status


def check(
    recipe: str, overrides: Sequence[str], *, mode: str = "gpu", dry_run: bool = False
) -> tuple[int, dict[str, str]]:
    """Compose `recipe` with `overrides` and check it, one line on stderr per finding (notes in
    a dry run). Returns the exit status (2: something would stop the run) and `run_values`
    (empty when the recipe did not compose)."""
    try:
        config = compose_recipe(recipe, overrides)
    except Exception as error:  # Hydra's composition errors: one line, not a traceback
        _say(f"error: {composition_problem(recipe, error, overrides)}")
        return 2, {}
    findings = config_findings(config)  # with the prompt bound's refusals
    if dry_run and not findings:
        from entropyrl.verl.checks.geometry import batch_geometry, describe

        reference, critic = run_roles(config)
        geometry = batch_geometry(config, use_reference_policy=reference, use_critic=critic)
        for line in describe(geometry):
            _say(f"# dry-run: batch {line}")
        for finding in prompt_findings(config):
            _say(f"# dry-run: {finding.line}")
        for line in budget_lines(config, recipe, mode):
            _say(f"# dry-run: budget: {line}")
    if mode == "gpu" and not findings:  # a layout whose GPU memory does not fit: refused
        fits = fits_findings(config)
        findings += [f for f in fits if not f.ok]
    if mode == "gpu":
        # No GPU at all is the launch script's own first check (and a dry run's note).
        gpus = gpu_findings(config) if visible_gpus() > 0 else []
        # the data files and the model: the launch script checks them itself, next
        inputs = input_findings(config, files=False)
        environment = [*stack_findings(config), *gpus, *node_findings(config), *inputs]
        for finding in environment:
            if finding.ok:
                continue
            if dry_run:
                verdict = "would stop" if finding.blocking else "would warn"
                _say(f"# dry-run: {verdict}: {finding.line}")
            elif finding.blocking:
                findings.append(finding)
            else:
                _say(f"warning: {finding.line}")
    # The checkpoint folder: another run's checkpoint is refused, a finished run stops here.
    from entropyrl.verl.checks.checkpoints import resume_decision

    decision = resume_decision(config)
    if decision.kind == "other_run":
        findings.append(Finding("checkpoints", False, decision.line))
    elif decision.kind in ("resume", "unknown", "finished") and not findings:
        _say(f"# dry-run: {decision.line}" if dry_run else decision.line)
    values = run_values(config, nothing_to_do=decision.kind == "finished")
    for finding in findings:
        _say(f"error: {finding.line}")
    return (2 if findings else 0), values


def register(subparsers: Any) -> None:
    """Add `preflight` to the `entropyrl` command line (the parser of
    `python -m entropyrl.commands.preflight`)."""
    add_forwarded(
        subparsers,
        "preflight",
        __name__,
        "check a recipe and its overrides without starting verl (what the launch scripts run first)",
    )


if __name__ == "__main__":
    sys.exit(main())
