"""Scorers with a planted failure, for the reward entry points' tests (tests/verl/test_rewards.py).

`CannotJudge` returns what a scorer returns when its checker gave up (`Score.failure` set, the 0
meaning nothing); `Crashes` raises, as a scorer whose sandbox or service breaks mid-call does.
Both honour the `Scorer` protocol (one score per response, in order) so the entry points run
them exactly as they run the real rewards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from entropyrl.rewards.scorer import Score, batch_size


class CannotJudge:
    """Every response: score 0, no verdict, `cause` as the failure."""

    def __init__(self, cause: str, details: dict[str, Any] | None = None) -> None:
        self.cause = cause
        self.details = details or {}

    def score_batch(
        self, solutions: Sequence[Any], ground_truths: Sequence[Any], extra_infos: Sequence[Any]
    ) -> list[Score]:
        size = batch_size(solutions, ground_truths, extra_infos)
        return [Score(0.0, self.cause, self.details, self.cause) for _ in range(size)]


class Crashes:
    """Every batch raises `error`."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def score_batch(
        self, solutions: Sequence[Any], ground_truths: Sequence[Any], extra_infos: Sequence[Any]
    ) -> list[Score]:
        raise self.error
