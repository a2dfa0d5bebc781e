"""A corpus metric over nothing is null, not 0.0 (which reads as a perfect score): the scorer,
the service over real HTTP and the evaluate command (the demo summary: tests/rig/local). What the
service and the command write is strict JSON: never NaN or Infinity, which jq and JavaScript
reject (tests/test_json_strict.py: the rest of the project)."""

from __future__ import annotations

import json
import urllib.request

import pytest

from chair_server import ChairScorer, evaluate, strict_json

UNKNOWN = [{"image_id": 777, "caption": "A dog."}, {"image_id": "x", "caption": "A cat."}]
NULLED = ("CHAIRs", "CHAIRi", "Recall", "mean_length")


def test_scorer_reports_null_when_no_caption_is_scored(gt_file) -> None:
    overall = ChairScorer.from_ground_truth(gt_file).score_corpus(UNKNOWN)["overall_metrics"]
    assert {k: overall[k] for k in NULLED} == dict.fromkeys(NULLED)
    assert overall["captions"] == 0 and overall["errors"] == 2


def test_each_ratio_is_null_only_when_its_own_denominator_is_zero(gt_file) -> None:
    scorer = ChairScorer.from_ground_truth(gt_file)
    # captions scored, but none mentions an object: CHAIR_s is a real 0, CHAIR_i has no mention
    overall = scorer.score_corpus([{"image_id": 1001, "caption": "Nothing to see."}])[
        "overall_metrics"
    ]
    assert overall["CHAIRs"] == 0.0 and overall["CHAIRi"] is None
    assert overall["Recall"] == 0.0 and overall["mean_length"] == 3.0
    # image 1004 has no ground-truth object: recall has nothing to recall
    overall = scorer.score_corpus([{"image_id": 1004, "caption": "A dog."}])["overall_metrics"]
    assert overall["CHAIRi"] == 1.0 and overall["Recall"] is None


def test_service_answers_null_over_http(chair_server_url) -> None:
    request = urllib.request.Request(
        chair_server_url + "/v1/chair",
        data=json.dumps({"captions": UNKNOWN}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        raw = response.read().decode()
    overall = json.loads(raw)["overall_metrics"]
    assert {k: overall[k] for k in NULLED} == dict.fromkeys(NULLED)
    assert '"CHAIRs":null' in raw


def test_evaluate_prints_na_and_writes_null(tmp_path, gt_file, capsys) -> None:
    captions = tmp_path / "caps.jsonl"
    captions.write_text("".join(json.dumps(r) + "\n" for r in UNKNOWN))
    out = tmp_path / "out.json"
    args = ["--captions", str(captions), "--ground-truth", str(gt_file), "--json", str(out)]
    assert evaluate.main(args) == 0
    printed = capsys.readouterr()
    assert "| caps.jsonl | n/a | n/a | n/a | n/a | 0 | 2 |" in printed.out
    assert "no caption could be scored" in printed.err
    overall = json.loads(out.read_text())["overall_metrics"]
    assert overall["CHAIRs"] is None and overall["CHAIRi"] is None


def _refuse(constant: str) -> None:
    raise AssertionError(f"{constant} in JSON: jq and JavaScript reject it")


def test_strict_json_writes_null_for_non_finite_numbers() -> None:
    value = {"a": float("nan"), "b": [1.0, float("inf"), (float("-inf"),)], "c": "NaN"}
    text = strict_json.dumps(value, separators=(",", ":"))
    assert json.loads(text, parse_constant=_refuse) == {
        "a": None,
        "b": [1.0, None, [None]],
        "c": "NaN",
    }
    finite = {"CHAIRi": 0.25, "captions": 4, "Recall": None}
    assert strict_json.dumps(finite) == json.dumps(finite)  # nothing to map: the same text
    with pytest.raises(ValueError, match="Circular"):
        loop: list = []
        loop.append(loop)
        strict_json.dumps(loop)


def test_evaluate_refuses_a_nan_image_id_as_the_service_does(tmp_path, gt_file, capsys) -> None:
    """Python's reader takes `NaN` as an image id; the service's rules (chair_server.contract)
    refuse it, in one line naming the field, and nothing is written."""
    captions = tmp_path / "caps.jsonl"
    captions.write_text('{"image_id": NaN, "caption": "A dog."}\n')
    out = tmp_path / "out.json"
    args = ["--captions", str(captions), "--ground-truth", str(gt_file), "--json", str(out)]
    assert evaluate.main(args) == 2
    assert capsys.readouterr().err == "error: captions[0].image_id must be an integer or a string\n"
    assert not out.exists()
