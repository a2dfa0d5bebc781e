"""ChairScorer: CHAIR_s, CHAIR_i and recall of captions against per-image ground-truth objects.

Formulas (Rohrbach et al., EMNLP 2018): a mention is hallucinated when its category is not in
the image's ground truth; CHAIR_i = hallucinated mentions / mentions (micro-averaged over the
scored captions); CHAIR_s = captions with a hallucinated mention / captions; Recall = ground
truth categories mentioned / ground truth categories (micro-averaged). Values are fractions in
[0, 1], papers print them times 100; a corpus value over nothing (no caption scored) is None.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from chair_server import contract
from chair_server import ground_truth as gt
from chair_server.mentions import MentionExtractor


class ChairScorer:
    """Scores captions; ground truth and vocabulary tables are built once and reused."""

    def __init__(self, objects: gt.GroundTruth, extractor: MentionExtractor | None = None) -> None:
        self._objects = dict(objects)
        self._extractor = extractor or MentionExtractor()
        self.source = "mapping"
        self.loaded_from_cache = False
        # longest caption scored (characters); longer ones get an error entry. None: no limit
        self.max_caption_chars: int | None = None

    @classmethod
    def from_coco(
        cls,
        folder: str | os.PathLike[str],
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        use_cache: bool = True,
    ) -> ChairScorer:
        """Ground truth from COCO 2014 annotation files in ``folder``.

        Reads whichever of ``instances_{train,val}2014.json`` and ``captions_{train,val}2014.json``
        exist (at least one, else FileNotFoundError) and merges them: instance categories ∪
        objects in the reference captions. The result is cached under ``cache_dir`` (default:
        ``$CHAIR_CACHE_DIR`` or ``~/.cache/chair_server``) keyed by the files' sizes and mtimes
        and the vocabulary, so the second start skips parsing the captions.
        """
        extractor = MentionExtractor()
        objects, cached = gt.load_coco(folder, extractor, cache_dir=cache_dir, use_cache=use_cache)
        scorer = cls(objects, extractor)
        scorer.source = f"coco:{Path(folder)}"
        scorer.loaded_from_cache = cached
        return scorer

    @classmethod
    def from_ground_truth(cls, path_or_mapping: str | os.PathLike[str] | Mapping) -> ChairScorer:
        """Ground truth from ``{"<image_id>": ["person", ...]}`` (a JSON file path or a mapping).

        Names may be categories or synonyms ("man" counts as person); unknown names raise
        ValueError naming the image.
        """
        extractor = MentionExtractor()
        scorer = cls(gt.load_mapping(path_or_mapping, extractor), extractor)
        if not isinstance(path_or_mapping, Mapping):
            scorer.source = f"ground-truth:{Path(path_or_mapping)}"
        return scorer

    # ground truth -----------------------------------------------------------------------
    def ground_truth(self) -> dict[gt.ImageId, list[str]]:
        """``{image_id: sorted category names}`` for every known image."""
        return {k: sorted(v) for k, v in self._objects.items()}

    def save_ground_truth(self, path: str | os.PathLike[str]) -> None:
        """Write ``{"<image_id>": [...]}``, the file ``from_ground_truth`` reads."""
        Path(path).write_text(json.dumps(gt.to_json(self._objects), indent=0), encoding="utf-8")

    @property
    def num_images(self) -> int:
        return len(self._objects)

    def knows(self, image_id: object) -> bool:
        try:
            return gt.normalize_image_id(image_id) in self._objects
        except ValueError:
            return False

    # parsing and scoring ----------------------------------------------------------------
    def mentions(self, caption: str) -> list[tuple[str, str]]:
        """``[(word, category), ...]`` of a caption in order (see MentionExtractor.mentions)."""
        return self._extractor.mentions(caption)

    def score_one(self, image_id: object, caption: str) -> dict[str, Any]:
        """One caption's entry: mentions, hallucinations and per-caption metrics.

        ``mentioned``: the category of every mention in caption order (repeats included, so its
        length is ``metrics.mentions``); ``hallucinated``: ``[word, category]`` of each mention
        whose category is not in the image's ground truth. ``mention_spans`` and
        ``hallucinated_spans``: ``[start, end]`` of each of those mentions in ``caption``
        (``chair_server.contract``).

        Unknown image ids give ``{"image_id", "caption", "error"}`` instead of metrics; a
        caption over ``max_caption_chars`` gives ``{"image_id", "error"}`` (its text is not
        echoed back).
        """
        limit = self.max_caption_chars
        if limit is not None and len(caption) > limit:
            return {
                "image_id": image_id,
                "error": f"caption has {len(caption)} characters, more than "
                f"max_caption_chars={limit}",
            }
        try:
            key = image_id if type(image_id) is int else gt.normalize_image_id(image_id)
        except ValueError as exc:
            return {"image_id": image_id, "caption": caption, "error": str(exc)}
        truth = self._objects.get(key)
        if truth is None:
            return {
                "image_id": image_id,
                "caption": caption,
                "error": f"unknown image_id {image_id!r}",
            }
        found, length = self._extractor.locate(caption)
        mentioned = [c for _, c, _, _ in found]
        hallucinated = [[w, c] for w, c, _, _ in found if c not in truth]
        recalled = len(truth.intersection(mentioned))
        n = len(found)
        return {
            "image_id": image_id,
            "caption": caption,
            "mentioned": mentioned,
            "hallucinated": hallucinated,
            contract.MENTION_SPANS_KEY: [[a, b] for _, _, a, b in found],
            contract.HALLUCINATED_SPANS_KEY: [[a, b] for _, c, a, b in found if c not in truth],
            "no_mentions": n == 0,
            "metrics": {
                "CHAIRs": 1 if hallucinated else 0,
                "CHAIRi": len(hallucinated) / n if n else 0.0,
                "Recall": recalled / len(truth) if truth else 0.0,
                "mentions": n,
                "hallucinated": len(hallucinated),
                "ground_truth": len(truth),
                "recalled": recalled,
                "words": length,
            },
        }

    def score(self, items: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Score ``[{"image_id", "caption"}, ...]``: one entry per item, in order (see
        ``score_one``). The same call, and the same answer, as the HTTP client's
        (``entropyrl.rewards.chair_client.ChairClient.score``): the reward takes either.
        Raises ValueError naming ``captions[i].field`` for a malformed item
        (``chair_server.contract``, the service's own rules)."""
        return list(self.iter_score(items))

    def score_corpus(self, items: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        """``{"sentences": score(items), "overall_metrics": {...}}``, the service's answer:
        overall CHAIRs/CHAIRi/Recall are micro-averages over the captions whose image is
        known, with counts of captions, errors, mentions and captions without any object
        mention (an empty caption has CHAIR 0 and recall 0; it is not "perfect"). A corpus
        ratio with nothing to average over is None (no caption scored: CHAIRs, CHAIRi, Recall
        and mean_length are all None), see ``CorpusMetrics.result``."""
        sentences = self.score(items)
        return {"sentences": sentences, "overall_metrics": overall_metrics(sentences)}

    def iter_score(self, items: Iterable[Mapping[str, Any]]) -> Iterator[dict[str, Any]]:
        """``score``'s sentence entries one at a time (the service streams its answer from
        this, so memory per request does not grow with the size of the answer)."""
        score_one = self.score_one
        for index, item in enumerate(items):
            problem = contract.item_problem(item, f"captions[{index}]")
            if problem is not None:  # the service's own rules (chair_server.contract)
                raise ValueError(problem.message)
            yield score_one(contract.image_id(item["image_id"]), item["caption"])


class CorpusMetrics:
    """Running micro-averaged corpus metrics: ``add`` each entry, then ``result()``."""

    def __init__(self) -> None:
        self.entries = self.captions = self.hallucinated_captions = self.mentions = 0
        self.hallucinated = self.truth = self.recalled = self.empty = self.words = 0

    def add(self, entry: Mapping[str, Any]) -> None:
        """Count one sentence entry (entries with ``error`` only count as errors)."""
        self.entries += 1
        if "error" in entry:
            return
        m = entry["metrics"]
        self.captions += 1
        self.hallucinated_captions += m["CHAIRs"]
        self.mentions += m["mentions"]
        self.hallucinated += m["hallucinated"]
        self.truth += m["ground_truth"]
        self.recalled += m["recalled"]
        self.empty += int(m["mentions"] == 0)
        self.words += m["words"]

    def result(self) -> dict[str, Any]:
        """The corpus metrics; a ratio over nothing is None (JSON null), never 0.

        CHAIRs and mean_length are None when no caption was scored, CHAIRi when the scored
        captions mention no object, Recall when their images have no ground-truth object: a 0
        there would read as a perfect score that nothing measured.
        """
        captions = self.captions
        return {
            "CHAIRs": _ratio(self.hallucinated_captions, captions),
            "CHAIRi": _ratio(self.hallucinated, self.mentions),
            "Recall": _ratio(self.recalled, self.truth),
            "captions": captions,
            "errors": self.entries - captions,
            "mentions": self.mentions,
            "hallucinated_mentions": self.hallucinated,
            "hallucinated_captions": self.hallucinated_captions,
            "no_mention_captions": self.empty,
            "mean_length": _ratio(self.words, captions),
        }


def _ratio(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def overall_metrics(sentences: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Micro-averaged corpus metrics over scored entries (entries with ``error`` are skipped)."""
    metrics = CorpusMetrics()
    for entry in sentences:
        metrics.add(entry)
    return metrics.result()
