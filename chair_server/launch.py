"""Start ``python -m chair_server`` as a subprocess on a free port and wait until it is healthy."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType


class ChairServerProcess:
    """A running CHAIR service: ``.url``, ``.pid``, ``.stop()``; a context manager that stops it."""

    def __init__(self, process: subprocess.Popen, url: str, log_path: Path) -> None:
        self.process = process
        self.url = url
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait up to ``timeout`` s, then SIGKILL. Returns the exit code."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)
        return self.process.returncode

    def __enter__(self) -> ChairServerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return ""


def start_server(
    *,
    coco: str | os.PathLike[str] | None = None,
    ground_truth: str | os.PathLike[str] | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    extra_args: Sequence[str] = (),
    timeout: float = 60.0,
) -> ChairServerProcess:
    """Start the service (``port=0``: a free port), wait for ``/health``, return the handle.

    The server's log goes to a temporary file (``.log_path``); its tail is in the error when the
    server exits or is not healthy within ``timeout`` seconds (then it is killed).
    """
    if (coco is None) == (ground_truth is None):
        raise ValueError("start_server needs exactly one of coco= or ground_truth=")
    workdir = Path(tempfile.mkdtemp(prefix="chair_server_"))
    ready = workdir / "url"
    log_path = workdir / "server.log"
    source = ["--coco", str(coco)] if coco is not None else ["--ground-truth", str(ground_truth)]
    command = [
        sys.executable,
        "-m",
        "chair_server",
        *source,
        "--host",
        host,
        "--port",
        str(port),
        "--ready-file",
        str(ready),
        *extra_args,
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    handle = ChairServerProcess(process, "", log_path)
    deadline = time.monotonic() + timeout
    try:
        while not ready.is_file():
            if process.poll() is not None:
                raise RuntimeError(
                    f"chair_server exited with code {process.returncode}:\n{_tail(log_path)}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"chair_server not ready after {timeout}s:\n{_tail(log_path)}")
            time.sleep(0.05)
        handle.url = ready.read_text().strip()
        while True:
            try:
                with urllib.request.urlopen(handle.url + "/health", timeout=2.0) as response:
                    if response.status == 200:
                        return handle
            except (urllib.error.URLError, OSError):
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise TimeoutError(f"chair_server not healthy after {timeout}s:\n{_tail(log_path)}")
            time.sleep(0.05)
    except BaseException:
        handle.stop(timeout=5.0)
        raise
