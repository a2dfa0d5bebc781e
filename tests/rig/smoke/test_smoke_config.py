"""A smoke runs the recipe: its resolved config differs from the recipe's at 1 x 8 GPUs only in
the keys `entropyrl.commands.smoke.ALLOWED_DIFFERENCES` names, each for a reason a CPU forces.

Checked here on the config the smoke's overrides compose to (every task, 1 and 2 ranks), and by
`tests/rig/smoke/test_smoke.py` on the `config.yaml` each real smoke run wrote. The shape of the
recipe is kept: the group size, at least 2 mini-batches per step and 2 micro-batches per
mini-batch and rank, dynamic batch sizes exactly where the recipe has them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from entropyrl.commands import preflight
from entropyrl.rig.smoke import run as smoke_run
from entropyrl.rig.smoke import settings as smoke_settings

REPO = Path(__file__).resolve().parents[3]


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """{dotted.key: leaf} of a plain container; empty mappings count as absent."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def allowed(key: str) -> bool:
    return any(
        key == name or key.startswith(name + ".") for name in smoke_settings.ALLOWED_DIFFERENCES
    )


def recipe_config(task: str, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The recipe's own config, resolved, for its documented 1 node x 8 GPUs (with the user's
    `overrides`, e.g. the LoRA switch, which a smoke and a GPU run both get)."""
    config = preflight.compose_recipe(smoke_settings.CONFIG_NAMES[task], list(overrides))
    assert config.trainer.nnodes == 1 and config.trainer.n_gpus_per_node == 8
    return flatten(OmegaConf.to_container(config, resolve=True))


def differences(smoke_config: Any, task: str, overrides: Sequence[str] = ()) -> list[str]:
    ours = flatten(OmegaConf.to_container(smoke_config, resolve=True))
    theirs = recipe_config(task, overrides)
    absent = object()
    return sorted(
        k for k in set(ours) | set(theirs) if ours.get(k, absent) != theirs.get(k, absent)
    )


def assert_only_allowed_differences(
    smoke_config: Any, task: str, overrides: Sequence[str] = ()
) -> None:
    found = differences(smoke_config, task, overrides)
    assert [key for key in found if not allowed(key)] == []


@pytest.mark.parametrize("task", smoke_settings.TASKS)
@pytest.mark.parametrize("ranks", [1, 2])
def test_the_smoke_config_is_the_recipe_but_for_the_allowed_keys(task, ranks, tmp_path):
    settings = smoke_settings.default_settings(task, ranks=ranks)
    config = preflight.compose_recipe(
        smoke_settings.CONFIG_NAMES[task],
        smoke_run.run_overrides(settings, tmp_path / "assets", tmp_path),
    )
    assert_only_allowed_differences(config, task)
    # and every allowed key is one a smoke changes (no stale entries in the list)
    found = differences(config, task)
    changed = {
        name
        for name in smoke_settings.ALLOWED_DIFFERENCES
        if any(k == name or k.startswith(name + ".") for k in found)
    }
    assert (
        changed
        == set(smoke_settings.ALLOWED_DIFFERENCES) - NOT_CHANGED_BY_DEFAULT[task] - AT_RUN_TIME
    )


# Keys a smoke run's written config differs in that the composed one does not: verl sets the
# first, the launch the run's name (from MODEL_PATH, on the captioning recipe only).
AT_RUN_TIME = {
    "transfer_queue.enable",
    "trainer.experiment_name",
    "actor_rollout_ref.rollout.trace.experiment_name",
}
# Keys of the list the default smoke of a task leaves as the recipe has them (the caption data
# set, the text token budgets, the save frequency a test changes).
NOT_CHANGED_BY_DEFAULT = {
    "caption": {
        "trainer.save_freq",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
        "data.max_prompt_length",
        "actor_rollout_ref.rollout.prompt_length",
        "reward.custom_reward_function.reward_kwargs.chair_url",
    },
    "function-calling": {
        "trainer.save_freq",
        "data.custom_cls",
        "reward.custom_reward_function.reward_kwargs.cider_df",
        "reward.custom_reward_function.reward_kwargs.chair_url",
    },
    "mixed": {
        "trainer.save_freq",
        "data.custom_cls",
        "reward.custom_reward_function.reward_kwargs.cider_df",
        "reward.custom_reward_function.reward_kwargs.chair_url",
    },
}


@pytest.mark.parametrize("task", smoke_settings.TASKS)
@pytest.mark.parametrize("ranks", [1, 2])
def test_the_smoke_keeps_the_recipes_shape(task, ranks, tmp_path):
    from entropyrl.verl.checks.geometry import batch_geometry, geometry_problems

    settings = smoke_settings.default_settings(task, ranks=ranks)
    config = preflight.compose_recipe(
        smoke_settings.CONFIG_NAMES[task],
        smoke_run.run_overrides(settings, tmp_path / "assets", tmp_path),
    )
    recipe = preflight.compose_recipe(smoke_settings.CONFIG_NAMES[task], [])
    assert config.actor_rollout_ref.rollout.n == recipe.actor_rollout_ref.rollout.n
    assert (
        config.actor_rollout_ref.actor.use_dynamic_bsz
        == recipe.actor_rollout_ref.actor.use_dynamic_bsz
    )
    assert geometry_problems(config, use_reference_policy=True) == []
    g = batch_geometry(config, use_reference_policy=True)
    assert g.mini_batches >= 2
    if not g.dynamic:
        assert g.mini_rows_per_rank // g.micro_batch >= 2
        for log_pass in g.log_prob_passes:
            assert g.step_rows_per_rank // log_pass.micro_batch >= 2
    else:  # a mini-batch of full-length sequences needs at least two micro-batches
        assert g.mini_rows_per_rank * g.max_sequence >= 2 * g.max_tokens, (
            f"{task}: {g.mini_rows_per_rank} rows of {g.max_sequence} tokens fit one micro-batch "
            f"of {g.max_tokens} tokens"
        )


def test_the_readme_lists_every_allowed_difference():
    readme = (REPO / "docs" / "smoke.md").read_text()
    missing = [name for name in smoke_settings.ALLOWED_DIFFERENCES if f"`{name}`" not in readme]
    assert missing == []
