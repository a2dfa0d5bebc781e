"""Ctrl-C in `python -m chair_server.evaluate`: one line, exit 130, no output file or a whole one."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import struct
import subprocess
import sys
import termios
import time

import pytest

from chair_server.evaluate import main, write_json_whole


def wait_until_blocked_reading(pid: int, writer: int, timeout: float = 60.0) -> None:
    """Until the reader has drained the FIFO and sleeps (blocked in its next read). A SIGINT
    that lands while CPython is still in C code between two reads is only acted on at its next
    bytecode check, which a read that then blocks never reaches: the evaluator would wait on
    the open FIFO, not on Ctrl-C (seen under load). A read blocked in the kernel is interrupted
    and raises KeyboardInterrupt, which is what Ctrl-C while reading means."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        unread = struct.unpack("i", fcntl.ioctl(writer, termios.FIONREAD, b"\0" * 4))[0]
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            state = stat.read().rpartition(")")[2].split()[0]
        if unread == 0 and state == "S":
            return
        time.sleep(0.01)
    raise AssertionError(f"the evaluator did not block reading the FIFO within {timeout} s")


def test_ctrl_c_while_reading_the_captions(tmp_path, gt_file) -> None:
    captions = tmp_path / "caps.jsonl"
    os.mkfifo(captions)  # the evaluator blocks reading it until the test closes its end
    out = tmp_path / "out.json"
    command = [sys.executable, "-m", "chair_server.evaluate", "--captions", str(captions)]
    command += ["--ground-truth", str(gt_file), "--json", str(out)]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with open(captions, "w", encoding="utf-8") as writer:  # returns once it reads
            writer.write(json.dumps({"image_id": 1001, "caption": "A man and a cat."}) + "\n")
            writer.flush()
            wait_until_blocked_reading(process.pid, writer.fileno())
            process.send_signal(signal.SIGINT)
            stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, stderr
    assert stderr == f"interrupted while reading {captions}; nothing written\n"
    assert stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["caps.jsonl", "gt.json"]


def test_ctrl_c_in_process_is_one_line_and_130(tmp_path, gt_file, monkeypatch, capsys) -> None:
    captions = tmp_path / "caps.jsonl"
    captions.write_text(json.dumps({"image_id": 1001, "caption": "A cat."}) + "\n")

    def interrupted(self, items):
        raise KeyboardInterrupt

    monkeypatch.setattr("chair_server.scorer.ChairScorer.score", interrupted)
    code = main(["--captions", str(captions), "--ground-truth", str(gt_file)])
    assert code == 130
    assert capsys.readouterr().err == "interrupted while scoring 1 captions; nothing written\n"


def test_json_output_is_whole_or_absent(tmp_path) -> None:
    out = tmp_path / "out.json"
    with pytest.raises(TypeError):  # fails half-way through the document
        write_json_whole({"a": list(range(1000)), "b": object()}, out)
    assert list(tmp_path.iterdir()) == []
    write_json_whole({"a": 1}, out)
    assert json.loads(out.read_text()) == {"a": 1}
    assert list(tmp_path.iterdir()) == [out]
