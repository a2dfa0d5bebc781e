"""Ctrl-C in `entropyrl prepare`: one line, exit 130, and only whole files in --out.

The child is the real command line with the second output's writer held open (a file half
written under its temporary name) until the signal comes, so the interrupt lands mid-write
whatever the machine's speed.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

CHILD = """
import sys, time
import entropyrl.data.mixed_debug as mixed
from entropyrl.core.files import atomic_path
from entropyrl.cli import main

real, calls = mixed.write_parquet, []

def stalled(rows, path):
    calls.append(path)
    if len(calls) == 1:
        return real(rows, path)
    with atomic_path(path) as tmp:
        tmp.write_bytes(b"PAR1 half a file")
        print("stalled", flush=True)
        time.sleep(120)

mixed.write_parquet = stalled
sys.exit(main(["prepare", "mixed-debug", "--out", sys.argv[1]]))
"""


def test_ctrl_c_mid_write_leaves_only_whole_files(tmp_path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "mixed"
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline() == "stalled\n"
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, stderr
    assert stderr == (
        f"interrupted during prepare mixed-debug; partial outputs in {out} "
        "(the files finished before it, each whole)\n"
    )
    assert stdout == ""  # no summary: the run did not finish
    assert [p.name for p in out.iterdir()] == ["train.parquet"]  # no temporary file left
    assert pq.read_table(out / "train.parquet").num_rows == 32
