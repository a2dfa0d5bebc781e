"""Caption reward: CIDEr-D (corpus df) plus an optional CHAIR penalty and recall bonus.

``score = cider - chair_weight * penalty + recall_weight * recall`` per caption, where ``penalty``
is the caption's CHAIR_i (``chair_penalty="fraction"``, the default: hallucinated mentions /
mentions) or the number of hallucinated mentions (``chair_penalty="count"``, the CHAIR entry's
``metrics.hallucinated``). A fraction penalises one wrong object in a three-object caption by a
third, which CIDEr-D's noise can swamp; the count keeps a full penalty per wrong object (the
quick-start results in docs/quickstart.md use it). CHAIR comes from
one batched call to a CHAIR scorer per reward batch (the HTTP ``ChairClient`` or any object with
the same ``score`` method). Where CHAIR is unavailable for a caption (service down, unknown image
id) the reward falls back to the CIDEr-D part alone, ``chair_ok`` is False and the fraction is
reported as ``chair/unavailable_frac``: training goes on and the failure is visible.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from entropyrl.rewards.cider import CiderD

__all__ = ["CaptionReward", "CaptionRewardResult", "ChairScorerLike"]


@runtime_checkable
class ChairScorerLike(Protocol):
    """Anything that scores captions like ``entropyrl.rewards.chair_client.ChairClient``.

    ``score(items)`` receives ``[{"image_id": int, "caption": str}, ...]`` and returns one entry
    per item: the CHAIR server's per-sentence dict (with ``"metrics": {"CHAIRs", "CHAIRi",
    "Recall", ...}``), a dict with ``"error"`` for an item it could not score, or None.
    """

    def score(self, items: list[dict[str, Any]]) -> list[dict[str, Any] | None]: ...


@dataclass(frozen=True)
class CaptionRewardResult:
    """Per-caption reward and its parts; every array has shape ``[B]``.

    ``chair_i``, ``chair_s``, ``recall`` and ``hallucinated`` (number of hallucinated mentions;
    None when CHAIR was not requested) are NaN where ``chair_ok`` is False. ``chair_fallback``
    marks the captions the scorer gave no answer for (service unreachable: the documented
    fallback), as opposed to captions it answered with an error (e.g. an unknown image id).
    """

    scores: np.ndarray
    cider: np.ndarray
    chair_i: np.ndarray
    chair_s: np.ndarray
    recall: np.ndarray
    chair_ok: np.ndarray
    chair_requested: bool = False
    hallucinated: np.ndarray | None = None
    chair_fallback: np.ndarray | None = None

    def metrics(self) -> dict[str, float]:
        """Batch means for logging; CHAIR means only over captions CHAIR could score."""
        out = {
            "reward/score_mean": _mean(self.scores),
            "reward/cider_mean": _mean(self.cider),
        }
        if self.chair_requested:
            ok = self.chair_ok
            out["chair/unavailable_frac"] = float(1.0 - ok.mean()) if ok.size else 0.0
            if ok.any():
                out["chair/chair_i_mean"] = float(self.chair_i[ok].mean())
                out["chair/chair_s_mean"] = float(self.chair_s[ok].mean())
                out["chair/recall_mean"] = float(self.recall[ok].mean())
                if self.hallucinated is not None and np.isfinite(self.hallucinated[ok]).all():
                    out["chair/hallucinated_mean"] = float(self.hallucinated[ok].mean())
        return out


def _plain(image_id: Any) -> Any:
    """numpy scalars -> Python (JSON) values; COCO ids stay ints, other ids stay strings."""
    return image_id.item() if isinstance(image_id, np.generic) else image_id


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else 0.0


def _metric(entry: Mapping[str, Any], name: str) -> float:
    value = entry["metrics"][name]
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"CHAIR metric {name!r} is NaN")
    return value


def _optional_count(entry: Mapping[str, Any]) -> float:
    try:
        return _metric(entry, "hallucinated")
    except (KeyError, TypeError, ValueError):
        return math.nan


class CaptionReward:
    """Callable reward for a batch of captions (see the module docstring for the formula).

    Args:
        cider: the CIDEr-D scorer built from the training references.
        chair_client: a :class:`ChairScorerLike`, or None to skip CHAIR.
        chair_weight: weight ``w`` of the ``- w * penalty`` term.
        recall_weight: weight of the ``+ recall`` bonus (keeps empty captions from winning).
        chair_penalty: ``"fraction"`` (penalty = CHAIR_i, the default, kept for existing
            configs) or ``"count"`` (penalty = number of hallucinated mentions).
    """

    PENALTIES = ("fraction", "count")

    def __init__(
        self,
        cider: CiderD,
        chair_client: ChairScorerLike | None = None,
        *,
        chair_weight: float = 0.0,
        recall_weight: float = 0.0,
        chair_penalty: str = "fraction",
    ) -> None:
        if chair_penalty not in self.PENALTIES:
            raise ValueError(
                f"chair_penalty must be one of {self.PENALTIES}, got {chair_penalty!r}"
            )
        if chair_client is None and (chair_weight != 0.0 or recall_weight != 0.0):
            raise ValueError("chair_weight / recall_weight need a chair_client")
        if chair_client is not None and not callable(getattr(chair_client, "score", None)):
            raise TypeError("chair_client must have a score(items) method")
        self.cider = cider
        self.chair_client = chair_client
        self.chair_weight = float(chair_weight)
        self.recall_weight = float(recall_weight)
        self.chair_penalty = chair_penalty

    def __call__(
        self,
        captions: Sequence[str],
        image_ids: Sequence[int],
        references: Sequence[Sequence[str]],
    ) -> CaptionRewardResult:
        batch = len(captions)
        if len(image_ids) != batch or len(references) != batch:
            raise ValueError(
                f"captions ({batch}), image_ids ({len(image_ids)}) and references "
                f"({len(references)}) must have the same length"
            )
        cider = self.cider.score_batch(captions, references)
        chair_i = np.full(batch, np.nan)
        chair_s = np.full(batch, np.nan)
        recall = np.full(batch, np.nan)
        hallucinated = np.full(batch, np.nan)
        chair_ok = np.zeros(batch, dtype=bool)
        chair_fallback = np.zeros(batch, dtype=bool)
        if self.chair_client is not None and batch:
            items = [
                {"image_id": _plain(image_id), "caption": caption}
                for image_id, caption in zip(image_ids, captions)
            ]
            entries = self.chair_client.score(items)  # exactly one call per reward batch
            if len(entries) != batch:
                raise ValueError(f"CHAIR scorer returned {len(entries)} entries for {batch} items")
            for i, entry in enumerate(entries):
                if entry is None:
                    chair_fallback[i] = True
                    continue
                if not isinstance(entry, Mapping) or "error" in entry:
                    continue
                try:
                    parts = (
                        _metric(entry, "CHAIRi"),
                        _metric(entry, "CHAIRs"),
                        _metric(entry, "Recall"),
                    )
                    count = (
                        _metric(entry, "hallucinated") if self.chair_penalty == "count" else None
                    )
                except (KeyError, TypeError, ValueError):
                    continue  # a malformed entry is an unavailable one, counted in the metrics
                if count is None:  # fraction mode: the count is only logged, where present
                    count = _optional_count(entry)
                chair_i[i], chair_s[i], recall[i] = parts
                hallucinated[i] = count
                chair_ok[i] = True
        scores = cider.copy()
        penalty = hallucinated if self.chair_penalty == "count" else chair_i
        bonus = self.recall_weight * recall - self.chair_weight * penalty
        scores[chair_ok] += bonus[chair_ok]
        return CaptionRewardResult(
            scores=scores,
            cider=cider,
            chair_i=chair_i,
            chair_s=chair_s,
            recall=recall,
            chair_ok=chair_ok,
            chair_requested=self.chair_client is not None,
            hallucinated=hallucinated if self.chair_client is not None else None,
            chair_fallback=chair_fallback if self.chair_client is not None else None,
        )
