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

``CaptionReward`` is the reward as a `Scorer` (`entropyrl.rewards.scorer`): ``score_batch``
takes the rows' ground truths as ``entropyrl prepare coco`` writes them (``caption_ground_truth``)
and returns a ``CaptionRewardResult``, the batch's arrays that is also the sequence of the
per-caption `Score` values (``CAPTION_FIELDS``: what verl stores per sample).

Where CHAIR found its mentions (``chair_server.contract``: each hallucinated mention's
character span in the caption) the result keeps those spans, and with the model's tokenizer
(``CaptionReward(tokenizer=...)``) each caption's ``hallucinated_token_positions``: the
response token indices (0 = first response token) that overlap a hallucinated mention
(``entropyrl.rewards.token_spans``), ``[]`` for a clean caption, None where CHAIR did not score
it or answered without spans. verl's reward managers pass the compute_score function the
decoded response string only (``tokenizer.decode(valid_response_ids,
skip_special_tokens=True)``), not the ids: the positions are then those of the string's own
tokenisation, which is the response's for every response the tokenizer would produce;
``response_ids`` (the local runner has them) makes them exact for any sampled tokenisation.
``CaptionReward.fields`` is ``CAPTION_FIELDS`` plus ``hallucinated_token_positions`` when a
tokenizer is set: the keys verl's dict should carry.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from chair_server import contract
from entropyrl.rewards.cider import CiderD
from entropyrl.rewards.scorer import (
    ExtraInfos,
    GroundTruths,
    Score,
    Solutions,
    batch_size,
    same_length,
)
from entropyrl.rewards.text import normalize_caption
from entropyrl.rewards.token_spans import caption_positions

__all__ = [
    "CAPTION_FIELDS",
    "SPANS_KEY",
    "TOKEN_POSITIONS_KEY",
    "CaptionReward",
    "CaptionRewardResult",
    "ChairScorerLike",
    "caption_ground_truth",
]

# A caption's Score as verl's reward dict: the score, then its details in this order.
CAPTION_FIELDS = (
    "score",
    "cider",
    "chair_i",
    "chair_s",
    "recall",
    "hallucinated",
    "words",
    "chair_ok",
    "chair_fallback",
    "hallucinated_spans",
)
# the response token indices of each caption's hallucinated mentions (entropyrl.verl.hooks
# reads the same key from the reward's extra info)
TOKEN_POSITIONS_KEY = "hallucinated_token_positions"
# the [start, end) character spans of each caption's hallucinated mentions, as a JSON string
# (None: CHAIR did not score it, or answered without spans): under verl the reward sees only
# the decoded string, so the entropy-aware trainer maps them to the response's own token ids
# (entropyrl.verl.hooks.token_positions_from_spans); a string, which verl's means leave out
SPANS_KEY = "hallucinated_spans"


@runtime_checkable
class ChairScorerLike(Protocol):
    """Anything that scores captions like ``entropyrl.rewards.chair_client.ChairClient``.

    ``score(items)`` receives ``[{"image_id": int, "caption": str}, ...]`` and returns one entry
    per item: the CHAIR server's per-sentence dict (with ``"metrics": {"CHAIRs", "CHAIRi",
    "Recall", ...}``), a dict with ``"error"`` for an item it could not score, or None.
    """

    def score(self, items: list[dict[str, Any]]) -> list[dict[str, Any] | None]: ...


@dataclass(frozen=True)
class CaptionRewardResult(Sequence[Score]):
    """Per-caption reward and its parts; every array has shape ``[B]``.

    As a sequence it holds each caption's `Score`: the details ``cider``, ``chair_i``,
    ``chair_s``, ``recall`` (floats, NaN where CHAIR is missing), ``words`` (the caption's
    length in words), ``chair_ok`` and
    ``chair_fallback`` (bools; verl's trainer counts the fallbacks in ``chair/fallback_samples``),
    and a reason where CHAIR did not count.

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
    # caption length in words (CIDEr-D's tokens): shorter captions lower CHAIR by themselves
    words: np.ndarray | None = None
    # per caption, the [start, end) character spans of its hallucinated mentions (None: CHAIR
    # did not score it, or answered without spans); None when CHAIR was not requested
    hallucinated_spans: list[list[tuple[int, int]] | None] | None = None
    # per caption, the response token indices overlapping those spans; None without a tokenizer
    hallucinated_positions: list[list[int] | None] | None = None

    def __len__(self) -> int:
        return len(self.scores)

    def __getitem__(self, i: int) -> Score:  # type: ignore[override]  # rows, not slices
        fallback = bool(self.chair_fallback[i]) if self.chair_fallback is not None else False
        ok = bool(self.chair_ok[i])
        if ok or not self.chair_requested:
            reason = ""
        elif fallback:
            reason = "CIDEr-D only: the CHAIR service gave no answer"
        else:
            reason = "CIDEr-D only: CHAIR could not score this caption"
        details = {
            "cider": float(self.cider[i]),
            "chair_i": float(self.chair_i[i]),
            "chair_s": float(self.chair_s[i]),
            "recall": float(self.recall[i]),
            "hallucinated": (
                float(self.hallucinated[i]) if self.hallucinated is not None else float("nan")
            ),
            "words": float(self.words[i]) if self.words is not None else float("nan"),
            "chair_ok": ok,
            "chair_fallback": fallback,
            SPANS_KEY: self._spans_json(i),
            TOKEN_POSITIONS_KEY: (
                None if self.hallucinated_positions is None else self.hallucinated_positions[i]
            ),
        }
        return Score(float(self.scores[i]), reason, details)

    def __iter__(self) -> Iterator[Score]:
        return (self[i] for i in range(len(self)))

    def _spans_json(self, i: int) -> str | None:
        found = None if self.hallucinated_spans is None else self.hallucinated_spans[i]
        return None if found is None else json.dumps([[int(a), int(b)] for a, b in found])

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


def caption_ground_truth(ground_truth: Any) -> tuple[int, list[str]]:
    """(image_id, references) from a COCO row's `reward_model.ground_truth`.

    Accepts the mapping written by `entropyrl prepare coco` (`image_id` and `references`, or
    `captions`) or the same mapping as a JSON string.
    """
    if isinstance(ground_truth, str | bytes):
        try:
            ground_truth = json.loads(ground_truth)
        except json.JSONDecodeError as error:
            raise ValueError(f"ground_truth is not JSON: {error}") from error
    if not isinstance(ground_truth, Mapping):
        raise ValueError(
            f"ground_truth must map image_id and references, got {type(ground_truth).__name__}"
        )
    if "image_id" not in ground_truth:
        raise ValueError("ground_truth has no field 'image_id'")
    references = ground_truth.get("references", ground_truth.get("captions"))
    if references is None:
        raise ValueError("ground_truth has no field 'references'")
    if isinstance(references, str):
        references = [references]
    references = [str(reference) for reference in list(references)]
    if not references:
        raise ValueError("ground_truth field 'references' is empty")
    return int(ground_truth["image_id"]), references


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
        tokenizer: the policy's (fast) tokenizer, to map hallucinated mentions to response token
            positions (see the module docstring); None leaves them out.
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
        tokenizer: Any | None = None,
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
        self.tokenizer = tokenizer

    @property
    def fields(self) -> tuple[str, ...]:
        """The keys of a caption's verl dict: ``CAPTION_FIELDS``, and the token positions when
        a tokenizer can give them."""
        return CAPTION_FIELDS + ((TOKEN_POSITIONS_KEY,) if self.tokenizer is not None else ())

    def __call__(
        self,
        captions: Sequence[str],
        image_ids: Sequence[int],
        references: Sequence[Sequence[str]],
        response_ids: Sequence[Sequence[int]] | None = None,
    ) -> CaptionRewardResult:
        """The batch's rewards. `response_ids` (per caption, the response's token ids, end of
        turn and padding included) make the token positions index those ids; the captions
        must then be their decoding (``skip_special_tokens=True``)."""
        batch = same_length(captions=captions, image_ids=image_ids, references=references)
        if response_ids is not None and len(response_ids) != batch:
            raise ValueError(f"{len(response_ids)} response_ids for {batch} captions")
        cider = self.cider.score_batch(captions, references)
        words = np.array([len(normalize_caption(c).split()) for c in captions], dtype=np.float64)
        chair_i = np.full(batch, np.nan)
        chair_s = np.full(batch, np.nan)
        recall = np.full(batch, np.nan)
        hallucinated = np.full(batch, np.nan)
        chair_ok = np.zeros(batch, dtype=bool)
        chair_fallback = np.zeros(batch, dtype=bool)
        spans: list[list[tuple[int, int]] | None] = [None] * batch
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
                try:
                    spans[i] = contract.spans(entry)
                except ValueError:
                    spans[i] = None  # malformed spans: no token credit for this caption
        scores = cider.copy()
        penalty = hallucinated if self.chair_penalty == "count" else chair_i
        bonus = self.recall_weight * recall - self.chair_weight * penalty
        scores[chair_ok] += bonus[chair_ok]
        positions = None
        if self.tokenizer is not None and self.chair_client is not None:
            positions = [
                None
                if found is None
                else caption_positions(
                    self.tokenizer,
                    found,
                    captions[i],
                    None if response_ids is None else response_ids[i],
                )
                for i, found in enumerate(spans)
            ]
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
            words=words,
            hallucinated_spans=spans if self.chair_client is not None else None,
            hallucinated_positions=positions,
        )

    def score_batch(
        self, solutions: Solutions, ground_truths: GroundTruths, extra_infos: ExtraInfos
    ) -> CaptionRewardResult:
        """The batch's captions against their rows' ground truths (``caption_ground_truth``'s
        forms; a parsed ``(image_id, references)`` pair too), with one CHAIR call; the extra
        info is not read. ValueError for a malformed ground truth."""
        batch_size(solutions, ground_truths, extra_infos)
        rows = [
            truth if isinstance(truth, tuple) else caption_ground_truth(truth)
            for truth in ground_truths
        ]
        return self(solutions, [row[0] for row in rows], [row[1] for row in rows])
