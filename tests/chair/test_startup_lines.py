"""Start-up mistakes of `python -m chair_server`, each one line with the fix and exit 2: a
`--coco` folder that does not exist (the quick start's world before the quick start ran), and a
port another process holds."""

from __future__ import annotations

import socket
import subprocess
import sys


def chair(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "chair_server", *args],
        capture_output=True, text=True, cwd=cwd, timeout=120,
    )  # fmt: skip


def test_a_coco_folder_not_there_says_where_one_comes_from(tmp_path):
    result = chair("--coco", "runs/demo/world", cwd=tmp_path)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("chair_server: error: cannot load ground truth: ")
    assert "written by `entropyrl demo`: run it first), or use --ground-truth FILE" in line


def test_a_port_in_use_names_the_flag(tmp_path, session_gt_file):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = chair("--ground-truth", str(session_gt_file), "--port", str(port), cwd=tmp_path)
    assert result.returncode == 2
    (line,) = [line for line in result.stderr.splitlines() if "error" in line]
    assert line == (
        f"chair_server: error: cannot listen on 127.0.0.1:{port}: the port is in use (another "
        "CHAIR service?): give another with --port N, or --port 0 for a free one"
    )
