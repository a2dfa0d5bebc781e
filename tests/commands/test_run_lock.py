"""A launch never outlives its launcher and never shares its run folder.

- `chair_server.launch.die_with_parent`: a child started with it dies when the process that
  started it is killed with SIGKILL (a control child started without it lives on, so the test
  tells the two apart);
- `entropyrl.commands.launch.run_lock`: a folder held by a live launch (another process) is
  refused in one line naming its pid and host; the lock of a killed holder is stale and taken;
- through `examples/chair_mscoco.sh --smoke`: a second launch into a run folder in use stops
  with exit status 2 and that line, before it builds or trains anything.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from chair_server.launch import die_with_parent
from entropyrl.commands.launch import run_lock

REPO = Path(__file__).resolve().parents[2]

# A launcher stand-in: starts `sleep` (with or without die_with_parent) and prints its pid.
LAUNCHER = """
import subprocess, sys, time
from chair_server.launch import die_with_parent
armed = sys.argv[1] == "armed"
child = subprocess.Popen(["sleep", "300"], preexec_fn=die_with_parent() if armed else None)
print(child.pid, flush=True)
time.sleep(300)
"""

# A holder stand-in: takes the folder's lock, says so, and waits.
HOLDER = """
import sys, time
from pathlib import Path
from entropyrl.commands.launch import run_lock
lock = run_lock.take(Path(sys.argv[1]), ["holder"])
print("held" if not isinstance(lock, str) else lock, flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by init, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return not _alive(pid)


def _launcher(armed: bool) -> tuple[subprocess.Popen, int]:
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, "armed" if armed else "plain"],
        stdout=subprocess.PIPE,
        text=True,
    )
    return launcher, int(launcher.stdout.readline())


def test_a_child_started_with_die_with_parent_dies_with_a_killed_launcher():
    launcher, child = _launcher(armed=True)
    assert _alive(child)
    launcher.kill()
    launcher.wait()
    assert _gone_within(child, 30)


def test_without_it_the_child_outlives_a_killed_launcher():
    """The control: what a trainer started without the parent-death signal does."""
    launcher, child = _launcher(armed=False)
    launcher.kill()
    launcher.wait()
    try:
        assert not _gone_within(child, 2)
    finally:
        os.kill(child, signal.SIGKILL)


def test_die_with_parent_arms_nothing_off_linux(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert die_with_parent() is None


def _holder(folder: Path) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_folder_held_by_a_live_launch_is_refused_naming_it(tmp_path):
    folder = tmp_path / "checkpoints"
    holder = _holder(folder)
    try:
        refusal = run_lock.take(folder, ["second"])
        assert isinstance(refusal, str)
        assert refusal.startswith(
            f"{folder} is in use by another launch (pid {holder.pid} on host "
            f"{socket.gethostname()}, since "
        )
        assert "give this run another folder" in refusal
        assert "\n" not in refusal
    finally:
        holder.kill()
        holder.wait()
    # its holder gone, the lock is stale: taken, and the file names the new holder
    lock = run_lock.take(folder, ["third"])
    assert isinstance(lock, run_lock.RunLock)
    record = json.loads(lock.path.read_text())
    assert record["pid"] == os.getpid() and record["command"] == ["third"]
    lock.release()
    assert lock.path.read_text() == ""
    holder = _holder(folder)  # released: another launch takes it
    holder.kill()
    holder.wait()


def test_a_second_smoke_launch_into_a_folder_in_use_stops_in_one_line(tmp_path):
    out = tmp_path / "run"
    holder = _holder(out / "checkpoints")
    env = {k: v for k, v in os.environ.items() if k not in ("N_GPUS", "DRY_RUN")}
    env["RAY_TMPDIR"] = str(tmp_path / "ray")
    try:
        result = subprocess.run(
            ["bash", str(REPO / "examples" / "chair_mscoco.sh"), "--smoke", "--out", str(out)],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=300,
        )
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: {out / 'checkpoints'} is in use by another launch (pid {holder.pid} on host "
        + errors[0].split(" on host ", 1)[1]
    ]
    assert "Traceback" not in result.stderr
    assert not (out / "run.log").exists()  # nothing trained
