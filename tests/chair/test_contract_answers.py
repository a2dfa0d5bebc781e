"""The service's answers to each contract refusal, word for word, through the app in-process
(Flask's test client; tests/chair/test_service.py asks the same over real HTTP): the status, the
field named, and the fix where there is one."""

from __future__ import annotations

import pytest

from chair_server import contract
from chair_server.scorer import ChairScorer

ITEM = {"image_id": 1001, "caption": "A cat."}


@pytest.fixture()
def client(session_gt_file):
    from chair_server.app import create_app
    from chair_server.config import ServerSettings

    settings = ServerSettings(ground_truth=str(session_gt_file), max_batch=3)
    return create_app(ChairScorer.from_ground_truth(session_gt_file), settings).test_client()


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        (
            {"captions": [ITEM], "include_caption": False},
            400,
            "body.include_caption: unknown key; did you mean include_captions? accepted: "
            "captions, include_captions",
        ),
        (
            {"captions": [ITEM], "zzz": 1},
            400,
            "body.zzz: unknown key; accepted: captions, include_captions",
        ),
        ({"captions": {"a": 1}}, 400, "captions must be a list of {image_id, caption} objects"),
        ([ITEM], 400, 'body must be an object {"captions": [...]}'),
        ({"include_captions": True}, 400, "captions is missing"),
        ({"captions": [ITEM], "include_captions": 1}, 400, "include_captions must be a boolean"),
        ({"captions": [ITEM] * 4}, 413, "captions has 4 captions, more than max_batch=3"),
    ],
)
def test_each_refusal_says_what_and_where(client, body, status, error):
    answer = client.post("/v1/chair", json=body)
    assert answer.status_code == status
    assert answer.get_json() == {"error": error}


def test_exactly_max_batch_captions_are_scored(client):
    answer = client.post("/v1/chair", json={"captions": [ITEM] * 3})
    assert answer.status_code == 200
    assert len(answer.get_json()["sentences"]) == 3


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        ([ITEM] * 4, 413, "body has 4 captions, more than max_batch=3"),
        ({"captions": [ITEM] * 4}, 413, "captions has 4 captions, more than max_batch=3"),
        ("a caption", 400, "body must be a list of {image_id, caption} objects"),
    ],
)
def test_the_first_routes_forms_are_held_to_the_same_limits(client, body, status, error):
    answer = client.post("/computeCaption", json=body)
    assert answer.status_code == status
    assert answer.get_json() == {"error": error}
    assert answer.headers["Deprecation"] == "true"  # refusals say so too


def test_the_first_route_is_marked_deprecated_with_its_successor(client):
    answer = client.post("/computeCaption", json=[ITEM])
    assert answer.status_code == 200
    assert answer.headers["Deprecation"] == "true"
    assert answer.headers["Link"] == '</v1/chair>; rel="successor-version"'
    current = client.post("/v1/chair", json={"captions": [ITEM]})
    assert current.status_code == 200
    assert "Deprecation" not in current.headers and "Link" not in current.headers
    assert current.get_json() == answer.get_json()


def test_a_refusal_of_ours_keeps_its_line_beside_werkzeugs_body_limit(session_gt_file):
    """Both answer 413 on one app: the batch limit names the count, the body limit the MiB."""
    client = _app(session_gt_file, max_body_mb=0.01, max_batch=3)
    batch = client.post("/v1/chair", json={"captions": [ITEM] * 4})
    assert (batch.status_code, batch.get_json()) == (
        413,
        {"error": "captions has 4 captions, more than max_batch=3"},
    )
    body = client.post(
        "/v1/chair", json={"captions": [{"image_id": 1001, "caption": "a" * 20_000}]}
    )
    assert (body.status_code, body.get_json()) == (
        413,
        {"error": "request body over the limit of 0.01 MiB"},
    )


def test_check_items_names_the_count_and_the_limit():
    assert contract.check_items([ITEM] * 2, "captions", 2) == [ITEM] * 2
    assert contract.check_items([ITEM] * 5, "captions") == [ITEM] * 5  # no limit given
    with pytest.raises(
        contract.TooManyCaptions, match=r"^captions has 3 captions, more than max_batch=2$"
    ):
        contract.check_items([ITEM] * 3, "captions", 2)
    with pytest.raises(
        contract.RequestError, match=r"^rows must be a list of \{image_id, caption\} objects$"
    ):
        contract.check_items("x", "rows", 2)


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"", 'body is empty: send a JSON object {"captions": [...]}'),
        (b"  \n", 'body is empty: send a JSON object {"captions": [...]}'),
        (b'{"captions": "\xff"}', "body: not UTF-8 (byte 14 is 0xff); send JSON as UTF-8"),
        (b"[" * 100_000, "body: JSON nested too deeply"),
        (b'{"captions": [}', "body: malformed JSON (Expecting value: line 1 column 15 (char 14))"),
    ],
)
def test_a_body_that_is_not_json_is_named_for_what_it_is(client, data, error):
    answer = client.post("/v1/chair", data=data, content_type="application/json")
    assert answer.status_code == 400
    assert answer.get_json() == {"error": error}


def test_an_answer_streams_every_sentence_and_the_corpus_metrics(client):
    items = [ITEM, {"image_id": 1001, "caption": "A dog and a cat."}]
    full = client.post("/v1/chair", json={"captions": items}).get_json()
    short = client.post("/v1/chair", json={"captions": items, "include_captions": False}).get_json()
    assert [s["caption"] for s in full["sentences"]] == ["A cat.", "A dog and a cat."]
    assert all("caption" not in s for s in short["sentences"])
    assert [s["metrics"] for s in short["sentences"]] == [s["metrics"] for s in full["sentences"]]
    assert full["overall_metrics"] == short["overall_metrics"]
    assert set(full) == {"sentences", "overall_metrics"}


def _app(session_gt_file, **settings):
    from chair_server.app import create_app
    from chair_server.config import ServerSettings

    config = ServerSettings(ground_truth=str(session_gt_file), **settings)
    return create_app(ChairScorer.from_ground_truth(session_gt_file), config).test_client()


def test_every_slot_taken_is_a_503_to_retry_and_a_closed_answer_frees_its_slot(
    session_gt_file, monkeypatch
):
    from chair_server import app as app_module

    monkeypatch.setattr(app_module, "SLOT_WAIT", 0.05)
    client = _app(session_gt_file, workers=2)  # one scoring slot (one thread kept for /health)
    held = client.post("/v1/chair", json={"captions": [ITEM]}, buffered=False)
    assert held.status_code == 200  # streamed, not read yet: it holds the slot
    busy = client.post("/v1/chair", json={"captions": [ITEM]})
    assert busy.status_code == 503
    assert busy.headers["Retry-After"] == "1"
    assert busy.get_json() == {"error": "busy: every scoring slot is taken, retry shortly"}
    assert client.get("/health").status_code == 200
    held.close()
    assert client.post("/v1/chair", json={"captions": [ITEM]}).status_code == 200


def test_a_body_over_the_limit_is_a_413_naming_it(session_gt_file):
    client = _app(session_gt_file, max_body_mb=0.01)
    answer = client.post(
        "/v1/chair", json={"captions": [{"image_id": 1001, "caption": "a" * 20_000}]}
    )
    assert answer.status_code == 413
    assert answer.get_json() == {"error": "request body over the limit of 0.01 MiB"}


def test_a_caption_over_its_limit_is_an_error_entry(session_gt_file):
    client = _app(session_gt_file, max_caption_chars=10)
    entry = client.post("/v1/chair", json={"captions": [{"image_id": 1001, "caption": "a" * 11}]})
    assert entry.get_json()["sentences"][0]["error"] == (
        "caption has 11 characters, more than max_caption_chars=10"
    )


@pytest.mark.parametrize(
    ("header", "status"),
    [("Bearer s3cret", 200), ("bearer   s3cret  ", 200), ("Basic s3cret", 401), ("Bearer", 401)],
)
def test_the_bearer_scheme_is_read_as_rfc_7235_says(session_gt_file, header, status):
    client = _app(session_gt_file, token="s3cret")
    answer = client.post("/v1/chair", json={"captions": [ITEM]}, headers={"Authorization": header})
    assert answer.status_code == status


def test_info_and_errors_keep_their_key_order(client):
    info = client.get("/v1/info")
    assert list(info.get_json()) == [
        "version", "vocabulary", "categories", "num_categories", "images", "source", "max_batch",
        "max_body_bytes",
    ]  # fmt: skip
    assert info.get_json()["max_batch"] == 3 and info.get_json()["num_categories"] == 80
    assert info.data.index(b'"version"') < info.data.index(b'"categories"')  # not sorted
