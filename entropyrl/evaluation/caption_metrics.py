"""The caption metrics of a hallucination table, per image, so each gets a bootstrap interval.

Every metric is kept as raw per-image values and a statistic over them (`entropyrl.evaluation.
stats`), because most are ratios of sums over the whole set:

| metric | per image | statistic |
|---|---|---|
| CHAIR_s | 1 if the caption names an object not in the image | mean |
| CHAIR_i | (hallucinated mentions, mentions) | sum / sum |
| recall | (ground-truth objects named, ground-truth objects) | sum / sum |
| length | words of the caption | mean |
| CIDEr-D | the caption's CIDEr-D against its references | mean |
| BLEU-4 | (test length, closest reference length, guessed and correct n-grams, n = 1..4) | corpus BLEU |

CHAIR comes from the project's scorer (`chair_server.scorer.ChairScorer`: the ground truth is
COCO's instances and captions of train + val 2014, as the original CHAIR code builds it), so
CHAIR_i here is the corpus ratio of the original code, not a mean of per-caption ratios.

CIDEr-D and BLEU-4 are computed as pycocoevalcap computes them, on captions and references
tokenised by `entropyrl.rewards.text.normalize_caption` (a pure-Python stand-in for the PTB
tokenizer, which needs Java): CIDEr-D's document frequencies come from the references of the
evaluated images, as pycocoevalcap's `Cider` does, and BLEU-4's counts from pycocoevalcap's own
`cook_refs` / `cook_test` (closest reference length). The tokenisation differs from PTB's on rare
punctuation and on non-ASCII text, so figures compare across models of this project and sit close
to, not exactly on, the COCO server's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from entropyrl.evaluation.stats import mean, ratio_of_sums
from entropyrl.rewards.text import normalize_caption

__all__ = [
    "CAPTION_METRICS",
    "HALLUCINATED_SPANS_KEY",
    "TOKEN_METRICS",
    "MetricSpec",
    "bleu4",
    "bleu_counts",
    "caption_values",
    "chair_values",
    "cider_scores",
    "hallucinated_token_counts",
]

_SMALL, _TINY = 1e-9, 1e-15  # pycocoevalcap's BleuScorer guards, kept for parity


def bleu4(values: np.ndarray) -> np.ndarray:
    """Corpus BLEU-4 from per-image counts: `[B, n, 10] -> [B]`.

    Columns: test length, reference length, guessed n-grams (n = 1..4), correct n-grams (1..4).
    As pycocoevalcap: the geometric mean of (correct + 1e-15) / (guessed + 1e-9) over n = 1..4,
    times the brevity penalty exp(1 - ref/test) when the captions are shorter than the references.
    """
    if values.ndim != 3 or values.shape[2] != 10:
        raise ValueError(f"bleu4 takes 10 counts per image ([B, n, 10]), got {values.shape}")
    sums = values.sum(axis=1)
    test_length, reference_length = sums[:, 0], sums[:, 1]
    guessed, correct = sums[:, 2:6], sums[:, 6:10]
    precision = np.prod((correct + _TINY) / (guessed + _SMALL), axis=1) ** 0.25
    ratio = (test_length + _TINY) / (reference_length + _SMALL)
    with np.errstate(divide="ignore", over="ignore"):
        penalty = np.where(ratio < 1, np.exp(1 - 1 / ratio), 1.0)
    return precision * penalty


def bleu_counts(caption: str, references: Sequence[str]) -> list[float]:
    """The 10 BLEU-4 counts of one caption (see `bleu4`), counted by pycocoevalcap."""
    from pycocoevalcap.bleu.bleu_scorer import cook_refs, cook_test

    cooked = cook_test(
        normalize_caption(caption),
        cook_refs([normalize_caption(ref) for ref in references], n=4),
        eff="closest",
        n=4,
    )
    return [cooked["testlen"], cooked["reflen"], *cooked["guess"], *cooked["correct"]]


def cider_scores(captions: Sequence[str], references: Sequence[Sequence[str]]) -> np.ndarray:
    """CIDEr-D of each caption, document frequencies from exactly these images' references (as
    one pycocoevalcap `Cider().compute_score` call over the same images)."""
    from entropyrl.rewards.cider import CiderD

    if len(captions) != len(references):
        raise ValueError(f"{len(captions)} captions but {len(references)} reference lists")
    cider = CiderD.from_references(dict(enumerate(references)))
    return np.asarray(cider.score_batch(list(captions), list(references)), dtype=np.float64)


def chair_values(entry: Mapping[str, Any]) -> dict[str, Any]:
    """CHAIR's per-image values from one `ChairScorer.score_one` entry (which must be scored)."""
    if "error" in entry:
        raise ValueError(
            f"image {entry.get('image_id')!r}: CHAIR could not score it: {entry['error']}"
        )
    metrics = entry["metrics"]
    return {
        "CHAIR_s": float(metrics["CHAIRs"]),
        "CHAIR_i": (float(metrics["hallucinated"]), float(metrics["mentions"])),
        "recall": (float(metrics["recalled"]), float(metrics["ground_truth"])),
        "length": float(metrics["words"]),
    }


@dataclass(frozen=True)
class MetricSpec:
    """How a metric is summarised: its statistic, the scale it is shown at, and whether lower is
    better (the table's arrows)."""

    statistic: Callable[[np.ndarray], np.ndarray]
    scale: float
    lower_is_better: bool
    unit: str


# Shown x100 as papers show them: CHAIR_s, CHAIR_i and recall in percent, CIDEr-D and BLEU-4 as
# on the COCO leaderboard (a raw CIDEr-D of 1.1 is 110).
CAPTION_METRICS: dict[str, MetricSpec] = {
    "CHAIR_s": MetricSpec(mean, 100.0, True, "%"),
    "CHAIR_i": MetricSpec(ratio_of_sums, 100.0, True, "%"),
    "recall": MetricSpec(ratio_of_sums, 100.0, False, "%"),
    "length": MetricSpec(mean, 1.0, False, "words"),
    "CIDEr-D": MetricSpec(mean, 100.0, False, ""),
    "BLEU-4": MetricSpec(bleu4, 100.0, False, ""),
}


# The share of a caption's tokens that belong to hallucinated mentions: what the token-level
# mechanisms (algorithm.token_penalty, algorithm.token_clip) act on. Reported beside CHAIR_i
# when the caller gives the model's tokenizer offsets (`caption_values(token_offsets=...)`).
TOKEN_METRICS: dict[str, MetricSpec] = {
    "hallucinated_tokens": MetricSpec(ratio_of_sums, 100.0, True, "%"),
}
# The CHAIR entry's key: character spans [start, end) of its hallucinated mentions.
HALLUCINATED_SPANS_KEY = "hallucinated_spans"


def hallucinated_token_counts(
    spans: Sequence[Sequence[int]], offsets: Sequence[Sequence[int]]
) -> tuple[float, float]:
    """(tokens overlapping a hallucinated span, tokens) of one caption.

    A token (its character offsets [start, end) in the caption, as a tokenizer's
    ``return_offsets_mapping`` gives them) counts when it shares a character with a span, so a
    word split into several tokens counts each; empty-offset tokens (special) are left out.
    """
    tokens = [(int(a), int(b)) for a, b in offsets if int(b) > int(a)]
    marked = sum(
        1 for a, b in tokens if any(a < int(end) and int(start) < b for start, end in spans)
    )
    return float(marked), float(len(tokens))


def caption_values(
    chair_entries: Sequence[Mapping[str, Any]],
    references: Sequence[Sequence[str]],
    token_offsets: Callable[[str], Sequence[Sequence[int]]] | None = None,
) -> dict[str, dict[int, Any]]:
    """`{metric: {image_id: per-image value}}` for the metrics of `CAPTION_METRICS`.

    `chair_entries[i]` is `ChairScorer.score_one(image_id, caption)` of image i (its caption is
    taken from the entry), `references[i]` that image's reference captions. With
    `token_offsets` (caption -> each token's character offsets under the model's tokenizer)
    the `TOKEN_METRICS` are added: each entry must then carry its hallucinated mentions'
    character spans (`HALLUCINATED_SPANS_KEY`).
    """
    if len(chair_entries) != len(references):
        raise ValueError(f"{len(chair_entries)} captions but {len(references)} reference lists")
    ids = [int(entry["image_id"]) for entry in chair_entries]
    if len(set(ids)) != len(ids):
        raise ValueError("an image is scored twice: one caption per image")
    captions = [str(entry["caption"]) for entry in chair_entries]
    values: dict[str, dict[int, Any]] = {name: {} for name in CAPTION_METRICS}
    for image_id, entry in zip(ids, chair_entries):
        for name, value in chair_values(entry).items():
            values[name][image_id] = value
    for image_id, score in zip(ids, cider_scores(captions, references)):
        values["CIDEr-D"][image_id] = float(score)
    for image_id, caption, refs in zip(ids, captions, references):
        values["BLEU-4"][image_id] = bleu_counts(caption, refs)
    if token_offsets is not None:
        values["hallucinated_tokens"] = {}
        for image_id, caption, entry in zip(ids, captions, chair_entries):
            if HALLUCINATED_SPANS_KEY not in entry:
                raise ValueError(
                    f"image {image_id}: the CHAIR entry has no {HALLUCINATED_SPANS_KEY!r}: "
                    "a CHAIR scorer with mention spans is needed for the token share"
                )
            values["hallucinated_tokens"][image_id] = hallucinated_token_counts(
                entry[HALLUCINATED_SPANS_KEY], token_offsets(caption)
            )
    return values


def finite_or_none(value: float) -> float | None:
    """A JSON-safe number: None for NaN and infinities."""
    return value if math.isfinite(value) else None
