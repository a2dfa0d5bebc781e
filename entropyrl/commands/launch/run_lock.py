"""One launch per run folder. Two launches of the same command would train side by side into
one checkpoint folder and one metrics file (the second "resumes" beside the first), so the
launch holds a lock on the folder from its start to its exit and a second launch is refused in
one line that names the holder.

The lock is a POSIX record lock (`fcntl.lockf`) on `<folder>/.entropyrl-launch.lock`: the kernel
(or the NFS lock manager, for a folder shared by several nodes) drops it when its holder exits,
however it exits, so a lock left by a killed launch is stale and taken over without a word. The
file keeps the holder's pid, host, start time and command, for the refusal's line."""

from __future__ import annotations

import fcntl
import json
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

LOCK_NAME = ".entropyrl-launch.lock"


@dataclass
class RunLock:
    """A held lock: `release()` (or the holder's exit) frees the folder."""

    path: Path
    handle: IO[str]

    def release(self) -> None:
        if self.handle.closed:
            return
        self.handle.seek(0)
        self.handle.truncate()  # the file stays (removing it would race a launch opening it)
        self.handle.flush()
        self.handle.close()  # closing drops the lock


def take(folder: Path, command: Sequence[str]) -> RunLock | str:
    """Lock `folder` for this process; the lock, or the line saying who holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 (held open: the lock lives with it)
    try:
        fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = _holder(handle.read())
        handle.close()
        return (
            f"{folder} is in use by another launch ({holder}): wait for it to end or stop it, "
            "or give this run another folder (trainer.experiment_name, or --out for a smoke)"
        )
    handle.seek(0)
    handle.truncate()
    started = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": started}
    handle.write(json.dumps({**record, "command": list(command)}) + "\n")
    handle.flush()
    return RunLock(path, handle)


def _holder(text: str) -> str:
    """`pid 123 on host h, since <time>` from the lock file (its writer may still be writing)."""
    try:
        record = json.loads(text)
        return f"pid {record['pid']} on host {record['host']}, since {record['started']}"
    except (ValueError, KeyError, TypeError):
        return "a launch that is starting"
