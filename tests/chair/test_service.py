"""The service over real HTTP (waitress on a free loopback port, started as a subprocess)."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from chair_server import ChairScorer
from entropyrl.rewards.chair_client import ChairClient


def call(url: str, path: str, body: object = None, *, raw: bytes | None = None, headers=None):
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(url + path, data=data, headers=headers or {})
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_health_and_info(chair_server_url) -> None:
    assert call(chair_server_url, "/health") == (200, {"status": "ok", "images": 6})
    status, info = call(chair_server_url, "/v1/info")
    assert status == 200
    assert info["num_categories"] == 80 and info["categories"][0] == "person"
    assert info["images"] == 6 and info["max_batch"] == 64 and info["version"]


def test_v1_chair_equals_in_process(chair_server_url, session_gt_file, sample_items) -> None:
    expected = ChairScorer.from_ground_truth(session_gt_file).score_corpus(sample_items)
    status, answer = call(chair_server_url, "/v1/chair", {"captions": sample_items})
    assert status == 200
    assert answer == json.loads(json.dumps(expected))
    assert answer["sentences"][-1]["error"] == "unknown image_id 31337"
    assert answer["overall_metrics"]["errors"] == 1


@pytest.mark.parametrize(
    ("form", "count"),
    [
        (lambda items: items, 3),
        (lambda items: {"captions": items}, 3),
        (lambda items: items[0], 1),
    ],
    ids=["list", "captions-object", "single-object"],
)
def test_compute_caption_forms(
    chair_server_url, session_gt_file, sample_items, form, count
) -> None:
    items = sample_items[:3]
    expected = ChairScorer.from_ground_truth(session_gt_file).score_corpus(items[:count])
    status, answer = call(chair_server_url, "/computeCaption", form(items))
    assert status == 200
    assert answer == json.loads(json.dumps(expected))
    assert set(answer["sentences"][0]["metrics"]) >= {"CHAIRs", "CHAIRi", "Recall"}


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b"{not json", "malformed JSON"),
        (b"", 'body is empty: send a JSON object {"captions": [...]}'),
        (b" \n", "body is empty"),
        (b'{"captions": "\xff"}', "body: not UTF-8 (byte 14 is 0xff); send JSON as UTF-8"),
        (
            b'{"captions": [], "include_caption": false}',
            "body.include_caption: unknown key; did you mean include_captions? accepted: "
            "captions, include_captions",
        ),
        (b'{"captions": [], "x": 1}', "body.x: unknown key; accepted: captions, include_captions"),
        (b"[1, 2]", "body must be an object"),
        (b"{}", "captions is missing"),
        (b'{"captions": 5}', "captions must be a list"),
        (b'{"captions": [5]}', "captions[0] must be an object"),
        (b'{"captions": [{"caption": "a"}]}', "captions[0].image_id is missing"),
        (b'{"captions": [{"image_id": 1}]}', "captions[0].caption is missing"),
        (b'{"captions": [{"image_id": 1, "caption": 2}]}', "captions[0].caption must be a string"),
        (b'{"captions": [{"image_id": [1], "caption": "a"}]}', "captions[0].image_id must be"),
        (b'{"captions": [{"image_id": true, "caption": "a"}]}', "captions[0].image_id must be"),
    ],
)
def test_bad_input_is_400_naming_the_field(chair_server_url, raw, field) -> None:
    status, answer = call(chair_server_url, "/v1/chair", raw=raw)
    assert status == 400
    assert field in answer["error"]


def test_include_captions_flag(chair_server_url, sample_items) -> None:
    body = {"captions": sample_items[:2], "include_captions": False}
    status, answer = call(chair_server_url, "/v1/chair", body)
    assert status == 200 and "caption" not in answer["sentences"][0]
    assert answer["sentences"][0]["metrics"]["words"] > 0
    body["include_captions"] = "no"
    status, answer = call(chair_server_url, "/v1/chair", body)
    assert status == 400 and "include_captions" in answer["error"]


def test_compute_caption_bad_input(chair_server_url) -> None:
    status, answer = call(chair_server_url, "/computeCaption", raw=b'[{"image_id": 1}]')
    assert status == 400 and "body[0].caption is missing" in answer["error"]


def test_limits_are_413(chair_server_url) -> None:
    items = [{"image_id": 1001, "caption": "a dog"}] * 65
    status, answer = call(chair_server_url, "/v1/chair", {"captions": items})
    assert status == 413 and "max_batch=64" in answer["error"]
    big = [{"image_id": 1001, "caption": "dog " * 2000}] * 10  # ~80 KB > 0.05 MiB
    status, answer = call(chair_server_url, "/v1/chair", {"captions": big})
    assert status == 413 and "MiB" in answer["error"]


def test_unknown_route_is_json_404(chair_server_url) -> None:
    status, answer = call(chair_server_url, "/nope")
    assert status == 404 and "error" in answer


def test_token(token_server_url) -> None:
    body = {"captions": [{"image_id": 1001, "caption": "a dog"}]}
    assert call(token_server_url, "/v1/chair", body)[0] == 401
    assert (
        call(token_server_url, "/v1/chair", body, headers={"Authorization": "Bearer nope"})[0]
        == 401
    )
    assert call(token_server_url, "/v1/info")[0] == 401
    assert call(token_server_url, "/health")[0] == 200  # launchers probe without the token
    status, answer = call(
        token_server_url, "/v1/chair", body, headers={"Authorization": "Bearer s3cret"}
    )
    assert status == 200 and answer["sentences"][0]["metrics"]["CHAIRs"] == 0
    client = ChairClient(token_server_url, token="s3cret")
    assert client.score(body["captions"])[0]["metrics"]["mentions"] == 1
    strict_without = ChairClient(token_server_url, strict=True, retries=0)
    with pytest.raises(RuntimeError, match="401"):
        strict_without.score(body["captions"])


def test_concurrent_clients_match_in_process(
    chair_server_url, session_gt_file, sample_items
) -> None:
    scorer = ChairScorer.from_ground_truth(session_gt_file)
    batches = [sample_items[i % 7 : i % 7 + 20] for i in range(50)]
    expected = [
        [{k: v for k, v in e.items() if k != "caption"} for e in scorer.score(b)] for b in batches
    ]
    expected = json.loads(json.dumps(expected))
    failures: list[str] = []

    def worker() -> None:
        client = ChairClient(chair_server_url, timeout=30, max_batch=64)
        for batch, want in zip(batches, expected):
            got = client.score(batch)
            if got != want:
                failures.append(f"mismatch {got[:1]} != {want[:1]}")
        if client.stats["failures"]:
            failures.append(f"client failures {client.stats}")

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
