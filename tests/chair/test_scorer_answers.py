"""One caption's CHAIR entry and a corpus's metrics, every key, worked out by hand from CHAIR's
definitions (Rohrbach et al. 2018): CHAIR_s = hallucinating captions / captions, CHAIR_i =
hallucinated mentions / mentions, recall = ground-truth objects named / ground-truth objects."""

from __future__ import annotations

import pytest

from chair_server.scorer import ChairScorer, CorpusMetrics


@pytest.fixture()
def scorer() -> ChairScorer:
    scorer = ChairScorer.from_ground_truth({"1": ["dog", "person"], "2": []})
    scorer.max_caption_chars = 40
    return scorer


def test_a_caption_with_one_object_of_two_wrong(scorer):
    assert scorer.score_one(1, "A dog and a cat.") == {
        "image_id": 1,
        "caption": "A dog and a cat.",
        "mentioned": ["dog", "cat"],
        "hallucinated": [["cat", "cat"]],
        "mention_spans": [[2, 5], [12, 15]],
        "hallucinated_spans": [[12, 15]],
        "no_mentions": False,
        "metrics": {
            "CHAIRs": 1, "CHAIRi": 0.5, "Recall": 0.5, "mentions": 2, "hallucinated": 1,
            "ground_truth": 2, "recalled": 1, "words": 5,
        },
    }  # fmt: skip


def test_an_image_without_objects_recalls_nothing(scorer):
    entry = scorer.score_one("2", "Nothing here.")
    assert entry["no_mentions"] is True and entry["image_id"] == "2"
    assert entry["metrics"] == {
        "CHAIRs": 0, "CHAIRi": 0.0, "Recall": 0.0, "mentions": 0, "hallucinated": 0,
        "ground_truth": 0, "recalled": 0, "words": 2,
    }  # fmt: skip


def test_errors_name_the_image_or_the_limit(scorer):
    assert scorer.score_one(3, "A dog.") == {
        "image_id": 3, "caption": "A dog.", "error": "unknown image_id 3",
    }  # fmt: skip
    assert scorer.score_one(1, "x" * 40)["metrics"]["words"] == 1  # the limit itself passes
    assert scorer.score_one(1, "x" * 41) == {
        "image_id": 1, "error": "caption has 41 characters, more than max_caption_chars=40",
    }  # fmt: skip
    assert scorer.knows(1) and scorer.knows("1") and not scorer.knows(3)
    assert scorer.source == "mapping" and scorer.loaded_from_cache is False


def test_corpus_metrics_count_captions_mentions_and_objects(scorer):
    metrics = CorpusMetrics()
    for image, caption in [(1, "A dog and a cat."), (2, "Nothing here."), (1, "A man.")]:
        metrics.add(scorer.score_one(image, caption))
    metrics.add(scorer.score_one(3, "A dog."))  # an error: counted, not scored
    assert metrics.result() == {
        "CHAIRs": pytest.approx(1 / 3), "CHAIRi": pytest.approx(1 / 3), "Recall": 0.5,
        "captions": 3, "errors": 1, "mentions": 3, "hallucinated_mentions": 1,
        "hallucinated_captions": 1, "no_mention_captions": 1, "mean_length": 3.0,
    }  # fmt: skip
