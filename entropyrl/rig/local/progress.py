"""Progress of a local run: a bar on a terminal, plain lines in a log, and where the run is.

On a terminal (stderr a TTY that reports a width) each phase draws a tqdm bar that redraws in
place. Anywhere else (a file, a pipe, CI, a terminal that reports 0 columns) it prints one plain
line every `every` steps or `seconds` seconds, and after the last step, e.g.
`warm-up 300/900 loss 1.234`, never a carriage return.

`position()` names the step a run is in (`warm-up step 312`, `RL step 12 of egpo+clip`), for the
one line a Ctrl-C prints; phases set it through `Progress` or `set_position`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import IO, Any

__all__ = ["Progress", "format_metrics", "is_terminal", "position", "set_position"]

_position = "setup"


def position() -> str:
    """Where the run is now, e.g. `warm-up step 312` (the step in progress, numbered as in
    metrics.jsonl: the steps before it are finished)."""
    return _position


def set_position(where: str) -> None:
    global _position
    _position = where


def is_terminal(stream: IO[str]) -> bool:
    """True for a TTY that reports a width (a bar can redraw in place there)."""
    try:
        if not stream.isatty():
            return False
        return os.get_terminal_size(stream.fileno()).columns > 0
    except (AttributeError, OSError, ValueError):
        return False


def format_metrics(metrics: Mapping[str, Any]) -> str:
    """`name value` pairs in the given order, floats with 3 decimals."""
    parts = []
    for name, value in metrics.items():
        text = f"{value:.3f}" if isinstance(value, float) else str(value)
        parts.append(f"{name} {text}")
    return " ".join(parts)


class Progress:
    """Progress of one phase of `total` steps (None: open-ended, e.g. a time budget).

    `update(done, metrics)` after each finished step; `close()` at the end. `where` is the
    position's format, with `{step}` the step in progress (default `"{label} step {step}"`).
    `every=None` prints a plain line every tenth of `total`; `seconds=None` turns the timer off.
    """

    def __init__(
        self,
        label: str,
        total: int | None,
        *,
        enabled: bool = True,
        stream: IO[str] | None = None,
        where: str | None = None,
        every: int | None = None,
        seconds: float | None = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.where = where or f"{label} step {{step}}"
        self.every = every or (max(1, total // 10) if total else None)
        self.seconds = seconds
        self.clock = clock
        self.done = 0
        self.metrics: dict[str, Any] = {}
        self._printed = 0
        self._last = clock()
        self._bar = None
        self._enabled = enabled
        if enabled and is_terminal(self.stream):
            from tqdm import tqdm

            self._bar = tqdm(
                total=total, desc=label, file=self.stream, dynamic_ncols=True, leave=True
            )
        set_position(self.where.format(step=0))

    def update(self, done: int, metrics: Mapping[str, Any] | None = None) -> None:
        """`done` steps are finished; `metrics` (shown in this order) are the latest values; a
        `step` among them goes into the bar's postfix, a plain line's `done/total` says it."""
        if metrics is not None:
            self.metrics = dict(metrics)
        advanced, self.done = done - self.done, done
        set_position(self.where.format(step=done))
        if not self._enabled:
            return
        if self._bar is not None:
            self._bar.update(advanced)
            self._bar.set_postfix(
                {k: f"{v:.3f}" if isinstance(v, float) else v for k, v in self.metrics.items()},
                refresh=False,
            )
            return
        now = self.clock()
        due_steps = self.every is not None and done - self._printed >= self.every
        due_time = self.seconds is not None and now - self._last >= self.seconds
        if due_steps or due_time or (self.total is not None and done >= self.total):
            self._line()

    def _line(self) -> None:
        count = f"{self.done}/{self.total}" if self.total is not None else str(self.done)
        text = f"{self.label} {count}"
        shown = {k: v for k, v in self.metrics.items() if k != "step"}  # the count says it
        if shown:
            text += " " + format_metrics(shown)
        print(text, file=self.stream, flush=True)
        self._printed = self.done
        self._last = self.clock()

    def close(self) -> None:
        """Close the bar; in plain mode, a last line when the last step has none yet."""
        set_position(f"the end of {self.label}")
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._enabled and self.done > self._printed:
            self._line()
