"""One contract for the CHAIR service: the in-process scorer and the HTTP client answer the same
call the same way (the caption reward takes either), and a malformed caption is refused by the
same rule with the same words on every side: the scorer, the client before it sends, and the
service's 400 (`chair_server.contract`)."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import numpy as np
import pytest

from chair_server import contract
from chair_server.scorer import ChairScorer
from entropyrl.rewards.caption import ChairScorerLike
from entropyrl.rewards.chair_client import ChairClient

MALFORMED = [
    (["a caption"], "", "must be an object with image_id and caption"),
    ([{"caption": "a dog"}], "image_id", ".image_id is missing"),
    ([{"image_id": 1001}], "caption", ".caption is missing"),
    (
        [{"image_id": 1.5, "caption": "a dog"}],
        "image_id",
        ".image_id must be an integer or a string",
    ),
    (
        [{"image_id": True, "caption": "a dog"}],
        "image_id",
        ".image_id must be an integer or a string",
    ),
    ([{"image_id": 1001, "caption": 3}], "caption", ".caption must be a string"),
]


def without_captions(entries: list) -> list:
    return [{k: v for k, v in json.loads(json.dumps(e)).items() if k != "caption"} for e in entries]


@pytest.fixture(scope="module")
def sides(session_gt_file, chair_server_url):
    return {
        "in-process": ChairScorer.from_ground_truth(session_gt_file),
        "over HTTP": ChairClient(chair_server_url, strict=True, retries=0),
    }


@pytest.mark.parametrize("side", ["in-process", "over HTTP"])
def test_both_sides_are_the_scorer_the_reward_takes(sides, side, sample_items) -> None:
    scorer = sides[side]
    assert isinstance(scorer, ChairScorerLike)
    answer = scorer.score(sample_items)
    # the client asks the service to leave out the caption text, which its caller holds
    assert without_captions(answer) == without_captions(sides["in-process"].score(sample_items))
    assert answer[-1]["error"] == "unknown image_id 31337"  # an error entry, not an exception


@pytest.mark.parametrize(("items", "field", "message"), MALFORMED)
@pytest.mark.parametrize("side", ["in-process", "over HTTP"])
def test_a_malformed_caption_is_refused_by_one_rule_on_both_sides(
    sides, side, items, field, message
) -> None:
    problem = contract.item_problem(items[0], "captions[0]")
    assert problem == contract.ItemProblem(field, f"captions[0]{' ' if not field else ''}{message}")
    with pytest.raises(ValueError) as refused:
        sides[side].score(items)
    # the same words; each side names the list it was given (captions[0], items[0])
    assert re.sub(r"^\w+\[0\]", "", str(refused.value)) == re.sub(r"^\w+\[0\]", "", problem.message)


@pytest.mark.parametrize(("items", "field", "message"), MALFORMED)
def test_the_service_answers_the_same_rule_with_a_400(chair_server_url, items, field, message):
    request = urllib.request.Request(
        chair_server_url + "/v1/chair",
        data=json.dumps({"captions": items}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(request, timeout=30)
    assert answer.value.code == 400
    assert (
        json.loads(answer.value.read())["error"]
        == contract.item_problem(items[0], "captions[0]").message
    )


def test_numpy_ids_are_sent_as_the_integers_json_carries(sides) -> None:
    items = [{"image_id": np.int64(1001), "caption": "A cat."}]
    assert contract.image_id(np.int64(1001)) == 1001 and contract.image_id(np.bool_(True)) is None
    assert without_captions(sides["over HTTP"].score(items)) == without_captions(
        sides["in-process"].score(items)
    )


def test_a_lenient_client_falls_back_on_a_bad_id_alone(chair_server_url) -> None:
    """Without strict, an id the service would refuse costs that sample only (None, counted);
    a malformed caption is still a caller's error."""
    client = ChairClient(chair_server_url, retries=0)
    entries = client.score(
        [{"image_id": 1.5, "caption": "a"}, {"image_id": 1001, "caption": "A cat."}]
    )
    assert entries[0] is None and entries[1]["metrics"]["mentions"] >= 0
    assert client.stats["invalid_samples"] == 1
    with pytest.raises(ValueError, match=r"items\[0\]\.caption must be a string"):
        client.score([{"image_id": 1001, "caption": 3}])


def test_a_standard_wsgi_server_serves_the_no_argument_factory(tmp_path, session_gt_file) -> None:
    """`waitress-serve --call chair_server.wsgi:create_app`, settings from CHAIR_SERVER_ARGS."""
    import os
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, CHAIR_SERVER_ARGS=f"--ground-truth {session_gt_file} --token s3cret")
    waitress = Path(sys.executable).with_name("waitress-serve")
    server = subprocess.Popen(
        [
            str(waitress),
            "--host=127.0.0.1",
            f"--port={port}",
            "--call",
            "chair_server.wsgi:create_app",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=2).close()
                break
            except OSError:
                assert server.poll() is None, server.communicate()[1]
                assert time.monotonic() < deadline
                time.sleep(0.2)
        client = ChairClient(url, token="s3cret", strict=True, retries=0)
        entries = client.score([{"image_id": 1001, "caption": "A cat."}])
        assert entries[0]["metrics"]["mentions"] == 1
        with pytest.raises(RuntimeError, match="401"):
            ChairClient(url, strict=True, retries=0).score(
                [{"image_id": 1001, "caption": "A cat."}]
            )
    finally:
        server.terminate()
        server.wait(30)


@pytest.fixture()
def app_client(session_gt_file):
    from chair_server.app import create_app
    from chair_server.config import ServerSettings

    settings = ServerSettings(ground_truth=str(session_gt_file), token="s3cret")
    app = create_app(ChairScorer.from_ground_truth(session_gt_file), settings)
    return app.test_client()


AUTH = {"Authorization": "Bearer s3cret"}


def test_a_401_names_the_scheme_it_wants(app_client) -> None:
    answer = app_client.post("/v1/chair", json={"captions": []})
    assert answer.status_code == 401
    assert answer.headers["WWW-Authenticate"] == 'Bearer realm="chair_server"'  # RFC 6750
    assert app_client.get("/health").status_code == 200


def test_a_number_too_long_to_parse_gets_the_services_own_message(app_client) -> None:
    body = b'{"captions": [{"image_id": ' + b"9" * 5000 + b', "caption": "a"}]}'
    answer = app_client.post("/v1/chair", data=body, headers=AUTH)
    assert answer.status_code == 400
    assert answer.get_json() == {"error": "body: a number with more than 4300 digits"}


def test_each_refusal_is_logged_with_its_reason_and_no_caption_text(app_client, caplog) -> None:
    import logging

    caplog.set_level(logging.INFO, logger="chair_server")
    secret = "A caption nobody should read in a log."
    app_client.post(
        "/v1/chair", json={"captions": [{"image_id": 1.5, "caption": secret}]}, headers=AUTH
    )
    app_client.post("/v1/chair", json={"captions": [{"image_id": 1001, "caption": secret}]})
    lines = [r.getMessage() for r in caplog.records if r.name == "chair_server"]
    assert lines[0].startswith("POST /v1/chair 400 ") and lines[0].endswith(
        "refused: captions[0].image_id must be an integer or a string"
    )
    assert (
        lines[1].startswith("POST /v1/chair 401 ")
        and "refused: missing or wrong bearer" in lines[1]
    )
    assert not any(secret in line for line in lines)


def test_exactly_max_batch_captions_pass_and_one_more_is_refused() -> None:
    """The documented limit is inclusive: a request of exactly `max_batch` captions is scored."""
    from chair_server.contract import TooManyCaptions, check_items

    items = [{"image_id": i, "caption": "a dog"} for i in range(4)]
    assert check_items(items, "captions", max_batch=4) == items
    with pytest.raises(TooManyCaptions):
        check_items([*items, {"image_id": 9, "caption": "a cat"}], "captions", max_batch=4)
