"""ChairScorer formulas on hand-computed cases, and ground truth from COCO files and JSON."""

from __future__ import annotations

import json
import os

import pytest

from chair_server import ChairScorer
from chair_server import ground_truth as gt


def test_ground_truth_from_coco(coco_dir, tmp_path, expected_gt) -> None:
    scorer = ChairScorer.from_coco(coco_dir, cache_dir=tmp_path / "cache")
    assert scorer.ground_truth() == expected_gt
    path = tmp_path / "saved.json"
    scorer.save_ground_truth(path)
    assert json.loads(path.read_text()) == {str(k): v for k, v in expected_gt.items()}
    assert ChairScorer.from_ground_truth(path).ground_truth() == expected_gt


def test_coco_subsets(tmp_path, write_coco_files) -> None:
    only_val_instances = write_coco_files(tmp_path / "a", splits=("val",), kinds=("instances",))
    gt_a = ChairScorer.from_coco(only_val_instances, use_cache=False).ground_truth()
    assert gt_a[1001] == ["dining table", "dog", "person"]  # no "cup" without the references
    assert 2001 not in gt_a
    only_captions = write_coco_files(tmp_path / "b", kinds=("captions",))
    gt_b = ChairScorer.from_coco(only_captions, use_cache=False).ground_truth()
    assert gt_b[2002] == ["baseball bat", "person"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"instances_train2014\.json"):
        ChairScorer.from_coco(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ChairScorer.from_coco(tmp_path / "missing")


def test_cache_used_and_invalidated(coco_dir, tmp_path, monkeypatch) -> None:
    cache = tmp_path / "cache"
    first = ChairScorer.from_coco(coco_dir, cache_dir=cache)
    assert not first.loaded_from_cache and len(list(cache.iterdir())) == 1

    def no_parse(*args, **kwargs):
        raise AssertionError("annotation files parsed although the cache is valid")

    monkeypatch.setattr(gt, "build_from_coco", no_parse)
    second = ChairScorer.from_coco(coco_dir, cache_dir=cache)
    assert second.loaded_from_cache and second.ground_truth() == first.ground_truth()
    monkeypatch.undo()

    # edit an annotation file (size and mtime change): the cache must be rebuilt
    path = coco_dir / "instances_val2014.json"
    data = json.loads(path.read_text())
    data["annotations"].append(
        {"id": 99, "image_id": 1004, "category_id": 85, "bbox": [0, 0, 1, 1]}
    )
    path.write_text(json.dumps(data))
    os.utime(path, ns=(10**18, 10**18))
    third = ChairScorer.from_coco(coco_dir, cache_dir=cache)
    assert not third.loaded_from_cache
    assert third.ground_truth()[1004] == ["clock"]
    assert len(list(cache.iterdir())) == 1  # the stale cache of this folder is gone


def test_ground_truth_mapping_validation() -> None:
    scorer = ChairScorer.from_ground_truth({"7": ["man", "Dining Table"], 8: []})
    assert scorer.ground_truth() == {7: ["dining table", "person"], 8: []}
    with pytest.raises(ValueError, match="unicorn"):
        ChairScorer.from_ground_truth({"1": ["unicorn"]})
    with pytest.raises(ValueError, match="list of category names"):
        ChairScorer.from_ground_truth({"1": "person"})


def test_per_caption_metrics(gt_file) -> None:
    scorer = ChairScorer.from_ground_truth(gt_file)
    # GT 1001 = {cup, dining table, dog, person}; mentions: man, table, dog, cat, cat, cup
    entry = scorer.score_one(
        1001, "A man sits at a table with his dog and a cat. The cat drinks from a cup."
    )
    assert entry["mentioned"] == ["person", "dining table", "dog", "cat", "cat", "cup"]
    assert entry["hallucinated"] == [["cat", "cat"], ["cat", "cat"]]
    assert entry["metrics"]["CHAIRs"] == 1
    assert entry["metrics"]["CHAIRi"] == pytest.approx(2 / 6)
    assert entry["metrics"]["Recall"] == pytest.approx(4 / 4)
    assert entry["no_mentions"] is False
    # a caption without objects: CHAIR 0 but flagged, recall 0
    empty = scorer.score_one("1001", "A nice picture.")
    assert empty["no_mentions"] is True
    assert (empty["metrics"]["CHAIRs"], empty["metrics"]["CHAIRi"], empty["metrics"]["Recall"]) == (
        0,
        0.0,
        0.0,
    )


def test_corpus_metrics_are_micro_averages(gt_file) -> None:
    scorer = ChairScorer.from_ground_truth(gt_file)
    items = [
        # 1002 GT {sink, toilet}: toilet seat -> toilet; sink; 2 mentions, 0 hallucinated; recall 2/2
        {"image_id": 1002, "caption": "A toilet seat and a sink."},
        # 1003 GT {cow, elephant, person}: elephant ok, giraffe hallucinated; recall 1/3
        {"image_id": 1003, "caption": "A baby elephant next to a giraffe."},
        # 2001 GT {train}: train ok, person (passenger) hallucinated x2, 3 mentions; recall 1/1
        {"image_id": 2001, "caption": "Passengers wait as a train arrives; a passenger waves."},
        # unknown image: reported with an error, left out of the corpus metrics
        {"image_id": 424242, "caption": "A dog."},
        # 1004 GT {}: no mentions; recall over an empty set adds 0/0
        {"image_id": 1004, "caption": "A wall."},
    ]
    result = scorer.score_corpus(items)
    sentences, overall = result["sentences"], result["overall_metrics"]
    assert scorer.score(items) == sentences
    assert [s.get("error") for s in sentences] == [
        None,
        None,
        None,
        "unknown image_id 424242",
        None,
    ]
    assert [s["metrics"]["CHAIRs"] for s in sentences if "metrics" in s] == [0, 1, 1, 0]
    assert sentences[2]["hallucinated"] == [["passenger", "person"], ["passenger", "person"]]
    assert overall["captions"] == 4 and overall["errors"] == 1
    assert overall["CHAIRs"] == pytest.approx(2 / 4)
    assert overall["CHAIRi"] == pytest.approx((0 + 1 + 2 + 0) / (2 + 2 + 3 + 0))
    assert overall["Recall"] == pytest.approx((2 + 1 + 1 + 0) / (2 + 3 + 1 + 0))
    assert overall["no_mention_captions"] == 1


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([{"caption": "x"}], r"captions\[0\].image_id is missing"),
        ([{"image_id": 1}], r"captions\[0\].caption is missing"),
        ([{"image_id": 1, "caption": 3}], r"captions\[0\].caption must be a string"),
        (["x"], r"captions\[0\] must be an object"),
    ],
)
def test_score_rejects_bad_items(gt_file, items, message) -> None:
    with pytest.raises(ValueError, match=message):
        ChairScorer.from_ground_truth(gt_file).score(items)


def test_default_cache_dir_from_environment(coco_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CHAIR_CACHE_DIR", str(tmp_path / "env-cache"))
    ChairScorer.from_coco(coco_dir)
    assert ChairScorer.from_coco(coco_dir).loaded_from_cache
    assert len(list((tmp_path / "env-cache").glob("gt-*.json"))) == 1


def test_recall_counts_each_ground_truth_object_once() -> None:
    """A caption that names the dog three times has recalled one of its two objects, not three."""
    scorer = ChairScorer.from_ground_truth({"7": ["dog", "cat"]})
    row = scorer.score_one(7, "a dog next to a dog and another dog")
    assert row["metrics"]["mentions"] == 3
    assert row["metrics"]["Recall"] == pytest.approx(0.5)
