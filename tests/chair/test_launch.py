"""The launcher: nothing left behind on any exit path, and a service that dies is restarted.

Real processes throughout: a launcher script in a subprocess (its own temp folder, signalled
like a user would), real services on loopback ports, SIGKILL to kill them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from chair_server.launch import start_server
from entropyrl.rewards.chair_client import ChairClient

LAUNCHER = textwrap.dedent(
    """
    import sys, time
    from chair_server.launch import start_server

    mode = sys.argv[2]
    server = start_server(ground_truth=sys.argv[1])
    print(server.pid, flush=True)
    if mode == "normal":
        with server:
            pass
    elif mode == "error":
        with server:
            raise RuntimeError("boom")
    elif mode == "no-stop":
        pass  # the handle is never stopped: the interpreter's exit stops the service
    else:
        time.sleep(120)  # signalled by the test
    """
)


def gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie nobody reaped counts as exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.mark.parametrize("mode", ["normal", "error", "no-stop", "ctrl-c", "sigterm", "sigkill"])
def test_no_temp_folder_or_service_left_on_any_exit_path(tmp_path, session_gt_file, mode) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    env = {**os.environ, "TMPDIR": str(temp)}
    process = subprocess.Popen(
        [sys.executable, str(script), str(session_gt_file), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own process group, as a terminal job is
    )
    try:
        line = process.stdout.readline()
        assert line.strip().isdigit(), process.stderr.read()
        server_pid = int(line)
        if mode == "ctrl-c":
            os.killpg(process.pid, signal.SIGINT)  # the terminal signals the whole group
        elif mode == "sigterm":
            process.send_signal(signal.SIGTERM)
        elif mode == "sigkill":
            process.kill()
        process.wait(60)
        wait_for(lambda: gone(server_pid), f"service pid {server_pid} to exit after {mode}")
    finally:
        if process.poll() is None:
            process.kill()
    # an unhandled signal ends the launcher as that signal does, an exception with 1; the
    # service is gone in every case (checked above)
    expected = {
        "normal": 0,
        "no-stop": 0,
        "error": 1,
        "ctrl-c": -signal.SIGINT,
        "sigterm": -signal.SIGTERM,
        "sigkill": -signal.SIGKILL,
    }
    assert process.returncode == expected[mode]
    assert sorted(p.name for p in temp.iterdir()) == []


def test_a_killed_service_is_restarted_on_the_same_port(session_gt_file, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="chair_server.launch")
    with start_server(ground_truth=session_gt_file, restart_delay=0.1) as server:
        url, first = server.url, server.pid
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: server.restarts == 1 and server.alive(), "the restart")
        assert server.url == url and server.pid != first
        with urllib.request.urlopen(url + "/health", timeout=5) as response:
            assert json.loads(response.read())["status"] == "ok"
        log = server.log_text()
    assert f"launcher: CHAIR service at {url} (pid {first}) was killed by SIGKILL" in log
    assert f"launcher: CHAIR service restarted at {url}" in log
    messages = [r.getMessage() for r in caplog.records if r.name == "chair_server.launch"]
    assert len(messages) == 2 and "restarted" in messages[1]


def test_a_service_stopped_on_purpose_is_not_restarted(session_gt_file) -> None:
    with start_server(ground_truth=session_gt_file, restart_delay=0.0) as server:
        os.kill(server.pid, signal.SIGTERM)  # a clean shutdown (status 0)
        wait_for(lambda: "not restarting" in server.log_text(), "the launcher's note")
        assert server.restarts == 0 and not server.alive()


def test_failed_restarts_back_off_until_the_service_can_start(tmp_path, session_gt_file) -> None:
    truth = tmp_path / "gt.json"
    shutil.copy(session_gt_file, truth)
    with start_server(ground_truth=truth, restart_delay=0.05) as server:
        hidden = truth.rename(tmp_path / "hidden.json")  # the next starts fail: no ground truth
        os.kill(server.pid, signal.SIGKILL)
        wait_for(lambda: "restart failed" in server.log_text(), "a failed restart")
        hidden.rename(truth)
        wait_for(lambda: server.restarts == 1 and server.alive(), "the restart")
        assert "cannot load ground truth" in server.log_text()


def test_port_taken_restart_on_a_new_port_that_a_handle_client_follows(session_gt_file) -> None:
    items = [{"image_id": 1001, "caption": "A man and a cat."}]
    with start_server(ground_truth=session_gt_file, restart_delay=5.0) as server:
        old_url, port = server.url, server.port
        client = ChairClient(server, retries=0, breaker_cooldown=None)
        fixed = ChairClient(old_url, retries=0, timeout=0.5, breaker_cooldown=None)
        assert client.score(items)[0]["metrics"]["CHAIRi"] == 0.5
        os.kill(server.pid, signal.SIGKILL)
        pid = server.pid
        wait_for(lambda: gone(pid), "the service to die")
        squatter = socket.socket()
        try:
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            # the kernel frees the dead service's socket a moment after the process is gone
            wait_for(lambda: _bind(squatter, port) or server.restarts, "the port to be free")
            if server.restarts:
                pytest.skip("the restart took the port before the test could")
            squatter.listen(1)
            wait_for(lambda: server.restarts == 1, "the restart on a new port")
            assert server.url != old_url and server.port != port
            assert client.url == server.url
            assert client.score(items)[0]["metrics"]["CHAIRi"] == 0.5
            assert fixed.score(items) == [None]  # a client given the old URL string cannot know
        finally:
            squatter.close()
        assert "is taken" in server.log_text()


def _bind(sock: socket.socket, port: int) -> bool:
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


SERVICE = [sys.executable, "-m", "chair_server", "--ground-truth"]


def children(pid: int) -> list[int]:
    """Live child processes of ``pid``, started by any of its threads."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):  # the thread ended meanwhile
            found += [int(c) for c in (task / "children").read_text().split()]
    return sorted(c for c in found if not gone(c))


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def test_supervise_command_restarts_on_the_same_port_and_stops_cleanly(
    tmp_path, session_gt_file
) -> None:
    """`python -m chair_server --supervise`, as examples/chair_mscoco.sh starts it for verl."""
    ready, err = tmp_path / "url", tmp_path / "supervisor.err"
    with open(tmp_path / "service.log", "wb") as service_log, open(err, "wb") as errors:
        supervisor = subprocess.Popen(
            [
                *SERVICE,
                str(session_gt_file),
                "--port",
                "0",
                "--ready-file",
                str(ready),
                "--supervise",
            ],
            stdout=service_log,
            stderr=errors,
        )
    try:
        wait_for(lambda: "supervising the CHAIR service" in err.read_text(), "the first start")
        url = ready.read_text().strip()
        (first,) = children(supervisor.pid)
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: "CHAIR service restarted" in err.read_text(), "the restart", 60)
        (second,) = children(supervisor.pid)
        assert second != first and healthy(url) and ready.read_text().strip() == url
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(60) == 0
        wait_for(lambda: gone(second), "the service to stop with its supervisor")
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
    text = err.read_text()
    assert f"(pid {first}) was killed by SIGKILL" in text
    assert f"CHAIR service restarted at {url} (pid {second})" in text, text
    assert "listening on " + url in (tmp_path / "service.log").read_text()


def test_supervised_service_stops_when_its_supervisor_is_killed(tmp_path, session_gt_file) -> None:
    ready = tmp_path / "url"
    supervisor = subprocess.Popen(
        [*SERVICE, str(session_gt_file), "--ready-file", str(ready), "--port", "0", "--supervise"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(lambda: ready.exists() and children(supervisor.pid), "the first start")
    (service,) = children(supervisor.pid)
    supervisor.kill()
    supervisor.wait(10)
    wait_for(lambda: gone(service), "the orphaned service to stop by itself")
