"""A local sandbox for model-written Python: one short-lived, limited process per run.

What is enforced, and by what (see also `sandbox_child.py`, the child side):

| threat | kernel (always) | kernel (namespaces, when available) | Python guard in the child |
|---|---|---|---|
| infinite loop | RLIMIT_CPU (SIGXCPU, then SIGKILL) | | |
| sleeping / blocked program | parent's wall-clock deadline, then SIGKILL to the process group | the whole PID namespace dies with its init | |
| huge allocation | RLIMIT_AS | | |
| fork bomb, subprocesses | RLIMIT_NPROC (not for root) | PID namespace, killed as a whole | fork / exec / spawn / subprocess refused |
| network | | fresh network namespace (no interface up) | sockets refused |
| huge files / output | RLIMIT_FSIZE; parent stops reading and kills past `max_output_bytes` | | |
| writes outside the work dir | file permissions (not for root) | | writes, renames, links, deletions outside refused |
| parent's environment | child gets a clean environment; `-I` ignores PYTHON* variables | /proc shows only the namespace's processes | reads outside the work dir and the Python installation refused |

Every run gets a fresh temporary work directory (removed afterwards, whatever the program did)
and a new session (its own process group). The namespaces come from util-linux `unshare`
(network + PID + mount for a private /proc), used when a probe shows they work (root, or
unprivileged user namespaces); otherwise the kernel rows of that column are missing and the
Python guard carries them. The guard is an audit hook: it holds against Python code, including
code that monkeypatches `os` or builtins, but not against native code, which is why ctypes and
the few modules that reach native process or file APIs without an audit event are refused.
It is not a security boundary against a determined attacker with a kernel exploit; for that
scale, send code to a Sandbox Fusion service (`entropyrl.rewards.code`, `backend="sandbox_fusion"`).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from entropyrl.rewards.sandbox_child import CPU_EXIT_CODE, CPU_MARKER, DENIED_MARKER

__all__ = [
    "ISOLATION_MODES",
    "STATUSES",
    "Sandbox",
    "SandboxLimits",
    "SandboxResult",
    "namespace_prefix",
]

CHILD_SCRIPT = str(Path(__file__).with_name("sandbox_child.py"))
ISOLATION_MODES = ("auto", "namespaces", "none")
STATUSES = (
    "ok",
    "error",
    "timeout",
    "cpu_limit",
    "memory_limit",
    "output_limit",
    "denied",
    "killed",
)
# Tried in order by the probe: as root, then through an unprivileged user namespace.
NAMESPACE_PREFIXES = (
    ("unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc"),
    (
        "unshare",
        "--user",
        "--map-root-user",
        "--net",
        "--pid",
        "--fork",
        "--kill-child",
        "--mount-proc",
    ),
)
STDERR_KEEP = 64 * 1024
EXIT_GRACE_SECONDS = 0.5  # pipes still open this long after the program exited: stop reading


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits. Defaults follow verl's code rewards (1024 MB; seconds per test case)."""

    cpu_seconds: float = 4.0
    wall_seconds: float = 8.0
    memory_mb: int = 1024
    max_output_bytes: int = 1 << 20
    max_file_bytes: int = 16 << 20
    max_processes: int = 64
    max_open_files: int = 64

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "wall_seconds", "memory_mb", "max_output_bytes"):
            value = getattr(self, name)
            if not value > 0:  # also rejects NaN
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {value!r}")
        for name in ("max_file_bytes", "max_processes", "max_open_files"):
            if getattr(self, name) < 1:
                raise ValueError(f"SandboxLimits.{name} must be >= 1")


@dataclass(frozen=True)
class SandboxResult:
    """What one run did. `status` is one of STATUSES; `ok` means exit code 0 within limits."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_seconds: float
    isolation: str

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def reason(self) -> str:
        """One line saying why a run did not succeed (empty when it did)."""
        if self.ok:
            return ""
        if self.status in ("error", "denied", "memory_limit"):
            lines = [line for line in self.stderr.strip().splitlines() if line.strip()]
            tail = lines[-1][:300] if lines else f"exit code {self.returncode}"
            return f"{self.status}: {tail}"
        return f"{self.status} (exit code {self.returncode})"


_PROBE_LOCK = threading.Lock()
_PROBED: dict[str, tuple[str, ...] | None] = {}


def namespace_prefix(python: str = sys.executable) -> tuple[str, ...] | None:
    """The `unshare` command prefix that works on the local host, or None (probed once)."""
    with _PROBE_LOCK:
        if python in _PROBED:
            return _PROBED[python]
        found = None
        if shutil.which("unshare"):
            for prefix in NAMESPACE_PREFIXES:
                try:
                    done = subprocess.run(
                        [*prefix, python, "-I", "-S", "-c", "pass"],
                        capture_output=True,
                        timeout=20,
                        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                    )
                except (OSError, subprocess.SubprocessError):
                    continue
                if done.returncode == 0:
                    found = prefix
                    break
        _PROBED[python] = found
        return found


def clean_environment(workdir: str) -> dict[str, str]:
    """The child's whole environment: nothing of the parent's leaks through."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


class Sandbox:
    """Runs Python programs under `limits`; thread-safe, at most `max_concurrent` at a time.

    isolation: "auto" uses namespaces when the probe finds them, "namespaces" requires them
        (RuntimeError otherwise), "none" never uses them.
    guard: the Python-level guard in the child; turn it off only to test the kernel layers.
    tmp_root: where work directories are made (default: the system temporary folder).
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        isolation: str = "auto",
        guard: bool = True,
        tmp_root: str | os.PathLike[str] | None = None,
        python: str = sys.executable,
        max_concurrent: int | None = None,
    ) -> None:
        if isolation not in ISOLATION_MODES:
            raise ValueError(f"isolation must be one of {ISOLATION_MODES}, got {isolation!r}")
        self.limits = limits or SandboxLimits()
        self.guard = bool(guard)
        self.tmp_root = str(tmp_root) if tmp_root is not None else None
        self.python = python
        prefix = namespace_prefix(python) if isolation != "none" else None
        if isolation == "namespaces" and prefix is None:
            raise RuntimeError(
                "isolation='namespaces' needs util-linux `unshare` with network and PID "
                "namespaces (root, or unprivileged user namespaces); none worked here"
            )
        self.prefix: tuple[str, ...] = prefix or ()
        self.isolation = "namespaces" if prefix else "none"
        slots = max_concurrent if max_concurrent is not None else (os.cpu_count() or 1)
        if slots < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {slots}")
        self._slots = threading.BoundedSemaphore(slots)

    def run(
        self,
        program: str,
        stdin: str = "",
        *,
        mode: str = "script",
        fn_name: str | None = None,
        arguments: list | None = None,
    ) -> SandboxResult:
        """Run `program` once.

        mode "script": the program is __main__ and reads `stdin`.
        mode "call": the program is imported as a module, then `fn_name(*arguments)` (or
            `Solution().fn_name`) is called; stdout holds the JSON of the return value on its
            last line and the program's own prints go to stderr.
        """
        if mode == "call":
            if not fn_name:
                raise ValueError("mode 'call' needs fn_name")
            stdin = json.dumps(list(arguments or []))
        elif mode != "script":
            raise ValueError(f"mode must be 'script' or 'call', got {mode!r}")
        with self._slots:
            return self._run(program, stdin, mode, fn_name)

    def _run(self, program: str, stdin: str, mode: str, fn_name: str | None) -> SandboxResult:
        limits = self.limits
        config = {
            "mode": mode,
            "fn_name": fn_name or "",
            "guard": "1" if self.guard else "0",
            "cpu_seconds": limits.cpu_seconds,
            "memory_bytes": int(limits.memory_mb) * 1024 * 1024,
            "max_file_bytes": limits.max_file_bytes,
            "max_processes": limits.max_processes,
            "max_open_files": limits.max_open_files,
        }
        workdir = tempfile.mkdtemp(prefix="entropyrl-sandbox-", dir=self.tmp_root)
        try:
            Path(workdir, "program.py").write_text(program, encoding="utf-8")
            command = [
                *self.prefix,
                self.python,
                "-I",
                "-S",
                "-B",
                CHILD_SCRIPT,
                *(f"{key}={value}" for key, value in config.items()),
            ]
            start = time.monotonic()
            process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=workdir,
                env=clean_environment(workdir),
                start_new_session=True,
                close_fds=True,
            )
            stop: str | None = "error"
            try:
                stdout, stderr, stop = _communicate(
                    process,
                    stdin.encode("utf-8", "surrogateescape"),
                    deadline=start + limits.wall_seconds,
                    max_output=limits.max_output_bytes,
                )
            finally:
                # With the guard on and the program gone by itself nothing else can exist (fork is
                # refused); otherwise look for stragglers (a few ms of reading /proc).
                clean_exit = stop is None and process.poll() is not None
                _kill_session(process.pid, scan=not (self.guard and clean_exit))
                returncode = process.wait()
                for stream in (process.stdin, process.stdout, process.stderr):
                    if stream is not None and not stream.closed:
                        stream.close()
            elapsed = time.monotonic() - start
        finally:
            _remove_tree(workdir)
        out = stdout.decode("utf-8", "replace")
        err = stderr[-STDERR_KEEP:].decode("utf-8", "replace")
        return SandboxResult(
            status=_classify(stop, returncode, err),
            returncode=returncode,
            stdout=out,
            stderr=err,
            wall_seconds=elapsed,
            isolation=self.isolation,
        )


def _communicate(
    process: subprocess.Popen, data: bytes, *, deadline: float, max_output: int
) -> tuple[bytes, bytes, str | None]:
    """Feed stdin and read both pipes until EOF, the deadline or the output cap."""
    selector = selectors.DefaultSelector()
    stdin, stdout, stderr = process.stdin, process.stdout, process.stderr
    assert stdin is not None and stdout is not None and stderr is not None
    if data:
        os.set_blocking(stdin.fileno(), False)
        selector.register(stdin, selectors.EVENT_WRITE)
    else:
        stdin.close()
    selector.register(stdout, selectors.EVENT_READ)
    selector.register(stderr, selectors.EVENT_READ)
    buffers = {stdout: bytearray(), stderr: bytearray()}
    offset, stop, exited_at = 0, None, None
    try:
        while selector.get_map() and stop is None:
            now = time.monotonic()
            if now >= deadline:
                stop = "timeout"
                break
            if process.poll() is not None:
                exited_at = exited_at or now
                if now - exited_at > EXIT_GRACE_SECONDS:
                    break  # something outside the program holds the pipes open
            for key, _ in selector.select(min(deadline - now, 0.25)):
                stream = key.fileobj
                if stream is stdin:
                    try:
                        offset += os.write(key.fd, data[offset : offset + 65536])
                    except (BrokenPipeError, BlockingIOError) as error:
                        if isinstance(error, BlockingIOError):
                            continue
                        offset = len(data)
                    if offset >= len(data):
                        selector.unregister(stdin)
                        stdin.close()
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(stream)
                    continue
                buffers[stream] += chunk
                if len(buffers[stdout]) + len(buffers[stderr]) > max_output:
                    stop = "output_limit"
                    break
    finally:
        selector.close()
    return bytes(buffers[stdout][:max_output]), bytes(buffers[stderr]), stop


def _classify(stop: str | None, returncode: int, stderr: str) -> str:
    if stop is not None:
        return stop
    if returncode == 0:
        return "ok"
    if returncode == CPU_EXIT_CODE and CPU_MARKER in stderr:
        return "cpu_limit"
    if returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return "cpu_limit"
    if DENIED_MARKER in stderr:
        return "denied"
    if returncode < 0 or returncode > 128:
        return "killed"
    if "MemoryError" in stderr:
        return "memory_limit"
    return "error"


def _kill_session(pid: int, *, scan: bool) -> None:
    """SIGKILL the run's process group; with `scan`, every descendant and session member too.

    The group is the session the child was started in, but a process may have moved to a new
    group or session (only possible with the guard off, which refuses fork), so `scan` searches
    /proc for the leader's descendants while their parents still live (before anything is
    reparented), kills them, and waits until they are gone.
    """
    victims = run_processes(pid) if scan else []
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)
    if not scan:
        return
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        for other in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(other, signal.SIGKILL)
        victims = [other for other in run_processes(pid, also=victims) if other != pid]
        if not victims:
            return
        time.sleep(0.01)


def run_processes(leader: int, also: list[int] | None = None) -> list[int]:
    """Live processes of a run: the leader's session or group members and their descendants."""
    table = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        # Fields after the command name (which may hold spaces and parentheses).
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) >= 4 and fields[0] != b"Z":
            table[int(entry)] = (int(fields[1]), int(fields[2]), int(fields[3]))
    found = {leader, *(also or [])}
    found |= {pid for pid, (_, group, sid) in table.items() if leader in (group, sid)}
    grew = True
    while grew:
        children = {pid for pid, (parent, _, _) in table.items() if parent in found}
        grew = not children <= found
        found |= children
    return sorted(pid for pid in found if pid in table and pid != leader)


def _remove_tree(path: str) -> None:
    """Remove a work directory even when the program took permissions away from its parts."""

    def retry(function, target, _excinfo) -> None:
        try:
            os.chmod(os.path.dirname(target), 0o700)
            os.chmod(target, 0o700)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            function(target)

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=retry)
    else:
        shutil.rmtree(path, onerror=retry)
    if os.path.lexists(path):
        shutil.rmtree(path, ignore_errors=True)
