"""Start ``python -m chair_server`` as a supervised subprocess and wait until it is healthy.

``start_server`` is the library form; ``python -m chair_server --supervise ...`` runs the same
supervisor in the foreground (``examples/chair_mscoco.sh`` uses it for verl runs).

The launcher leaves nothing behind: the service's log is an anonymous temporary file (unlinked
at creation, so no exit path, Ctrl-C, SIGTERM or SIGKILL included, leaves a file or folder), and
the service is started with ``--parent-pid``, so it stops by itself when its launcher is gone.

Supervision: when the service dies (killed by a signal, or exits with a non-zero status) it is
started again after a delay that doubles with each failed start (``restart_delay``, capped at
``MAX_RESTART_DELAY``), on the same port when it is free, else on a new one (``.url`` changes;
an ``entropyrl.rewards.chair_client.ChairClient`` built from this handle follows it). Each event is one
WARNING line of the ``chair_server.launch`` logger and a ``launcher:`` line in the service log.
A service that exits with status 0 was stopped on purpose (SIGTERM or SIGINT, e.g. Ctrl-C in
the terminal) and is not restarted.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

log = logging.getLogger("chair_server.launch")

READY_LINE = "CHAIR server listening on "  # printed by ``python -m chair_server`` once serving
MAX_RESTART_DELAY = 30.0
MAX_FAILED_STARTS = 8  # consecutive failed restarts before the launcher gives up

_LIVE: weakref.WeakSet[ChairServerProcess] = weakref.WeakSet()


class _Stopping(Exception):
    """stop() was called while a restart was under way."""


class ChairServerProcess:
    """A running, supervised CHAIR service: ``.url``, ``.pid``, ``.restarts``, ``.stop()``.

    A context manager that stops it. Built by :func:`start_server` and by ``--supervise``;
    ``start()`` runs the first start. ``command(port)`` is the service's command line;
    ``log`` receives its output (default: an anonymous temporary file, read back for the ready
    line); ``ready_file``, when the command writes one, tells when it serves; ``keep_port``
    restarts only on the same port (clients given a fixed URL), retrying while it is taken.
    """

    def __init__(
        self,
        command: Callable[[int], list[str]],
        *,
        host: str,
        port: int,
        timeout: float,
        restart: bool,
        restart_delay: float,
        log: IO[bytes] | None = None,
        ready_file: str | None = None,
        keep_port: bool = False,
    ) -> None:
        self._command = command
        self._host = host
        self._timeout = timeout
        self._restart = restart
        self._restart_delay = restart_delay
        self._ready_file = Path(ready_file) if ready_file else None
        self._keep_port = keep_port
        # by default anonymous: the name is removed at creation, the space is freed when the
        # last of this process and the service closes it, whatever way either of them ends
        self._own_log = log is None
        self._log: IO[bytes] = log or tempfile.TemporaryFile(prefix="chair_server_")  # noqa: SIM115
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None
        self.process: subprocess.Popen | None = None
        self.url = ""
        self.port = port
        self.restarts = 0

    # state ------------------------------------------------------------------------------
    @property
    def pid(self) -> int:
        """The pid of the service process now serving (a restart gives a new one)."""
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        process = self.process
        return process is not None and process.poll() is None

    def log_text(self) -> str:
        """Everything the service (every restart of it) and the launcher wrote to the log."""
        return self._read_log(0)

    def supervising(self) -> bool:
        """True while the supervisor runs (it ends on stop(), a clean exit, or giving up)."""
        return self._supervisor is not None and self._supervisor.is_alive()

    # start, supervise, stop ---------------------------------------------------------------
    def _read_log(self, offset: int) -> str:
        try:
            fd = self._log.fileno()
            size = os.fstat(fd).st_size
            return os.pread(fd, max(0, size - offset), offset).decode("utf-8", "replace")
        except (OSError, ValueError):  # closed
            return ""

    def _note(self, message: str) -> None:
        log.warning("%s", message)
        if self._own_log:  # a log given by the caller is the caller's
            with contextlib.suppress(OSError, ValueError):  # the log was closed
                os.write(self._log.fileno(), f"launcher: {message}\n".encode())

    def _log_size(self) -> int:
        try:
            return os.fstat(self._log.fileno()).st_size
        except (OSError, ValueError):
            return 0

    def _ready_url(self, offset: int, port: int) -> str:
        """The URL once the service says it serves: the ready file, the line in the log, or
        (a log that cannot be read back, e.g. a terminal) the known port."""
        if self._ready_file is not None:
            try:
                return self._ready_file.read_text().strip()
            except OSError:
                return ""
        if self._own_log:
            for line in self._read_log(offset).splitlines():
                if line.startswith(READY_LINE):
                    return line[len(READY_LINE) :].strip()
            return ""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{port}" if port else ""

    def _spawn(self, port: int) -> tuple[subprocess.Popen, str]:
        """Start one service process on ``port``; return it and its URL once /health answers.

        The service gets a session of its own: a Ctrl-C in the terminal reaches the launcher,
        which stops the service in order, instead of both at once.
        """
        offset = self._log_size()
        if self._ready_file is not None:
            self._ready_file.unlink(missing_ok=True)
        process = subprocess.Popen(
            self._command(port),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + self._timeout
        url = ""
        try:
            while True:
                if self._stopping.is_set():
                    raise _Stopping
                url = url or self._ready_url(offset, port)
                if url and process.poll() is None and _healthy(url):
                    return process, url
                if process.poll() is not None:
                    raise RuntimeError(
                        f"chair_server exited with code {process.returncode}:\n"
                        f"{self._read_log(offset)[-2000:]}"
                    )
                if time.monotonic() > deadline:
                    state = "healthy" if url else "ready"
                    raise TimeoutError(
                        f"chair_server not {state} after {self._timeout}s:\n"
                        f"{self._read_log(offset)[-2000:]}"
                    )
                time.sleep(0.05)
        except BaseException:
            _terminate(process, 5.0)
            raise

    def start(self) -> None:
        """The first start (waits until healthy), then supervision when ``restart``."""
        self.process, self.url = self._spawn(self.port)
        self.port = int(self.url.rsplit(":", 1)[1])
        _LIVE.add(self)
        if self._restart:
            self._supervisor = threading.Thread(
                target=self._supervise, name="chair_server-supervisor", daemon=True
            )
            self._supervisor.start()

    def _supervise(self) -> None:
        """Wait on the service; start it again when it dies, until stop()."""
        while True:
            process = self.process
            assert process is not None
            code = process.wait()
            if self._stopping.is_set():
                return
            if code == 0:
                self._note(
                    f"CHAIR service at {self.url} (pid {process.pid}) exited with status 0 "
                    "(stopped by SIGTERM or SIGINT from outside the launcher): not restarting it"
                )
                return
            delay = self._restart_delay
            self._note(
                f"CHAIR service at {self.url} (pid {process.pid}) {_describe(code)}: "
                f"restarting it in {delay:g} s"
            )
            try:
                self._restart_once(delay)
            except _Stopping:
                return
            if not self.alive():  # gave up
                return

    def _restart_once(self, delay: float) -> None:
        port = self.port
        for attempt in range(1, MAX_FAILED_STARTS + 1):
            if self._stopping.wait(delay):
                raise _Stopping
            try:
                process, url = self._spawn(port)
            except (RuntimeError, TimeoutError) as error:
                reason = str(error).strip().splitlines()[-1]
                if attempt == MAX_FAILED_STARTS:
                    self._note(
                        f"CHAIR service could not be restarted ({attempt} attempts, last: "
                        f"{reason}): giving up; clients fall back until the run ends"
                    )
                    return
                if port and not self._keep_port and "cannot listen on" in str(error):
                    # someone else has the port: a new one now, no reason to wait
                    reason, port, delay = f"port {port} is taken", 0, 0.0
                else:
                    delay = min(MAX_RESTART_DELAY, max(2 * delay, self._restart_delay, 0.1))
                self._note(f"CHAIR service restart failed ({reason}): next try in {delay:g} s")
                continue
            moved = url != self.url
            with self._lock:
                self.process, self.url = process, url
                self.port = int(url.rsplit(":", 1)[1])
                self.restarts += 1
            self._note(
                f"CHAIR service restarted at {url} (pid {process.pid})"
                + (": a new address, clients built from this handle follow it" if moved else "")
            )
            return

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait up to ``timeout`` s, then SIGKILL; no restart after this. Returns the
        exit code of the last service process."""
        self._stopping.set()
        process = self.process
        if process is not None:
            _terminate(process, timeout)
        supervisor = self._supervisor
        if supervisor is not None and supervisor is not threading.current_thread():
            supervisor.join(timeout + 10.0)
        process = self.process  # a restart may have finished meanwhile
        if process is not None:
            _terminate(process, timeout)
        _LIVE.discard(self)  # the log stays readable until the handle is garbage-collected
        return process.returncode if process is not None else None

    def __enter__(self) -> ChairServerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2.0) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(signum: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets ``signum`` when the process
    that started it dies, however it dies (SIGKILL included), so that a long job (a trainer)
    never outlives its launcher. Linux's ``PR_SET_PDEATHSIG``, which survives ``exec``; None
    elsewhere (no such call), where the caller keeps its other ways of stopping the child.

    The child checks its parent once armed: a launcher that died between ``fork`` and
    ``prctl`` already has a new parent, and the child then signals itself."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before fork, not in the child
    launcher = os.getpid()

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != launcher:
            os.kill(os.getpid(), signum)

    return arm


def _terminate(process: subprocess.Popen, timeout: float) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


@atexit.register
def _stop_all() -> None:
    """Services whose handle was never stopped end with the interpreter, not after it."""
    for handle in list(_LIVE):
        handle.stop(timeout=5.0)


def start_server(
    *,
    coco: str | os.PathLike[str] | None = None,
    ground_truth: str | os.PathLike[str] | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    extra_args: Sequence[str] = (),
    timeout: float = 60.0,
    restart: bool = True,
    restart_delay: float = 0.5,
) -> ChairServerProcess:
    """Start the service (``port=0``: a free port), wait for ``/health``, return the handle.

    ``restart``: supervise it (see the module docstring); the first restart waits
    ``restart_delay`` seconds. The log (``.log_text()``) is in the error when the service exits
    or is not healthy within ``timeout`` seconds (then it is killed).
    """
    if (coco is None) == (ground_truth is None):
        raise ValueError("start_server needs exactly one of coco= or ground_truth=")
    if restart_delay < 0:
        raise ValueError(f"restart_delay must be >= 0, got {restart_delay}")
    source = ["--coco", str(coco)] if coco is not None else ["--ground-truth", str(ground_truth)]
    parent = str(os.getpid())

    def command(port: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "chair_server",
            *source,
            "--host",
            host,
            "--port",
            str(port),
            "--parent-pid",
            parent,
            *extra_args,
        ]

    handle = ChairServerProcess(
        command,
        host=host,
        port=port,
        timeout=timeout,
        restart=restart,
        restart_delay=restart_delay,
    )
    try:
        handle.start()
    except BaseException:
        handle.stop(timeout=5.0)
        raise
    return handle
