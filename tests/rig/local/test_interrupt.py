"""Ctrl-C in `entropyrl demo`: one line on stderr, exit 130, whole JSON lines, service stopped."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TINY = [
    "--num-train", "16", "--num-test", "4", "--image-size", "56", "--max-objects", "1",
    "--hidden-size", "64", "--warmup-steps", "12", "--warmup-batch", "4",
    "--prompts-per-step", "2", "--samples-per-prompt", "2", "--max-new-tokens", "8",
    "--eval-max-new-tokens", "8", "--threads", "1", "--adv", "egpo",
]  # fmt: skip
PROGRESS_LINE = re.compile(r"^(warm-up|RL \S+) \d+/\d+( \S+ \S+)*$")


def test_interrupt_is_one_line_and_130(tmp_path, capsys):
    from entropyrl.rig.local.config import DemoConfig
    from entropyrl.rig.local.interrupts import run_interruptible
    from entropyrl.rig.local.progress import Progress

    def run(cfg):
        bar = Progress("RL egpo+clip", 40, enabled=False, where="RL step {step} of egpo+clip")
        bar.update(12, {"reward": 0.5})
        raise KeyboardInterrupt

    previous = signal.getsignal(signal.SIGINT)
    code = run_interruptible(run, DemoConfig(out=str(tmp_path / "run")))
    assert code == 130
    assert capsys.readouterr().err == (
        f"interrupted at RL step 12 of egpo+clip; partial outputs in {tmp_path / 'run'}\n"
    )
    assert signal.getsignal(signal.SIGINT) is previous  # the caller's handler is back


def _children(pid: int) -> dict[int, str]:
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found[int(stat.parent.name)] = cmdline
    return found


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def _wait(predicate, what: str, process: subprocess.Popen, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if process.poll() is not None:
            raise AssertionError(f"the demo exited ({process.returncode}) before {what}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _rl_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["phase"] == "rl"]


@pytest.mark.slow
def test_ctrl_c_during_rl(tmp_path, entropyrl_cache):
    out = tmp_path / "run"
    metrics = out / "metrics.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CHAIR_CACHE_DIR": str(tmp_path / "chair")}
    process = subprocess.Popen(
        [sys.executable, "-m", "entropyrl", "demo", "--out", str(out), "--steps", "500", *TINY],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,  # not a terminal: plain progress lines
        text=True,
        env=env,
    )
    try:
        _wait(lambda: len(_rl_records(metrics)) >= 2, "two RL steps", process)
        services = [p for p, cmd in _children(process.pid).items() if "chair_server" in cmd]
        assert len(services) == 1, _children(process.pid)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, stderr
    *progress, last = stderr.splitlines()
    match = re.fullmatch(r"interrupted at RL step (\d+) of (\S+); partial outputs in (.+)", last)
    assert match, stderr
    assert match.group(3) == str(out)
    assert "Traceback" not in stderr and "\r" not in stderr
    assert progress and all(PROGRESS_LINE.match(line) for line in progress), progress
    # whole lines only, the finished RL steps in order, the step in progress not among them
    text = metrics.read_text()
    assert text.endswith("\n")
    rl = _rl_records(metrics)
    assert [r["step"] for r in rl] == list(range(len(rl)))
    assert int(match.group(1)) in (len(rl) - 1, len(rl))
    assert {r["variant"] for r in rl} == {match.group(2)}
    deadline = time.monotonic() + 30
    while not _gone(services[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(services[0]), "the CHAIR service outlived the demo"
    assert not (out / "summary.json").exists()
