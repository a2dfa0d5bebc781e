"""ChairClient: chunking, retries on 5xx, fallback to None while the service is down, recovery
after a restart, strict mode."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from chair_server import ChairScorer
from chair_server.launch import start_server
from entropyrl.rewards.chair_client import ChairClient, ChairServiceError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StubService:
    """Answers POSTs with the given status codes in turn, then with a valid CHAIR answer."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = list(statuses)
        self.posts = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.posts += 1
                status = stub.statuses.pop(0) if stub.statuses else 200
                if status == 200:
                    payload = {
                        "sentences": [
                            {"image_id": c["image_id"], "metrics": {"CHAIRi": 0.0}}
                            for c in body["captions"]
                        ]
                    }
                else:
                    payload = {"error": "stub"}
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


ITEMS = [{"image_id": i, "caption": "a dog"} for i in range(5)]


def drop_caption(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if k != "caption"}


def test_retries_on_5xx_then_succeeds() -> None:
    stub = StubService([503, 500])
    try:
        client = ChairClient(stub.url, retries=3, backoff=0.01)
        result = client.score(ITEMS)
        assert [r["image_id"] for r in result] == list(range(5))
        assert client.stats["retries"] == 2 and client.stats["requests"] == 3
        assert client.metrics()["chair/failures"] == 0.0
    finally:
        stub.close()


def test_4xx_is_not_retried_and_falls_back() -> None:
    stub = StubService([400])
    try:
        client = ChairClient(stub.url, retries=3, backoff=0.01)
        assert client.score(ITEMS) == [None] * 5
        assert stub.posts == 1
        assert client.metrics()["chair/fallback_samples"] == 5.0
        assert client.metrics()["chair/failures"] == 1.0
    finally:
        stub.close()


def test_retries_exhausted_gives_none_and_strict_raises() -> None:
    stub = StubService([503] * 10)
    try:
        client = ChairClient(stub.url, retries=2, backoff=0.01)
        assert client.score(ITEMS) == [None] * 5
        assert stub.posts == 3
        with pytest.raises(ChairServiceError, match="503"):
            ChairClient(stub.url, retries=1, backoff=0.01, strict=True).score(ITEMS)
    finally:
        stub.close()


def test_chunking_one_request_per_chunk(chair_server_url, session_gt_file, sample_items) -> None:
    client = ChairClient(chair_server_url, max_batch=7)
    got = client.score(sample_items)
    expected = ChairScorer.from_ground_truth(session_gt_file).score(sample_items)
    # the client asks the service not to send the caption text back
    assert got == json.loads(json.dumps([drop_caption(e) for e in expected]))
    assert client.stats["requests"] == -(-len(sample_items) // 7)
    assert client.stats["error_samples"] == 1  # the unknown image id
    assert ChairClient.is_scored(got[0]) and not ChairClient.is_scored(got[-1])
    assert not ChairClient.is_scored(None)


def test_bad_settings() -> None:
    with pytest.raises(ValueError, match="http://"):
        ChairClient("localhost:5000")
    with pytest.raises(ValueError, match="max_batch"):
        ChairClient("http://127.0.0.1:9", max_batch=0)


def test_truncated_answer_is_retried() -> None:
    """A server that closes the connection mid-answer: retried, then None (never an exception)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"

        def serve() -> None:
            for _ in range(2):
                conn, _ = listener.accept()
                with conn:
                    conn.recv(65536)
                    conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{"sent')

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        client = ChairClient(url, timeout=5.0, retries=1, backoff=0.01)
        assert client.score(ITEMS) == [None] * 5
        assert client.stats["requests"] == 2 and client.stats["failures"] == 1
        thread.join(5)


def test_bad_items_raise_naming_the_field() -> None:
    client = ChairClient("http://127.0.0.1:9")
    with pytest.raises(ValueError, match=r"items\[1\].caption is missing"):
        client.score([{"image_id": 1, "caption": "a"}, {"image_id": 2}])


def test_service_down_then_restarted(session_gt_file) -> None:
    port = free_port()
    items = [{"image_id": 1001, "caption": "A man and a cat."}] * 10
    server = start_server(ground_truth=session_gt_file, port=port)
    client = ChairClient(server.url, timeout=2.0, retries=1, backoff=0.01, max_batch=4)
    try:
        assert client.wait_until_healthy(10)
        first = client.score(items)
        assert first[0]["metrics"]["CHAIRi"] == pytest.approx(0.5)
        server.stop()
        down = client.score(items)
        assert down == [None] * 10
        stats = client.stats
        # the first chunk fails after its retries; the remaining chunks are not attempted
        assert stats["failures"] == 3 and stats["fallback_samples"] == 10
        assert not client.wait_until_healthy(0.2)
        with pytest.raises(ChairServiceError):
            ChairClient(server.url, retries=0, strict=True).score(items)
        server = start_server(ground_truth=session_gt_file, port=port)
        assert client.wait_until_healthy(10)
        assert client.score(items) == first
        assert client.stats["fallback_samples"] == 10
    finally:
        server.stop()


def test_wait_until_healthy_strict_raises() -> None:
    client = ChairClient(f"http://127.0.0.1:{free_port()}", strict=True)
    with pytest.raises(ChairServiceError, match="not healthy"):
        client.wait_until_healthy(0.2)


def test_hanging_service_is_bounded() -> None:
    """A service that accepts but never answers: the client gives up within its budget."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        client = ChairClient(url, timeout=0.2, retries=1, backoff=0.01, total_timeout=1.0)
        assert client.score(ITEMS) == [None] * 5
        assert client.stats["requests"] == 2 and client.stats["retries"] == 1


def test_one_bad_image_id_falls_back_alone(chair_server_url) -> None:
    """Ids the service would refuse are caught before sending: the rest of the chunk is scored."""
    items = [{"image_id": 1001, "caption": "A dog."}] * 6
    items[1] = {"image_id": 1001.0, "caption": "A dog."}
    items[3] = {"image_id": None, "caption": "A dog."}
    items[4] = {"image_id": True, "caption": "A dog."}
    client = ChairClient(chair_server_url, max_batch=512)
    result = client.score(items)
    assert [r is None for r in result] == [False, True, False, True, True, False]
    assert all(result[i]["metrics"]["mentions"] == 1 for i in (0, 2, 5))
    stats = client.stats
    assert stats["invalid_samples"] == 3 and stats["fallback_samples"] == 3
    assert stats["scored_samples"] == 3 and stats["requests"] == 1
    with pytest.raises(ValueError, match=r"items\[1\].image_id"):
        ChairClient(chair_server_url, strict=True).score(items)


def test_numpy_integer_ids_are_sent_as_ints(chair_server_url) -> None:
    np = pytest.importorskip("numpy")
    items = [
        {"image_id": np.int64(1001), "caption": "A man and a cat."},
        {"image_id": np.int32(1002), "caption": "A toilet."},
        {"image_id": np.uint16(1003), "caption": "An elephant."},
    ]
    for strict in (False, True):
        result = ChairClient(chair_server_url, strict=strict).score(items)
        assert [r["image_id"] for r in result] == [1001, 1002, 1003]
        assert [r["metrics"]["mentions"] for r in result] == [2, 1, 1]
    assert ChairClient(chair_server_url).score([{"image_id": np.bool_(True), "caption": "x"}]) == [
        None
    ]


def test_batch_over_the_service_limit_is_split_and_retried(
    chair_server_url, session_gt_file, sample_items
) -> None:
    """The fixture service allows 64 captions per request; the client sends chunks of 200."""
    items = (sample_items * 5)[:200]
    client = ChairClient(chair_server_url, max_batch=200)
    got = client.score(items)
    expected = ChairScorer.from_ground_truth(session_gt_file).score(items)
    assert got == json.loads(json.dumps([drop_caption(e) for e in expected]))
    stats = client.stats
    assert stats["fallback_samples"] == 0 and stats["splits"] >= 2
    assert stats["scored_samples"] + stats["error_samples"] == 200


def test_single_caption_over_the_body_limit_falls_back_alone(chair_server_url) -> None:
    """A caption bigger than the fixture service's 0.05 MiB body limit: only it falls back."""
    items = [{"image_id": 1001, "caption": "A dog."}] * 3
    items[1] = {"image_id": 1001, "caption": "dog " * 20000}
    client = ChairClient(chair_server_url, max_batch=3)
    result = client.score(items)
    assert [r is None for r in result] == [False, True, False]
    assert client.stats["fallback_samples"] == 1 and client.stats["scored_samples"] == 2
    with pytest.raises(ChairServiceError, match="413"):
        ChairClient(chair_server_url, max_batch=3, strict=True).score(items)


def test_a_refused_token_stops_the_caller_instead_of_falling_back(token_server_url) -> None:
    """A wrong or missing token is a setup error: no fallback, whatever `strict` says."""
    from entropyrl.rewards.chair_client import ChairAuthError

    items = [{"image_id": 1001, "caption": "A man with a dog."}]
    for token in (None, "wrong"):
        client = ChairClient(token_server_url, token=token, retries=0, strict=False)
        with pytest.raises(ChairAuthError, match="set CHAIR_SERVER_TOKEN"):
            client.score(items)
    (entry,) = ChairClient(token_server_url, token="s3cret").score(items)
    assert ChairClient.is_scored(entry)
