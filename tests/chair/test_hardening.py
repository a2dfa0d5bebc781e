"""The service against hostile or careless clients and operators, over real HTTP (waitress in a
subprocess on a free loopback port): pathological JSON, idle and slow connections, shutdown with
requests in flight, oversized captions and bodies, start-up mistakes, log forging."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from chair_server.config import ServerSettings
from chair_server.launch import start_server
from entropyrl.rewards.chair_client import ChairClient


def call(url: str, path: str, body: object = None, *, raw: bytes | None = None, headers=None):
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(url + path, data=data, headers=headers or {})
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), dict(exc.headers)


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def raw_exchange(url: str, request: bytes, timeout: float = 20) -> tuple[int, dict, bytes]:
    """Send bytes on a fresh socket; (status, headers, body) of the answer (Content-Length)."""
    with socket.create_connection(address(url), timeout=timeout) as sock:
        sock.sendall(request)
        return read_response(sock)


def read_response(sock: socket.socket) -> tuple[int, dict, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before the headers: {data!r}")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:])}
    status = int(lines[0].split()[1])

    def more() -> bytes:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the end of the body")
        return chunk

    if headers.get("transfer-encoding") == "chunked":  # streamed answers
        decoded = b""
        while True:
            while b"\r\n" not in body:
                body += more()
            size_line, body = body.split(b"\r\n", 1)
            size = int(size_line, 16)
            while len(body) < size + 2:
                body += more()
            if size == 0:
                return status, headers, decoded
            decoded, body = decoded + body[:size], body[size + 2 :]
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        body += more()
    return status, headers, body


@pytest.fixture(scope="module")
def server(session_gt_file):
    """A service with small limits of its own (its log is read by the tests)."""
    extra = ["--max-batch", "64", "--max-body-mb", "0.05", "--max-caption-chars", "200"]
    with start_server(ground_truth=session_gt_file, extra_args=extra) as handle:
        yield handle


# --- request bodies -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"captions": ' + b"[" * 1000 + b"]" * 1000 + b"}", "nested too deeply"),
        (b"[" * 1000 + b"]" * 1000, "nested too deeply"),
        (
            b'{"captions": [{"image_id": ' + b"7" * 5000 + b', "caption": "a dog"}]}',
            "a number with more than 4300 digits",
        ),
    ],
    ids=["nested-1000", "nested-top-level", "int-5000-digits"],
)
def test_pathological_json_is_400(server, raw: bytes, field: str) -> None:
    status, answer, headers = call(server.url, "/v1/chair", raw=raw)
    assert status == 400 and field in answer["error"]
    assert headers["Content-Type"] == "application/json"
    assert call(server.url, "/health")[0] == 200


def test_caption_over_the_length_cap_gets_its_own_error(server) -> None:
    items = [
        {"image_id": 1001, "caption": "A dog. " * 40},  # 280 characters > 200
        {"image_id": 1001, "caption": "A dog and a cat."},
    ]
    status, answer, _ = call(server.url, "/v1/chair", {"captions": items})
    assert status == 200
    long, short = answer["sentences"]
    assert "max_caption_chars=200" in long["error"] and "caption" not in long
    assert short["metrics"]["mentions"] == 2
    assert answer["overall_metrics"]["errors"] == 1 and answer["overall_metrics"]["captions"] == 1


def test_body_over_waitress_cap_is_json_413(server) -> None:
    # waitress refuses the body itself (2 x 0.05 MiB + 1 MiB) from the Content-Length alone
    request = (
        b"POST /v1/chair HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 5000000\r\n\r\n{"
    )
    status, headers, body = raw_exchange(server.url, request)
    assert status == 413 and headers["content-type"] == "application/json"
    assert "0.05 MiB" in json.loads(body)["error"]


def test_405_names_the_allowed_methods(server) -> None:
    status, headers, body = raw_exchange(server.url, b"GET /v1/chair HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 405 and "POST" in headers["allow"]
    assert "error" in json.loads(body)
    status, headers, _ = raw_exchange(server.url, b"POST /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 405 and "GET" in headers["allow"]


def test_control_characters_in_the_path_cannot_forge_log_lines(server) -> None:
    forged = "2001-01-01 00:00:00,000 chair_server POST /v1/chair 200 captions=999"
    path = "/nope%0d%0a" + forged.replace(" ", "%20") + "%1b[31m"
    status, _, _ = raw_exchange(server.url, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert status == 404
    log = ""
    for _ in range(100):  # the access line is written right after the answer
        log = server.log_text()
        if "/nope" in log:
            break
        time.sleep(0.05)
    lines = log.splitlines()
    assert not any(line.startswith("2001-01-01") for line in lines)
    (line,) = [line for line in lines if "/nope" in line]
    assert "/nope\\r\\n2001-01-01" in line and "\\x1b[31m" in line and "\x1b" not in line


# --- connections ------------------------------------------------------------------------------
def test_idle_and_slow_connections_do_not_lock_clients_out(server) -> None:
    """150 open sockets (idle, or trickling a request): more than waitress's default limit."""
    host, port = address(server.url)
    held = []
    try:
        for i in range(150):
            sock = socket.create_connection((host, port), timeout=10)
            if i % 2:
                sock.sendall(b"POST /v1/chair HTTP/1.1\r\nHost: x\r\nContent-Le")
            held.append(sock)
        for sock in held[1::2]:
            sock.sendall(b"n")  # still trickling
        client = ChairClient(server.url, timeout=5, retries=0)
        assert client.health(timeout=5)
        result = client.score([{"image_id": 1001, "caption": "A dog."}])
        assert client.is_scored(result[0])
    finally:
        for sock in held:
            sock.close()


def test_idle_connections_are_closed_after_the_channel_timeout(session_gt_file) -> None:
    srv = start_server(ground_truth=session_gt_file, extra_args=["--channel-timeout", "1"])
    with srv, socket.create_connection(address(srv.url), timeout=30) as sock:
        started = time.monotonic()
        assert sock.recv(1) == b""  # the server closed it
        assert time.monotonic() - started < 25


def test_sigterm_finishes_requests_in_flight_then_exits_0(session_gt_file) -> None:
    srv = start_server(ground_truth=session_gt_file)
    try:
        body = json.dumps(
            {"captions": [{"image_id": 1001, "caption": "A man with a dog."}] * 20}
        ).encode()
        with socket.create_connection(address(srv.url), timeout=30) as sock:
            # one full exchange first, so this connection is surely accepted
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(sock)[0] == 200
            head = (
                f"POST /v1/chair HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            sock.sendall(head + body[:50])
            time.sleep(0.3)
            srv.process.send_signal(signal.SIGTERM)
            # new connections are refused once the server has stopped listening
            refused = False
            for _ in range(100):
                try:
                    socket.create_connection(address(srv.url), timeout=1).close()
                except OSError:
                    refused = True
                    break
                time.sleep(0.05)
            assert refused
            assert srv.alive()  # still draining: the request above is not complete
            sock.sendall(body[50:])
            status, _, answer = read_response(sock)
        assert status == 200
        result = json.loads(answer)
        assert len(result["sentences"]) == 20 and result["overall_metrics"]["captions"] == 20
        assert srv.process.wait(30) == 0
    finally:
        srv.stop()


def test_memory_per_request_stays_bounded(session_gt_file) -> None:
    """A 4 MiB request of 262 captions, each 4,000 hallucinated mentions: the answer (24 MiB)
    is streamed, so the server's peak memory grows by a fraction of what building it whole
    costs (about 150 MiB)."""
    if not Path("/proc/self/status").exists():
        pytest.skip("reads peak memory from /proc")
    with start_server(ground_truth=session_gt_file) as srv:
        items = [{"image_id": 1001, "caption": "cat " * 4000}] * 262
        before = _peak_kib(srv.pid)
        request = urllib.request.Request(
            srv.url + "/v1/chair",
            data=json.dumps({"captions": items}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            size = 0
            while chunk := response.read(1 << 20):
                size += len(chunk)
        grown_mib = (_peak_kib(srv.pid) - before) / 1024
        assert size > 20 * 2**20  # the answer itself
        assert grown_mib < 90, f"peak memory grew by {grown_mib:.0f} MiB"


def _peak_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


# --- authentication -------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_bearer_scheme_is_case_insensitive(token_server_url, scheme: str) -> None:
    body = {"captions": [{"image_id": 1001, "caption": "a dog"}]}
    headers = {"Authorization": f"{scheme} s3cret"}
    assert call(token_server_url, "/v1/chair", body, headers=headers)[0] == 200
    headers = {"Authorization": f"{scheme} wrong"}
    assert call(token_server_url, "/v1/chair", body, headers=headers)[0] == 401


# --- start-up -------------------------------------------------------------------------------
def run_server(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """The server binds its port before it reads the ground truth: without ``--port`` it gets
    port 0, so no check here depends on a fixed port (the default 5000) being free."""
    port = () if "--port" in args else ("--port", "0")
    return subprocess.run(
        [sys.executable, "-m", "chair_server", *args, *port],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_port_in_use_fails_before_the_ground_truth_is_read(tmp_path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        # a missing ground-truth file: the port must be the error reported, in one line
        run = run_server("--ground-truth", str(tmp_path / "missing.json"), "--port", str(port))
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and "cannot listen" in run.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--host", "no-such-host.invalid"], "cannot listen"),
        (["--host", "256.1.1.1"], "cannot listen"),
        (["--ready-file", "/no/such/folder/url"], "ready_file"),
        (["--max-body-mb", "nan"], "max_body_mb"),
        (["--max-body-mb", "inf"], "max_body_mb"),
        (["--max-body-mb", "1e-9"], "max_body_mb"),
        (["--max-body-mb", "-1"], "max_body_mb"),
        (["--token", ""], "token must not be empty"),
        (["--max-caption-chars", "0"], "max_caption_chars"),
        (["--drain-timeout", "nan"], "drain_timeout"),
    ],
)
def test_bad_settings_fail_in_one_line_before_loading(tmp_path, args, message) -> None:
    run = run_server("--ground-truth", str(tmp_path / "missing.json"), *args)
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0, run.stderr
    assert message in run.stderr and "ground truth" not in run.stderr


def test_empty_ground_truth_is_refused(tmp_path) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    run = run_server("--ground-truth", str(empty))
    assert run.returncode == 2 and "no images" in run.stderr


def test_open_host_without_token_warns(tmp_path) -> None:
    settings = ServerSettings(ground_truth="gt.json", host="0.0.0.0")
    assert "no --token" in settings.warnings()[0]
    assert ServerSettings(ground_truth="gt.json", host="0.0.0.0", token="t").warnings() == []
    assert ServerSettings(ground_truth="gt.json").warnings() == []
    # the command line prints it (then fails on the missing file, so nothing is served)
    run = run_server("--ground-truth", str(tmp_path / "missing.json"), "--host", "0.0.0.0")
    assert run.returncode == 2 and "warning" in run.stderr and "no --token" in run.stderr


def test_environment_token_and_readiness_still_work(session_gt_file, tmp_path) -> None:
    env = {**os.environ, "CHAIR_SERVER_TOKEN": "from-env"}
    ready = tmp_path / "url"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "chair_server",
            "--ground-truth",
            str(session_gt_file),
            "--port",
            "0",
            "--ready-file",
            str(ready),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(600):
            if ready.is_file():
                break
            time.sleep(0.05)
        url = ready.read_text()
        body = {"captions": [{"image_id": 1001, "caption": "a dog"}]}
        assert call(url, "/v1/chair", body)[0] == 401
        headers = {"Authorization": "Bearer from-env"}
        assert call(url, "/v1/chair", body, headers=headers)[0] == 200
    finally:
        process.terminate()
        assert process.wait(30) == 0


def test_concurrent_clients_during_shutdown_get_whole_answers_or_refusals(session_gt_file) -> None:
    """Clients hammering the service while it stops: every answer is complete JSON."""
    srv = start_server(ground_truth=session_gt_file, extra_args=["--workers", "4"])
    outcomes: list[str] = []
    items = [{"image_id": 1001, "caption": "A man with a dog at a table."}] * 200

    def worker() -> None:
        client = ChairClient(srv.url, timeout=10, retries=0)
        for _ in range(20):
            result = client.score(items)
            if result[0] is None:
                outcomes.append("fallback")
            elif len(result) == 200 and all(r["metrics"]["mentions"] == 3 for r in result):
                outcomes.append("ok")
            else:
                outcomes.append(f"bad: {result[:1]}")

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for _ in range(1200):  # stop once answers are flowing
        if "ok" in outcomes:
            break
        time.sleep(0.05)
    srv.process.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join(120)
    assert srv.process.wait(30) == 0
    assert "ok" in outcomes and not [o for o in outcomes if o.startswith("bad")]
