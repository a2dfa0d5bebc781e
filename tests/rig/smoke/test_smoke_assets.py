"""The text smokes' warm-up targets under each recipe's own reward, loaded by verl.

A text smoke's rewards are binary. Its policy is warmed up on each prompt's demonstration and,
in the same batch, on `ABSTAIN`, so that a group's rewards vary (a policy that only ever writes
the learned answer gives all-1 or all-0 groups and no advantage, which the smoke check reports).
That holds only if every demonstration scores 1 and the abstention 0 under the reward the recipe
configures: checked here on the smoke's own data, through verl's `get_custom_reward_fn`.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from entropyrl.commands import preflight
from entropyrl.rig.smoke import assets as smoke_assets
from entropyrl.rig.smoke.settings import CONFIG_NAMES, default_settings

ROWS_PER_SOURCE = 3  # the mixed set runs each code row's tests in a sandbox: a few suffice
# the data sources each smoke's set holds (the mixed set: math and code)
SOURCES = {"function-calling": 1, "mixed": 2}


def scored(reward: Any, row: pd.Series, response: str) -> float:
    result = reward(
        data_source=row["data_source"],
        solution_str=response,
        ground_truth=row["reward_model"]["ground_truth"],
        extra_info=dict(row["extra_info"]),
    )
    return float(result["score"] if isinstance(result, dict) else result)


@pytest.mark.parametrize("task", sorted(smoke_assets.TEXT_TASKS))
def test_demonstrations_score_one_and_the_abstention_zero(task, tmp_path):
    from verl.trainer.ppo.reward import get_custom_reward_fn

    reward = get_custom_reward_fn(preflight.compose_recipe(CONFIG_NAMES[task]))
    prepare, demonstration, _ = smoke_assets.TEXT_TASKS[task]
    prepare(default_settings(task), tmp_path)
    frame = pd.read_parquet(tmp_path / "data" / "train.parquet")
    rows = frame.groupby("data_source").head(ROWS_PER_SOURCE)
    assert rows["data_source"].nunique() == SOURCES[task]
    assert len(rows) == ROWS_PER_SOURCE * SOURCES[task]
    for _, row in rows.iterrows():
        assert scored(reward, row, demonstration(row)) == 1.0, demonstration(row)
        assert scored(reward, row, smoke_assets.ABSTAIN) == 0.0
