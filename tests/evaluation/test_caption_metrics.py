"""The caption metrics of the evaluation against pycocoevalcap and the CHAIR scorer's own corpus
figures, and their summary (intervals, paired differences, table, figure)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider

from chair_server.scorer import ChairScorer, overall_metrics
from entropyrl.evaluation.caption_metrics import (
    CAPTION_METRICS,
    bleu4,
    bleu_counts,
    caption_values,
    cider_scores,
)
from entropyrl.evaluation.pope import POPE_METRICS, pope_counts, pope_metrics, pope_statistic
from entropyrl.evaluation.report import draw_figure, markdown_table, summarise
from entropyrl.evaluation.stats import per_image_values
from entropyrl.rewards.text import normalize_caption

WORDS = ["a", "dog", "cat", "man", "sits", "on", "the", "table", "with", "two", "people", "red",
         "car", "and", "bird", "street"]  # fmt: skip


def random_corpus(seed: int, images: int = 30):
    rng = random.Random(seed)

    def sentence() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 14))) + "."

    captions = [sentence() for _ in range(images)]
    references = [[sentence() for _ in range(rng.randint(1, 5))] for _ in range(images)]
    return captions, references


def coco_dicts(captions, references):
    res = {i: [normalize_caption(c)] for i, c in enumerate(captions)}
    gts = {i: [normalize_caption(r) for r in refs] for i, refs in enumerate(references)}
    return gts, res


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cider_d_equals_pycocoevalcap_on_the_same_tokens(seed):
    captions, references = random_corpus(seed)
    gts, res = coco_dicts(captions, references)
    expected, per_image = Cider().compute_score(gts, res)
    ours = cider_scores(captions, references)
    np.testing.assert_allclose(ours, per_image, rtol=1e-9, atol=1e-12)
    assert ours.mean() == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_bleu4_equals_pycocoevalcap_corpus_bleu(seed):
    captions, references = random_corpus(seed)
    gts, res = coco_dicts(captions, references)
    expected, _ = Bleu(4).compute_score(gts, res, verbose=0)
    counts = np.array([bleu_counts(c, r) for c, r in zip(captions, references)])
    assert bleu4(counts[None])[0] == pytest.approx(expected[3], rel=1e-12)


def test_bleu4_of_empty_captions_is_zero_not_nan():
    counts = np.array([bleu_counts("", ["a dog."]), bleu_counts("", ["a cat sits."])])
    assert bleu4(counts[None])[0] == pytest.approx(0.0, abs=1e-6)


def chair_entries():
    scorer = ChairScorer.from_ground_truth({"1": ["dog"], "2": ["cat", "car"], "3": ["person"]})
    captions = {
        1: "A dog and a cat on a table.",
        2: "A cat next to a car and a bird.",
        3: "A man.",
    }
    return [scorer.score_one(image_id, text) for image_id, text in captions.items()]


def test_chair_values_give_the_scorers_corpus_figures():
    entries = chair_entries()
    references = [["a dog."], ["a cat and a car."], ["a man."]]
    values = caption_values(entries, references)
    overall = overall_metrics(entries)
    for name, key in (("CHAIR_s", "CHAIRs"), ("CHAIR_i", "CHAIRi"), ("recall", "Recall"),
                      ("length", "mean_length")):  # fmt: skip
        array, _ = per_image_values(values[name])
        statistic = CAPTION_METRICS[name].statistic
        assert statistic(array[None])[0] == pytest.approx(overall[key]), name
    assert set(values) == set(CAPTION_METRICS)


def test_an_unscored_caption_is_an_error_naming_the_image():
    scorer = ChairScorer.from_ground_truth({"1": ["dog"]})
    with pytest.raises(ValueError, match="image 7"):
        caption_values([scorer.score_one(7, "a dog")], [["a dog."]])


def test_pope_statistics_equal_pope_metrics():
    rng = random.Random(0)
    ids = [i // 6 for i in range(120)]
    labels = [rng.choice(["yes", "no"]) for _ in ids]
    answers = [rng.choice(["yes", "no"]) for _ in ids]
    values, _ = per_image_values(pope_counts(ids, labels, answers))
    direct = pope_metrics(labels, answers)
    for name in POPE_METRICS:
        assert pope_statistic(name)(values[None])[0] == pytest.approx(getattr(direct, name))


def test_pope_statistics_keep_zero_for_a_ratio_over_nothing():
    values, _ = per_image_values(pope_counts([1, 1], ["no", "no"], ["no", "no"]))
    assert pope_statistic("precision")(values[None])[0] == 0.0
    assert pope_statistic("f1")(values[None])[0] == 0.0


def test_summary_pairs_models_and_marks_clear_differences(tmp_path):
    rng = np.random.default_rng(0)
    base = {i: float(rng.random() < 0.5) for i in range(200)}
    better = {i: 0.0 for i in range(200)}  # never hallucinates
    same = dict(base)
    per_model = {"base": {"CHAIR_s": base}, "better": {"CHAIR_s": better},
                 "same": {"CHAIR_s": same}}  # fmt: skip
    summary = summarise(per_model, {"CHAIR_s": CAPTION_METRICS["CHAIR_s"].statistic}, base="base")
    assert "vs_base" not in summary["base"]
    assert summary["better"]["vs_base"]["CHAIR_s"]["excludes_zero"] is True
    assert summary["same"]["vs_base"]["CHAIR_s"] == {
        "estimate": 0.0, "low": 0.0, "high": 0.0, "excludes_zero": False
    }  # fmt: skip
    low, high = (
        summary["base"]["metrics"]["CHAIR_s"]["low"],
        summary["base"]["metrics"]["CHAIR_s"]["high"],
    )
    assert low < summary["base"]["metrics"]["CHAIR_s"]["estimate"] < high
    table = markdown_table("t", summary, [("CHAIR_s", "CHAIR_s %", 100.0, True)], base="base")
    better_row = next(line for line in table.splitlines() if line.startswith("| better"))
    same_row = next(line for line in table.splitlines() if line.startswith("| same"))
    assert "**Δ" in better_row and "\\*" in better_row
    assert "**" not in same_row
    draw_figure([("CHAIR_s", summary, "CHAIR_s", 100.0)], tmp_path / "figure.png")
    assert (tmp_path / "figure.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_undefined_metric_is_null_with_a_note():
    per_model = {"base": {"CHAIR_i": {1: (0.0, 0.0), 2: (0.0, 0.0)}}}
    summary = summarise(per_model, {"CHAIR_i": CAPTION_METRICS["CHAIR_i"].statistic}, base="base")
    entry = summary["base"]["metrics"]["CHAIR_i"]
    assert entry["estimate"] is None and "undefined" in entry["note"]
