"""Progress output: plain lines (no carriage returns) off a terminal, a bar on one; the position."""

from __future__ import annotations

import io
import os
import select
import subprocess
import sys

from entropyrl.rig.local.progress import Progress, is_terminal, position, set_position


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_plain_lines_every_n_steps_and_after_the_last():
    stream = io.StringIO()
    bar = Progress("warm-up", 900, stream=stream, every=300, seconds=None)
    for done in range(1, 901):
        bar.update(done, {"loss": 1.2344 + done / 1000})
    bar.close()
    assert stream.getvalue().splitlines() == [
        "warm-up 300/900 loss 1.534",
        "warm-up 600/900 loss 1.834",
        "warm-up 900/900 loss 2.134",
    ]
    assert "\r" not in stream.getvalue()


def test_plain_lines_every_few_seconds_when_steps_are_slow():
    stream, clock = io.StringIO(), FakeClock()
    bar = Progress("control", None, stream=stream, seconds=10.0, clock=clock)
    for done in range(1, 6):
        clock.now += 4.0
        bar.update(done, {"loss": 0.5})
    bar.close()  # the last step (5) had no line yet
    assert stream.getvalue().splitlines() == [
        "control 3 loss 0.500",
        "control 5 loss 0.500",
    ]


def test_rl_line_puts_reward_and_chair_first_and_leaves_the_step_to_the_count():
    stream = io.StringIO()
    bar = Progress("RL egpo+clip", 2, stream=stream, where="RL step {step} of egpo+clip")
    metrics = {"step": 0, "reward": 0.25, "chair_i": 0.125, "cider": 0.5, "entropy": 1.0}
    bar.update(1, metrics)
    bar.update(2, {**metrics, "step": 1})
    bar.close()
    assert stream.getvalue().splitlines() == [
        "RL egpo+clip 1/2 reward 0.250 chair_i 0.125 cider 0.500 entropy 1.000",
        "RL egpo+clip 2/2 reward 0.250 chair_i 0.125 cider 0.500 entropy 1.000",
    ]


def test_the_runner_shows_reward_and_chair_first():
    from entropyrl.rig.local.runner import RL_PROGRESS

    assert RL_PROGRESS[:2] == ("reward", "chair_i")


def test_position_names_the_step_in_progress():
    set_position("setup")
    bar = Progress("RL egpo", 5, enabled=False, where="RL step {step} of egpo")
    assert position() == "RL step 0 of egpo"
    bar.update(3, {"reward": 0.1})
    assert position() == "RL step 3 of egpo"
    Progress("warm-up", 10, enabled=False)
    assert position() == "warm-up step 0"


def test_disabled_prints_nothing():
    stream = io.StringIO()
    bar = Progress("warm-up", 3, enabled=False, stream=stream)
    for done in range(1, 4):
        bar.update(done, {"loss": 1.0})
    bar.close()
    assert stream.getvalue() == ""


def _pty(columns: int):
    import fcntl
    import struct
    import termios

    main, child = os.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    return main, os.fdopen(child, "w")


def test_a_pipe_and_a_zero_column_terminal_get_plain_lines():
    assert not is_terminal(io.StringIO())
    read, write = os.pipe()
    with os.fdopen(write, "w") as pipe:
        assert not is_terminal(pipe)
    os.close(read)
    main, terminal = _pty(0)
    with terminal:
        assert terminal.isatty() and not is_terminal(terminal)
    os.close(main)


def _read_all(fd: int) -> str:
    """Everything written to the pty so far: one os.read returns only what one write put there."""
    chunks = []
    while select.select([fd], [], [], 0.5)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode()


def test_a_terminal_with_a_width_gets_a_bar():
    main, terminal = _pty(80)
    try:
        with terminal:
            assert is_terminal(terminal)
            bar = Progress("warm-up", 3, stream=terminal)
            for done in range(1, 4):
                bar.update(done, {"loss": 1.0})
            bar.close()
            terminal.flush()
            drawn = _read_all(main)
        assert "\r" in drawn and "3/3" in drawn and "loss=1.000" in drawn
    finally:
        os.close(main)


def test_non_tty_subprocess_gets_lines_without_carriage_returns():
    code = (
        "from entropyrl.rig.local.progress import Progress\n"
        "bar = Progress('warm-up', 40, every=10, seconds=None)\n"
        "for i in range(1, 41):\n"
        "    bar.update(i, {'loss': 2.0})\n"
        "bar.close()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "\r" not in result.stderr
    assert result.stderr.splitlines() == [f"warm-up {n}/40 loss 2.000" for n in (10, 20, 30, 40)]
