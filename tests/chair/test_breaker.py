"""ChairClient's circuit breaker and its status lines, against real services and closed ports."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from chair_server.launch import start_server
from entropyrl.rewards.chair_client import ChairClient, ChairServiceError

ITEMS = [{"image_id": 1001, "caption": "A man and a cat."}] * 3


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "entropyrl.rewards.chair_client"]


def test_after_a_failure_calls_stop_instead_of_paying_retries(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="entropyrl.rewards.chair_client")
    url = f"http://127.0.0.1:{closed_port()}"
    client = ChairClient(url, retries=2, backoff=0.01, breaker_cooldown=600)
    assert client.score(ITEMS) == [None] * 3
    assert client.stats["requests"] == 3 and not client.available
    for _ in range(5):  # every later batch: the fallback at once, no request, no retry
        assert client.score(ITEMS) == [None] * 3
    stats = client.stats
    assert stats["requests"] == 3 and stats["retries"] == 2
    assert stats["skipped_calls"] == 5 and stats["fallback_samples"] == 18
    assert stats["outages"] == 1
    (line,) = lines(caplog)
    assert line.startswith(f"CHAIR service at {url} stopped answering")
    assert "/health probe in 600 s" in line
    strict = ChairClient(url, retries=0, strict=True, breaker_cooldown=600)
    with pytest.raises(ChairServiceError, match="failed"):
        strict.score(ITEMS)
    with pytest.raises(ChairServiceError, match="is down"):  # at once, no request
        strict.score(ITEMS)
    assert strict.stats["requests"] == 1


def test_half_open_probe_brings_calls_back_when_the_service_returns(
    session_gt_file, caplog
) -> None:
    caplog.set_level(logging.WARNING, logger="entropyrl.rewards.chair_client")
    port = closed_port()
    client = ChairClient(f"http://127.0.0.1:{port}", retries=1, backoff=0.01, breaker_cooldown=0.05)
    assert client.score(ITEMS) == [None] * 3
    with start_server(ground_truth=session_gt_file, port=port):
        deadline = time.monotonic() + 30
        while (result := client.score(ITEMS))[0] is None:  # skipped until the cooldown is over
            assert time.monotonic() < deadline
            time.sleep(0.01)
    assert result[0]["metrics"]["CHAIRi"] == 0.5 and client.available
    stats = client.stats
    # two attempts of the failed call, then the one call after a successful probe
    assert stats["requests"] == 3 and stats["outages"] == 1
    down, back = lines(caplog)
    assert "stopped answering" in down
    assert f"CHAIR service at http://127.0.0.1:{port} answers again after" in back
    assert f"({stats['fallback_samples']} samples fell back meanwhile)" in back


def test_failed_probes_back_off_and_never_post() -> None:
    client = ChairClient(
        f"http://127.0.0.1:{closed_port()}",
        retries=0,
        breaker_cooldown=0.0,
        breaker_max_cooldown=0.0,
    )
    for _ in range(20):  # cooldown 0: a /health probe at each call, never a POST
        assert client.score(ITEMS) == [None] * 3
    stats = client.stats
    assert stats["requests"] == 1 and stats["skipped_calls"] == 19 and stats["outages"] == 1


def test_without_breaker_every_call_retries_and_the_status_is_still_reported(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="entropyrl.rewards.chair_client")
    client = ChairClient(
        f"http://127.0.0.1:{closed_port()}", retries=1, backoff=0.01, breaker_cooldown=None
    )
    for _ in range(3):
        client.score(ITEMS)
    assert client.stats["requests"] == 6 and client.stats["skipped_calls"] == 0
    assert len(lines(caplog)) == 1


def test_bad_breaker_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="breaker_cooldown"):
        ChairClient("http://127.0.0.1:9", breaker_cooldown=-1)
    with pytest.raises(ValueError, match="breaker_max_cooldown"):
        ChairClient("http://127.0.0.1:9", breaker_cooldown=10, breaker_max_cooldown=1)


def test_the_two_status_lines_reach_stderr_without_any_logging_setup(session_gt_file) -> None:
    """What a user of a plain script sees: one line when the service goes, one when it is back."""
    script = textwrap.dedent(
        f"""
        import socket
        from chair_server.launch import start_server
        from entropyrl.rewards.chair_client import ChairClient

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        client = ChairClient(f"http://127.0.0.1:{{port}}", retries=0, breaker_cooldown=0)
        items = [{{"image_id": 1001, "caption": "A dog."}}]
        for _ in range(3):
            assert client.score(items) == [None]
        with start_server(ground_truth={str(session_gt_file)!r}, port=port):
            for _ in range(3):
                assert client.score(items)[0] is not None
        print("done")
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert run.returncode == 0 and run.stdout.strip() == "done", run.stderr
    err = run.stderr.splitlines()
    assert len(err) == 2, run.stderr
    assert "stopped answering" in err[0] and "answers again" in err[1]
