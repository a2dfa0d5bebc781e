"""The local code sandbox against hostile programs, each run in a real child process.

After every test the sandbox's temporary root must be empty and no process may still have its
working directory there: "leaves the machine as it was" is checked, not assumed. Limits are
small so the whole file stays fast; no test depends on how fast the machine is (timeouts are
generous bounds, never measurements).
"""

from __future__ import annotations

import os
import resource
import socket
import textwrap
import threading
from pathlib import Path

import pytest

from entropyrl.rewards.sandbox import (
    STATUSES,
    Sandbox,
    SandboxLimits,
    namespace_prefix,
    run_processes,
)

# The wall limit is far above the CPU limit: on a loaded machine a busy loop may get its CPU second
# slowly, and a test must not turn into a wall-clock race.
LIMITS = SandboxLimits(cpu_seconds=1, wall_seconds=30, memory_mb=512, max_output_bytes=64 * 1024)
HAVE_NAMESPACES = namespace_prefix() is not None
ISOLATIONS = ["auto", "none"]


def processes_in(root: Path) -> list[int]:
    """Processes whose working directory is under `root` (every run's children start there)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if cwd.startswith(str(root)):
            found.append(int(entry))
    return found


@pytest.fixture
def runs_root(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    yield root
    assert processes_in(root) == [], "a sandboxed process outlived its run"
    assert list(root.iterdir()) == [], "a work directory was left behind"


def make(runs_root: Path, isolation: str = "auto", *, guard: bool = True, **changes) -> Sandbox:
    limits = SandboxLimits(**{**LIMITS.__dict__, **changes})
    return Sandbox(limits, isolation=isolation, tmp_root=runs_root, guard=guard)


def program(text: str) -> str:
    return textwrap.dedent(text).strip() + "\n"


def test_runs_a_program_on_stdin(runs_root):
    result = make(runs_root).run("a, b = map(int, input().split())\nprint(a + b)\n", "2 40\n")
    assert result.ok and result.status == "ok"
    assert result.stdout == "42\n"
    assert result.returncode == 0
    assert result.reason() == ""


def test_large_stdin_and_stdout_do_not_deadlock(runs_root):
    data = "x" * 300_000 + "\n"
    sandbox = Sandbox(SandboxLimits(wall_seconds=60, max_output_bytes=1 << 20), tmp_root=runs_root)
    result = sandbox.run("import sys\nsys.stdout.write(sys.stdin.read())\n", data)
    assert result.ok and result.stdout == data


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_infinite_loop_stops_at_the_cpu_limit(runs_root, isolation):
    result = make(runs_root, isolation).run("while True:\n    pass\n")
    assert result.status == "cpu_limit"


def test_program_ignoring_sigxcpu_is_killed_at_the_hard_limit(runs_root):
    code = program(
        """
        import signal
        signal.signal(signal.SIGXCPU, signal.SIG_IGN)
        while True:
            pass
        """
    )
    result = make(runs_root).run(code)
    assert result.status in ("killed", "cpu_limit")
    assert not result.ok


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_sleeping_program_is_killed_at_the_wall_limit(runs_root, isolation):
    result = make(runs_root, isolation, wall_seconds=1).run("import time\ntime.sleep(600)\n")
    assert result.status == "timeout"
    assert result.wall_seconds < 60


@pytest.mark.parametrize(
    "code",
    ["x = bytearray(8 * 1024**3)\n", "x = []\nwhile True:\n    x.append(bytearray(10**7))\n"],
    ids=["one-block", "growing"],
)
def test_huge_allocation_hits_the_memory_limit(runs_root, code):
    # CPU room to spare: filling 256 MB must not race the CPU limit on a loaded machine.
    result = make(runs_root, cpu_seconds=30, memory_mb=256).run(code)
    assert result.status in ("memory_limit", "killed")
    assert not result.ok


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_fork_bomb_is_refused(runs_root, isolation):
    code = program(
        """
        import os
        while True:
            os.fork()
        """
    )
    result = make(runs_root, isolation).run(code)
    assert result.status == "denied"
    assert "os.fork" in result.stderr


@pytest.mark.parametrize(
    "code",
    [
        "import subprocess\nsubprocess.run(['true'])\n",
        "import os\nos.system('true')\n",
        "import os\nos.execv('/bin/true', ['true'])\n",
        "import os\nos.posix_spawn('/bin/true', ['true'], {})\n",
        "import multiprocessing\nmultiprocessing.Process(target=print).start()\n",
        "import pty\npty.fork()\n",
    ],
    ids=["subprocess", "system", "exec", "posix_spawn", "multiprocessing", "pty"],
)
def test_no_new_programs(runs_root, code):
    result = make(runs_root).run(code)
    assert result.status == "denied", result.stderr


@pytest.mark.parametrize(
    "code",
    [
        "import ctypes\nctypes.CDLL(None).system(b'true')\n",
        "import ctypes\nctypes.CDLL('libc.so.6')\n",
        "import ctypes\nprint(ctypes.string_at(id(1), 8))\n",
        "import ctypes\n(ctypes.c_char * 8).from_address(id(1))\n",
        "import ctypes\nctypes.pythonapi.Py_GetVersion\n",
    ],
    ids=["dlsym", "dlopen", "string_at", "from_address", "pythonapi"],
)
def test_ctypes_loads_but_cannot_reach_native_code(runs_root, code):
    result = make(runs_root).run(code)
    assert result.status == "denied", result.stderr


def test_limits_are_set_in_the_child_and_cannot_be_raised(runs_root):
    code = program(
        """
        import resource
        for name in ("RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CORE"):
            print(name, *resource.getrlimit(getattr(resource, name)))
        soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
        print("RLIMIT_CPU", hard - soft)
        resource.setrlimit(resource.RLIMIT_CPU, (hard + 100, hard + 100))
        """
    )
    sandbox = make(runs_root, max_processes=7, max_file_bytes=12345, max_open_files=33)
    result = sandbox.run(code)
    lines = dict(line.split(" ", 1) for line in result.stdout.strip().splitlines())
    assert lines["RLIMIT_AS"] == f"{512 * 1024 * 1024} {512 * 1024 * 1024}"
    assert lines["RLIMIT_NPROC"] == "7 7"
    assert lines["RLIMIT_FSIZE"] == "12345 12345"
    assert lines["RLIMIT_NOFILE"] == "33 33"
    assert lines["RLIMIT_CORE"] == "0 0"
    assert lines["RLIMIT_CPU"] == "1"  # SIGXCPU first, SIGKILL a second later
    assert result.status == "denied"  # raising a limit back is refused
    assert "resource.setrlimit" in result.stderr


def test_file_size_limit(runs_root):
    code = "open('big.bin', 'wb').write(b'x' * 5_000_000)\n"
    result = make(runs_root, max_file_bytes=1_000_000).run(code)
    assert result.status in ("error", "killed")
    assert "File too large" in result.stderr or result.status == "killed"


def test_output_is_capped(runs_root):
    result = make(runs_root).run("while True:\n    print('x' * 1000)\n")
    assert result.status == "output_limit"
    assert len(result.stdout) <= 64 * 1024


def outside_cases(outside: Path) -> dict[str, str]:
    target = outside / "target.txt"
    return {
        "create": f"open({str(outside / 'new.txt')!r}, 'w').write('x')\n",
        "append": f"open({str(target)!r}, 'a').write('x')\n",
        "os_open": f"import os\nos.open({str(target)!r}, os.O_WRONLY | os.O_TRUNC)\n",
        "relative": "open('../../outside/target.txt', 'w').write('x')\n",
        "unlink": f"import os\nos.remove({str(target)!r})\n",
        "rename_out": f"import os\nopen('a', 'w').close()\nos.rename('a', {str(outside / 'b')!r})\n",
        "rename_in": f"import os\nos.rename({str(target)!r}, 'mine.txt')\n",
        "chmod": f"import os\nos.chmod({str(target)!r}, 0o777)\n",
        "symlink": f"import os\nos.symlink({str(target)!r}, 'link')\nopen('link', 'w').write('x')\n",
        "hardlink": f"import os\nos.link({str(target)!r}, 'link')\nopen('link', 'w').write('x')\n",
        "dir_fd": program(
            f"""
            import os
            fd = os.open({str(outside)!r}, os.O_RDONLY)
            os.open('target.txt', os.O_WRONLY | os.O_TRUNC, dir_fd=fd)
            """
        ),
        "chdir": f"import os\nos.chdir({str(outside)!r})\nopen('target.txt', 'w').write('x')\n",
        "rmtree": f"import shutil\nshutil.rmtree({str(outside)!r})\n",
        "pathlike": f"import pathlib\npathlib.Path({str(target)!r}).write_text('x')\n",
        "monkeypatch": program(
            f"""
            import os, posixpath, builtins
            os.path.realpath = posixpath.realpath = lambda p, **k: '/nowhere'
            os.lstat = lambda *a, **k: None
            builtins.isinstance = lambda *a: False
            open({str(target)!r}, 'w').write('x')
            """
        ),
    }


@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("case", sorted(outside_cases(Path("/x"))))
def test_writes_outside_the_work_dir_are_refused(tmp_path, isolation, case):
    runs_root = tmp_path / "runs"
    outside = tmp_path / "outside"
    runs_root.mkdir()
    outside.mkdir()
    target = outside / "target.txt"
    target.write_text("original")
    mode = target.stat().st_mode
    sandbox = Sandbox(LIMITS, isolation=isolation, tmp_root=runs_root)
    result = sandbox.run(outside_cases(outside)[case])
    assert result.status == "denied", (result.status, result.stderr)
    assert target.read_text() == "original"
    assert target.stat().st_mode == mode
    assert sorted(p.name for p in outside.iterdir()) == ["target.txt"]
    assert list(runs_root.iterdir()) == []
    assert processes_in(runs_root) == []


def test_files_inside_the_work_dir_are_allowed_and_removed(runs_root):
    code = program(
        """
        import os, shutil
        os.makedirs('a/b')
        with open('a/b/f.txt', 'w') as handle:
            handle.write('hello')
        os.rename('a/b/f.txt', 'a/g.txt')
        os.symlink('g.txt', 'a/link')
        print(open('a/link').read())
        os.mkdir('locked')
        open('locked/x', 'w').close()
        os.chmod('locked', 0)
        shutil.copytree('a', 'c')
        print(sorted(os.listdir('.')))
        """
    )
    result = make(runs_root).run(code)
    assert result.ok, result.stderr
    assert result.stdout.splitlines() == ["hello", "['a', 'c', 'locked', 'program.py']"]


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_parent_environment_is_not_visible(runs_root, isolation, monkeypatch):
    secret = "entropyrl-sandbox-secret-7c1f"
    monkeypatch.setenv("ENTROPYRL_SANDBOX_TEST_SECRET", secret)
    code = program(
        """
        import os
        print(dict(os.environ))
        for path in (f"/proc/{os.getppid()}/environ", "/proc/1/environ", "/proc/self/environ",
                     f"/proc/{os.getpid()}/environ", "/proc/self/../1/environ"):
            try:
                print(path, open(path, "rb").read())
            except Exception as error:
                print(path, "refused:", error)
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    print(pid, open(f"/proc/{pid}/environ", "rb").read())
                except Exception:
                    pass
        """
    )
    result = make(runs_root, isolation).run(code)
    assert result.ok, result.stderr
    assert secret not in result.stdout + result.stderr
    assert "ENTROPYRL_SANDBOX_TEST_SECRET" not in result.stdout
    assert "'HOME':" in result.stdout  # the clean environment is what the program sees


def test_files_outside_the_python_installation_are_unreadable(runs_root, tmp_path):
    private = tmp_path / "private.txt"
    private.write_text("do not read")
    code = f"print(open({str(private)!r}).read())\n"
    result = make(runs_root).run(code)
    assert result.status == "denied"
    assert "do not read" not in result.stdout


class Listener:
    """A loopback TCP server that records whether anything connected."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_sockets_are_refused(runs_root, listener, isolation):
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {listener.port}), timeout=2)\n"
    result = make(runs_root, isolation).run(code)
    assert result.status == "denied", result.stderr
    assert listener.connections == 0


@pytest.mark.skipif(not HAVE_NAMESPACES, reason="network namespaces are not available here")
def test_network_namespace_alone_blocks_the_network(runs_root, listener):
    code = program(
        f"""
        import socket
        try:
            socket.create_connection(('127.0.0.1', {listener.port}), timeout=2)
            print('connected')
        except OSError as error:
            print('failed', error)
        """
    )
    sandbox = Sandbox(LIMITS, isolation="namespaces", tmp_root=runs_root, guard=False)
    result = sandbox.run(code)
    assert result.ok and result.stdout.startswith("failed"), result.stdout
    assert listener.connections == 0


@pytest.mark.parametrize("isolation", ["namespaces", "none"])
def test_escaped_children_are_killed_without_the_guard(runs_root, isolation):
    """Kernel layers alone: bounded forks that leave the process group are still cleaned up."""
    if isolation == "namespaces" and not HAVE_NAMESPACES:
        pytest.skip("PID namespaces are not available here")
    code = program(
        """
        import os, time
        for _ in range(3):
            if os.fork() == 0:
                os.setsid()
                time.sleep(600)
                os._exit(0)
        print('forked', flush=True)
        time.sleep(600)
        """
    )
    sandbox = Sandbox(
        SandboxLimits(cpu_seconds=5, wall_seconds=4),
        isolation=isolation,
        tmp_root=runs_root,
        guard=False,
    )
    result = sandbox.run(code)
    assert result.status == "timeout"
    assert result.stdout == "forked\n"
    # runs_root's teardown asserts that none of the four processes survived.


def test_signals_to_other_processes_are_refused(runs_root):
    result = make(runs_root).run("import os\nos.kill(os.getppid() or 1, 0)\n")
    assert result.status == "denied"


@pytest.mark.parametrize(
    "code",
    [
        "import gc\ngc.get_objects()\n",
        "import sys\nsys.settrace(lambda *a: None)\n",
        "import sys\nsys._current_frames()\n",
    ],
    ids=["gc", "settrace", "frames"],
)
def test_introspection_that_could_reach_the_guard_is_refused(runs_root, code):
    assert make(runs_root).run(code).status == "denied"


def test_call_mode_returns_json_and_keeps_prints_apart(runs_root):
    code = program(
        """
        class Solution:
            def twoSum(self, nums: List[int], target: int) -> List[int]:
                print("debugging output")
                seen = {}
                for i, x in enumerate(nums):
                    if target - x in seen:
                        return (seen[target - x], i)
                    seen[x] = i
        """
    )
    result = make(runs_root).run(code, mode="call", fn_name="twoSum", arguments=[[2, 7, 11], 9])
    assert result.ok, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[0, 1]"
    assert "debugging output" in result.stderr


def test_standard_streams_by_path(runs_root):
    code = program(
        """
        data = open('/dev/stdin').read()
        with open('/dev/stdout', 'w') as out:
            out.write(data.upper())
        open('/dev/stderr', 'w').write('note')
        """
    )
    result = make(runs_root).run(code, "abc\n")
    assert result.ok, result.stderr
    assert (result.stdout, result.stderr) == ("ABC\n", "note")


def test_namespaces_required_but_unavailable_is_an_error(tmp_path):
    """An interpreter the probe cannot start inside `unshare`: no namespaces for it."""
    with pytest.raises(RuntimeError, match="namespaces"):
        Sandbox(isolation="namespaces", python=str(tmp_path / "no-such-python"))
    fallback = Sandbox(isolation="auto", python=str(tmp_path / "no-such-python"))
    assert fallback.isolation == "none"


def test_syntax_error_is_an_error(runs_root):
    result = make(runs_root).run("def broken(:\n")
    assert result.status == "error"
    assert "SyntaxError" in result.reason()


def test_numpy_is_importable_when_installed(runs_root):
    pytest.importorskip("numpy")
    result = make(runs_root, memory_mb=1024).run(
        "import numpy as np\nprint(int(np.arange(5).sum()))\n"
    )
    assert result.ok, result.stderr
    assert result.stdout == "10\n"


def test_concurrent_runs_share_the_slots(runs_root):
    sandbox = Sandbox(LIMITS, tmp_root=runs_root, max_concurrent=2)
    results = [None] * 4

    def work(i: int) -> None:
        results[i] = sandbox.run(f"print({i} * {i})\n")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert [r.stdout for r in results] == ["0\n", "1\n", "4\n", "9\n"]


@pytest.mark.parametrize(
    "changes",
    [
        {"cpu_seconds": 0},
        {"wall_seconds": float("nan")},
        {"memory_mb": -1},
        {"max_output_bytes": 0},
        {"max_processes": 0},
    ],
)
def test_invalid_limits_are_rejected(changes):
    with pytest.raises(ValueError):
        SandboxLimits(**changes)


def test_invalid_arguments_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="isolation"):
        Sandbox(isolation="chroot")
    with pytest.raises(ValueError, match="max_concurrent"):
        Sandbox(max_concurrent=0)
    sandbox = Sandbox(LIMITS, tmp_root=tmp_path)
    with pytest.raises(ValueError, match="mode"):
        sandbox.run("pass", mode="repl")
    with pytest.raises(ValueError, match="fn_name"):
        sandbox.run("pass", mode="call")


def test_statuses_and_isolation_are_reported(runs_root):
    result = make(runs_root).run("pass\n")
    assert result.status in STATUSES
    assert result.isolation == ("namespaces" if HAVE_NAMESPACES else "none")
    assert make(runs_root, "none").run("pass\n").isolation == "none"


def test_run_processes_finds_nothing_for_a_dead_leader():
    assert run_processes(2**22 + 12345) == []


def test_this_process_keeps_its_limits():
    """Limits are set in the child only: the parent's stay as they were."""
    before = resource.getrlimit(resource.RLIMIT_AS)
    Sandbox(LIMITS).run("pass\n")
    assert resource.getrlimit(resource.RLIMIT_AS) == before
