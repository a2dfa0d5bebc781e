"""The caption reward with one planted failure, for a real verl run (`reward.custom_reward_function
.path` names this file, `.name` stays `caption_score`).

The first training call of the run, across all reward workers (a flag file made with O_EXCL),
hands the real reward a malformed ground truth, as a broken data row would: our reward raises,
reports it (`entropyrl.verl.failures.reward_failures`), and verl fails that one session. Every other call is
the real reward unchanged.
"""

from __future__ import annotations

import os
from typing import Any

from entropyrl.verl import rewards


def _first_training_call(flag: str | None, extra_info: Any) -> bool:
    if not flag or (extra_info or {}).get("split") != "train":
        return False
    try:
        os.close(os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


async def caption_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    *,
    planted_flag: str | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    if _first_training_call(planted_flag, extra_info):
        ground_truth = "{not json"
    return await rewards.caption_score(
        data_source, solution_str, ground_truth, extra_info, **kwargs
    )
