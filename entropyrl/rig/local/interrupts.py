"""Ctrl-C and SIGTERM in a local run: one line and exit status 130, never an orphaned service.

`run_interruptible(run, cfg)` is what `entropyrl demo`, the acceptance study and the ablation
study run their work through: SIGTERM unwinds like Ctrl-C (so the `with` blocks stop the CHAIR
service subprocess), a second Ctrl-C does not cut that unwinding short, and the one line printed
names where the run was (`entropyrl.rig.local.progress.position`).
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable
from typing import Any

from entropyrl.rig.local.progress import position, set_position

__all__ = ["exit_on_sigterm", "interrupt_once", "run_interruptible"]


def exit_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so the CHAIR service subprocess is stopped, not orphaned."""
    with contextlib.suppress(ValueError):  # ValueError: not the main thread
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def interrupt_once() -> Any:
    """The first Ctrl-C raises KeyboardInterrupt; later ones are ignored, so the unwinding that
    stops the CHAIR service (bounded: SIGTERM, then SIGKILL) is not cut short. Returns the
    handler it replaced (None off the main thread, where nothing is installed)."""

    def interrupt(signum: int, frame: object) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGINT, interrupt)
    except ValueError:  # not the main thread
        return None


def run_interruptible(run: Callable[[Any], Any], cfg: Any) -> int:
    """`run(cfg)` with SIGTERM and Ctrl-C handled: its exit status when it returns one (an
    int; anything else: 0); on Ctrl-C, once the `with` blocks have stopped the service, one
    line on stderr and 130 (128 + SIGINT). `cfg.out` is the output folder the line names."""
    exit_on_sigterm()
    previous = interrupt_once()
    set_position("setup")
    try:
        code = run(cfg)
    except KeyboardInterrupt:
        print(
            f"interrupted at {position()}; partial outputs in {cfg.out}",
            file=sys.stderr,
            flush=True,
        )
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    return code if isinstance(code, int) else 0
