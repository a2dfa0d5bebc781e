"""Rewards: CIDEr-D with corpus document frequencies, the caption reward, the strict
function-calling reward, math and code. Every reward is a `Scorer` (`entropyrl.rewards.scorer`:
one batched ``score_batch`` returning a `Score` per response), which verl's entry points and the
local runner both call. Names load on first use so importing the package stays cheap."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Score": "entropyrl.rewards.scorer",
    "Scorer": "entropyrl.rewards.scorer",
    "CiderD": "entropyrl.rewards.cider",
    "normalize_caption": "entropyrl.rewards.text",
    "CaptionReward": "entropyrl.rewards.caption",
    "CaptionRewardResult": "entropyrl.rewards.caption",
    "ChairScorerLike": "entropyrl.rewards.caption",
    "FunctionCallingScorer": "entropyrl.rewards.function_calling",
    "MathScorer": "entropyrl.rewards.math_answer",
    "CodeScorer": "entropyrl.rewards.code",
    "SandboxFusionScorer": "entropyrl.rewards.code",
    "HybridScorer": "entropyrl.rewards.hybrid",
    "ToolCallFormatError": "entropyrl.rewards.function_calling",
    "parse_tool_calls": "entropyrl.rewards.function_calling",
    "score_details": "entropyrl.rewards.function_calling",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'entropyrl.rewards' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
