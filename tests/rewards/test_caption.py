"""Caption reward: formula, one CHAIR call per batch, fallback when CHAIR is unavailable."""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest

from entropyrl.rewards.caption import CaptionReward, ChairScorerLike
from entropyrl.rewards.cider import CiderD

CORPUS = {
    1: ["a dog runs on the grass", "a brown dog running in a field"],
    2: ["a cat sleeps on a sofa", "a cat lying on a couch"],
    3: ["a man rides a bike", "a person riding a bicycle down the street"],
}
GROUND_TRUTH = {"1": ["dog"], "2": ["cat", "couch"], "3": ["person", "bicycle"]}
CAPTIONS = ["a dog running on the grass", "a cat and a dog on a couch", "a man riding a bike", ""]
IMAGE_IDS = [1, 2, 3, 2]


@pytest.fixture
def cider() -> CiderD:
    return CiderD.from_references(CORPUS)


class RecordingScorer:
    """Hand-written CHAIR entries; counts calls."""

    def __init__(self, entries):
        self.entries = entries
        self.calls = []

    def score(self, items):
        self.calls.append(list(items))
        return self.entries


def entry(chair_i: float, chair_s: float, recall: float) -> dict:
    return {
        "image_id": 0,
        "caption": "",
        "mentioned": [],
        "hallucinated": [],
        "metrics": {"CHAIRi": chair_i, "CHAIRs": chair_s, "Recall": recall, "mentions": 1},
    }


def test_formula_fallback_and_metrics(cider):
    refs = [CORPUS[i] for i in IMAGE_IDS]
    entries = [entry(0.0, 0.0, 1.0), entry(0.5, 1.0, 1.0), None, {"image_id": 2, "error": "x"}]
    scorer = RecordingScorer(entries)
    assert isinstance(scorer, ChairScorerLike)
    reward = CaptionReward(cider, scorer, chair_weight=2.0, recall_weight=0.5)
    result = reward(CAPTIONS, np.array(IMAGE_IDS), refs)
    assert len(scorer.calls) == 1
    assert all(type(item["image_id"]) is int for item in scorer.calls[0])
    assert scorer.calls[0] == [{"image_id": i, "caption": c} for i, c in zip(IMAGE_IDS, CAPTIONS)]
    expected_cider = cider.score_batch(CAPTIONS, refs)
    np.testing.assert_array_equal(result.cider, expected_cider)
    np.testing.assert_array_equal(result.chair_ok, [True, True, False, False])
    np.testing.assert_allclose(
        result.scores,
        expected_cider + np.array([0.5 * 1.0 - 0.0, 0.5 * 1.0 - 2.0 * 0.5, 0.0, 0.0]),
        atol=1e-12,
    )
    assert np.isnan(result.chair_i[2:]).all() and np.isnan(result.recall[2:]).all()
    metrics = result.metrics()
    assert metrics["chair/unavailable_frac"] == 0.5
    assert metrics["chair/chair_i_mean"] == pytest.approx(0.25)
    assert metrics["chair/chair_s_mean"] == pytest.approx(0.5)
    assert metrics["reward/cider_mean"] == pytest.approx(expected_cider.mean())
    assert all(np.isfinite(v) for v in metrics.values())


def test_without_chair_client(cider):
    refs = [CORPUS[i] for i in IMAGE_IDS]
    result = CaptionReward(cider)(CAPTIONS, IMAGE_IDS, refs)
    np.testing.assert_array_equal(result.scores, cider.score_batch(CAPTIONS, refs))
    assert not result.chair_ok.any()
    assert "chair/unavailable_frac" not in result.metrics()
    with pytest.raises(ValueError, match="chair_client"):
        CaptionReward(cider, chair_weight=1.0)


def test_bad_inputs(cider):
    reward = CaptionReward(cider, RecordingScorer([entry(0, 0, 0)]))
    with pytest.raises(ValueError, match="same length"):
        reward(["a"], [1, 2], [["a"]])
    with pytest.raises(ValueError, match="2 entries"):
        CaptionReward(cider, RecordingScorer([entry(0, 0, 0)] * 2))(["a"], [1], [["a"]])
    empty = reward([], [], [])
    assert empty.scores.shape == (0,)


def test_in_process_chair_scorer(cider):
    """chair_server's scorer behind a one-line adapter gives the same parts as its own output."""
    scorer_module = pytest.importorskip("chair_server.scorer")
    chair = scorer_module.ChairScorer.from_ground_truth(GROUND_TRUTH)

    refs = [CORPUS[i] for i in IMAGE_IDS]
    result = CaptionReward(cider, chair, chair_weight=1.0)(CAPTIONS, IMAGE_IDS, refs)
    own = chair.score([{"image_id": i, "caption": c} for i, c in zip(IMAGE_IDS, CAPTIONS)])
    assert result.chair_ok.all()
    for i, sentence in enumerate(own):
        assert result.chair_i[i] == sentence["metrics"]["CHAIRi"]
        assert result.recall[i] == sentence["metrics"]["Recall"]
    assert result.chair_i[1] == pytest.approx(1 / 3)  # dog is not in image 2
    np.testing.assert_allclose(result.scores, result.cider - result.chair_i, atol=1e-12)


def test_real_service_and_closed_port(cider, tmp_path):
    launch = pytest.importorskip("chair_server.launch")
    client_module = pytest.importorskip("entropyrl.rewards.chair_client")
    path = tmp_path / "gt.json"
    path.write_text(json.dumps(GROUND_TRUTH))
    refs = [CORPUS[i] for i in IMAGE_IDS]
    with launch.start_server(ground_truth=path) as server:
        client = client_module.ChairClient(server.url, timeout=10.0, retries=1)
        result = CaptionReward(cider, client, chair_weight=1.0)(CAPTIONS, IMAGE_IDS, refs)
        unknown = CaptionReward(cider, client, chair_weight=1.0)(["a dog"], [999], [CORPUS[1]])
    assert result.chair_ok.all()
    assert result.chair_i[1] == pytest.approx(1 / 3)
    assert result.recall[3] == 0.0  # empty caption: no hallucination, no recall
    assert not unknown.chair_ok[0] and unknown.metrics()["chair/unavailable_frac"] == 1.0
    assert unknown.scores[0] == unknown.cider[0]

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = client_module.ChairClient(f"http://127.0.0.1:{port}", timeout=0.5, retries=0)
    down = CaptionReward(cider, client, chair_weight=1.0)(CAPTIONS, IMAGE_IDS, refs)
    assert not down.chair_ok.any()
    np.testing.assert_array_equal(down.scores, down.cider)
    assert down.metrics()["chair/unavailable_frac"] == 1.0


def test_count_penalty_hand_computed(cider):
    """chair_penalty="count": the penalty is metrics.hallucinated, not the CHAIR_i fraction."""
    refs = [CORPUS[i] for i in IMAGE_IDS]
    two_wrong = entry(0.5, 1.0, 1.0)
    two_wrong["metrics"]["hallucinated"] = 2  # 2 of 4 mentions wrong
    clean = entry(0.0, 0.0, 1.0)
    clean["metrics"]["hallucinated"] = 0
    no_count = entry(0.25, 1.0, 1.0)  # an entry without the count cannot be scored by count
    entries = [clean, two_wrong, no_count, None]
    count = CaptionReward(cider, RecordingScorer(entries), chair_weight=1.5, chair_penalty="count")
    result = count(CAPTIONS, IMAGE_IDS, refs)
    expected_cider = cider.score_batch(CAPTIONS, refs)
    np.testing.assert_array_equal(result.chair_ok, [True, True, False, False])
    np.testing.assert_allclose(
        result.scores, expected_cider - np.array([0.0, 1.5 * 2, 0.0, 0.0]), atol=1e-12
    )
    np.testing.assert_array_equal(result.hallucinated[:2], [0.0, 2.0])
    assert result.metrics()["chair/hallucinated_mean"] == pytest.approx(1.0)
    # the default (fraction) reads CHAIR_i, and an entry without a count is still scored
    fraction = CaptionReward(cider, RecordingScorer(entries), chair_weight=1.5)
    result = fraction(CAPTIONS, IMAGE_IDS, refs)
    np.testing.assert_array_equal(result.chair_ok, [True, True, True, False])
    np.testing.assert_allclose(
        result.scores, expected_cider - np.array([0.0, 1.5 * 0.5, 1.5 * 0.25, 0.0]), atol=1e-12
    )
    assert "chair/hallucinated_mean" not in result.metrics()  # a count is missing
    with pytest.raises(ValueError, match="chair_penalty"):
        CaptionReward(cider, RecordingScorer(entries), chair_penalty="ratio")


def test_count_penalty_with_chair_scorer(cider):
    """In-process CHAIR: 'a cat and a dog on a couch' on image 2 (cat, couch) names 1 wrong
    object of 3 mentions: count penalty 1, fraction penalty 1/3."""
    scorer_module = pytest.importorskip("chair_server.scorer")
    chair = scorer_module.ChairScorer.from_ground_truth(GROUND_TRUTH)

    refs = [CORPUS[i] for i in IMAGE_IDS]
    by_count = CaptionReward(cider, chair, chair_weight=1.0, chair_penalty="count")
    by_fraction = CaptionReward(cider, chair, chair_weight=1.0)
    count = by_count(CAPTIONS, IMAGE_IDS, refs)
    fraction = by_fraction(CAPTIONS, IMAGE_IDS, refs)
    np.testing.assert_array_equal(count.hallucinated, [0.0, 1.0, 0.0, 0.0])
    np.testing.assert_allclose(count.scores, count.cider - np.array([0, 1.0, 0, 0]), atol=1e-12)
    np.testing.assert_allclose(
        fraction.scores, fraction.cider - np.array([0, 1 / 3, 0, 0]), atol=1e-12
    )
