"""The one shape every reward has: a batched scorer returning one `Score` per response.

Why one shape: the rewards are called from two engines. verl's reward loop calls a function per
response (`compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)`, sync or
async) and stores the extra keys of the dict it returns; the local runner scores a whole rollout
batch at once. Each reward is written once, as a `Scorer`, and both engines call it: the verl
entry points (all in `entropyrl.verl.rewards`) only turn verl's arguments into a batch of one (or
a gathered batch, for captions) and the `Score` into verl's dict; the local runner passes its
batch straight through.

Why a score can say it is no verdict: a 0 because the response is wrong and a 0 because the
checker gave up (a math check that timed out, a code service that did not answer) read the same
as a number. A scorer returns the second kind with `Score.failure` set, the cause; the verl entry
points raise it as `ScoringFailed`, so the trainer counts the sample lost with its cause (and
stops past its limit) instead of training on a 0 that says nothing about the response.

Why batched: where the work batches, the scorer sees the batch. Captions get one CHAIR request
per batch instead of one per caption (verl's per-response calls are gathered first, see
`entropyrl.verl.rewards.CaptionBatcher`); the hybrid reward hands each route its rows at once.
Rewards whose work is per response (tool calls, math, code) are `ResponseScorer`s: they write
`score_response` and inherit the loop.

The arguments are verl's, batched: the response texts, the rows' `reward_model.ground_truth` and
the rows' `extra_info` (None where a row has none). What each reward reads from them is in its
scorer's docstring.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "ExtraInfos",
    "GroundTruths",
    "ResponseScorer",
    "Score",
    "Scorer",
    "ScoringFailed",
    "Solutions",
    "batch_size",
    "same_length",
    "score_one",
]


@dataclass(frozen=True)
class Score:
    """One response's reward: the scalar, why (empty where nothing needs saying), and the
    reward's per-response fields (verl stores those of the entry point's dict per sample).

    ``failure`` is empty for a verdict; otherwise the response was not judged (the checker gave
    up, a service failed) and it says why, one line: ``score`` is then 0 and means nothing.
    ``score["name"]`` reads ``score``, ``reason`` or a field of ``details`` by name.
    """

    score: float
    reason: str = ""
    details: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    failure: str = ""

    def __getitem__(self, key: str) -> Any:
        if key == "score":
            return self.score
        if key == "reason":
            return self.reason
        return self.details[key]

    def as_dict(self, keys: Sequence[str] | None = None) -> dict[str, Any]:
        """``{"score": ..., **details}``, or exactly `keys` in that order (verl's dict shape)."""
        if keys is None:
            return {"score": self.score, **self.details}
        return {key: self[key] for key in keys}


class ScoringFailed(RuntimeError):
    """A response the reward could not judge (`Score.failure` is the message): raised by the verl
    entry points so the failure is reported and the sample dropped, not trained on as a 0."""


# The three batch arguments, as verl hands them over one row at a time.
Solutions = Sequence[str]
GroundTruths = Sequence[Any]
ExtraInfos = Sequence[Mapping[str, Any] | None]


@runtime_checkable
class Scorer(Protocol):
    """A reward: scores a batch of responses against their rows' ground truths.

    ``score_batch`` returns one `Score` per response, in order. It raises ValueError for a data
    error (a malformed ground truth, an unknown route), never for a bad response (that scores 0,
    with the reason); a response it could not judge has `Score.failure` set (see the module
    docstring), and whatever its checker raised otherwise propagates.
    """

    def score_batch(
        self, solutions: Solutions, ground_truths: GroundTruths, extra_infos: ExtraInfos
    ) -> Sequence[Score]: ...


def same_length(**sequences: Sequence[Any]) -> int:
    """The common length of the named sequences; ValueError naming each length otherwise."""
    lengths = {name: len(values) for name, values in sequences.items()}
    if len(set(lengths.values())) > 1:
        *head, last = [f"{name} ({length})" for name, length in lengths.items()]
        raise ValueError(f"{', '.join(head)} and {last} must have the same length")
    return next(iter(lengths.values()), 0)


def batch_size(solutions: Solutions, ground_truths: GroundTruths, extra_infos: ExtraInfos) -> int:
    """The batch's length; ValueError when the three sequences differ in length."""
    return same_length(solutions=solutions, ground_truths=ground_truths, extra_infos=extra_infos)


class ResponseScorer(ABC):
    """A `Scorer` whose work is per response (tool calls, math, code): ``score_batch`` checks the
    lengths and calls `score_response` on each row, in order. A reward whose work batches
    (captions: one CHAIR call) writes its own ``score_batch`` instead."""

    def score_batch(
        self, solutions: Solutions, ground_truths: GroundTruths, extra_infos: ExtraInfos
    ) -> list[Score]:
        batch_size(solutions, ground_truths, extra_infos)
        rows = zip(solutions, ground_truths, extra_infos)
        return [self.score_response(solution, truth, info) for solution, truth, info in rows]

    @abstractmethod
    def score_response(
        self, solution: str, ground_truth: Any, extra_info: Mapping[str, Any] | None
    ) -> Score:
        """One response's `Score`."""


def score_one(
    scorer: Scorer, solution: Any, ground_truth: Any, extra_info: Mapping[str, Any] | None = None
) -> Score:
    """`scorer` on a batch of one: what a verl entry point (one response per call) runs."""
    (scored,) = scorer.score_batch([solution], [ground_truth], [extra_info])
    return scored
