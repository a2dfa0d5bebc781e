"""Child side of the local code sandbox: limits, a Python-level guard, then the candidate program.

`entropyrl.rewards.sandbox` runs this file as ``python -I -S -B sandbox_child.py KEY=VALUE ...``
with the work directory as cwd. It must stay standard-library only and import nothing from
entropyrl: it runs in isolated mode, without site processing, and imports only C modules on the
way to the program (json and signal would cost ~25 ms through re and enum; json loads only for
function-call tests).

Order of events (all before the first line of candidate code runs):
1. read the program (and, in call mode, the JSON arguments from stdin);
2. resource limits, soft = hard: RLIMIT_AS, RLIMIT_NPROC, RLIMIT_FSIZE, RLIMIT_NOFILE,
   RLIMIT_CORE = 0, and RLIMIT_CPU (SIGXCPU exits with a message, SIGKILL a second later); the
   guard refuses setrlimit, so the program cannot raise them back;
3. the guard, an audit hook (PEP 578) that refuses: process creation (fork, exec, spawn,
   subprocess, os.system), signals to other processes, sockets, ctypes and the modules that
   reach native code or processes without an audit event, raising resource limits, tracing and
   frame / gc introspection (the ways to reach the hook's state), writes, links, renames and
   deletions outside the work directory, and reads outside the work directory, the Python
   installation and a few device files (so /proc/<parent>/environ, keys and sources stay unread).

The guard is a defence in depth for what the kernel does not enforce on its own (above all when
the trainer runs as root, where file permissions do not protect anything). It keeps every piece
of state it needs in its closure, bound at install time, so monkeypatching ``os`` or builtins
cannot change what it checks.
"""

from __future__ import annotations

import _signal
import os
import resource
import sys

# Exit status when the guard refuses an operation the program did not catch is the ordinary
# 1 of an uncaught exception; the parent recognises refusals by this marker on stderr.
DENIED_MARKER = "sandbox: denied"
CPU_MARKER = "sandbox: cpu time limit"
CPU_EXIT_CODE = 152  # 128 + SIGXCPU, as a shell would report it

# The import preamble of verl's prime_code (APPS-style) tester: model code written for those
# data sets relies on these names (e.g. `List` in LeetCode signatures) being present.
PREAMBLE = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
    "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\n"
    "from random import *\nfrom statistics import *\nfrom itertools import *\n"
    "from functools import *\nfrom operator import *\nfrom io import *\nfrom sys import *\n"
    "from json import *\nfrom builtins import *\nfrom typing import *\nimport string\nimport re\n"
    "import datetime\nimport collections\nimport heapq\nimport bisect\nimport copy\nimport math\n"
    "import random\nimport statistics\nimport itertools\nimport functools\nimport operator\n"
    "import io\nimport sys\nimport json\n"
)
RECURSION_LIMIT = 600_000  # as verl's prime_code tester

DENIED_EVENTS = frozenset(
    {
        "os.fork",
        "os.forkpty",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.system",
        "os.startfile",
        "os.killpg",
        "subprocess.Popen",
        "pty.spawn",
        "resource.setrlimit",
        "resource.prlimit",
        "sys.settrace",
        "sys.setprofile",
        "sys._current_frames",
        "sys._current_exceptions",
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
        "sqlite3.enable_load_extension",
        "sqlite3.load_extension",
        "os.add_dll_directory",
    }
)
DENIED_EVENT_PREFIXES = ("socket.", "ctypes.", "winreg.", "_winapi.")
# Modules whose native code creates processes, loads libraries or opens files without raising an
# audit event the guard could check. ctypes itself may load (numpy imports it): every ctypes
# event is refused except the dlopen(None) its import makes, so it can neither look up a symbol
# nor call a function nor read memory.
DENIED_IMPORTS = frozenset(
    {
        "_posixsubprocess",
        "cffi",
        "_cffi_backend",
        "_xxsubinterpreters",
        "_xxinterpchannels",
        "_dbm",
        "_gdbm",
        "readline",
    }
)
# Events that change the file system: (indices of path arguments, indices of dir_fd arguments).
MUTATING_EVENTS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "os.rename": ((0, 1), (2, 3)),
    "os.remove": ((0,), (1,)),
    "os.rmdir": ((0,), (1,)),
    "os.mkdir": ((0,), (2,)),
    "os.symlink": ((1,), (2,)),
    "os.link": ((0, 1), (2, 3)),
    "os.chmod": ((0,), (2,)),
    "os.chown": ((0,), (3,)),
    "os.chflags": ((0,), ()),
    "os.lchflags": ((0,), ()),
    "os.truncate": ((0,), ()),
    "os.utime": ((0,), (3,)),
    "os.setxattr": ((0,), ()),
    "os.removexattr": ((0,), ()),
    "os.mkfifo": ((0,), (2,)),
    "os.mknod": ((0,), (3,)),
    "shutil.rmtree": ((0,), (1,)),
    "shutil.move": ((0, 1), ()),
    "shutil.copyfile": ((1,), ()),
    "shutil.copytree": ((1,), ()),
    "shutil.chown": ((0,), ()),
    "sqlite3.connect": ((0,), ()),
}
# Device files a program may open; every other character or block device is refused (as root a
# program could otherwise create a node for a disk inside its work directory and write to it).
ALLOWED_DEVICES = frozenset({"/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/dev/full"})
EXTRA_READ_ROOTS = ("/etc/localtime", "/usr/share/zoneinfo")


def install_guard(workdir: str, read_roots: tuple[str, ...]) -> None:
    """Install the audit hook; every name it uses is bound here, not looked up when it runs."""
    import posix

    lstat, readlink, getcwd = posix.lstat, posix.readlink, posix.getcwd
    own_pid = posix.getpid()
    at_fdcwd = -100
    write_flags = posix.O_WRONLY | posix.O_RDWR | posix.O_APPEND | posix.O_CREAT | posix.O_TRUNC
    encoding = sys.getfilesystemencoding()
    denied_events, denied_prefixes = DENIED_EVENTS, DENIED_EVENT_PREFIXES
    denied_imports, mutating, devices = DENIED_IMPORTS, MUTATING_EVENTS, ALLOWED_DEVICES
    proc_self = f"/proc/{own_pid}"
    own_pipes = f"{proc_self}/fd/pipe:"
    write_roots = (workdir,)
    read_roots = (*read_roots, workdir, proc_self, *ALLOWED_DEVICES, *EXTRA_READ_ROOTS)
    # The hook never runs program code: no method of an argument is called (subclasses could
    # override it), only these builtins and the unbound methods of the exact types.
    _str, _bytes, _int, _len, _type, _issubclass = str, bytes, int, len, type, issubclass
    str_copy, bytes_decode = str.__str__, bytes.decode
    Denied, marker = PermissionError, DENIED_MARKER

    def deny(what: str) -> None:
        raise Denied(f"{marker}: {what}")

    def as_text(value: object) -> str | None:
        kind = _type(value)
        if kind is _str:
            return value  # type: ignore[return-value]
        if _issubclass(kind, _str):
            return str_copy(value)
        if _issubclass(kind, _bytes):
            return bytes_decode(value, encoding, "surrogateescape")
        return None

    def is_int(value: object) -> bool:
        return _issubclass(_type(value), _int)

    def text(path: object) -> str:
        # PathLike objects run program code on each conversion (they could answer differently to
        # the check and to the call): only str, bytes and descriptors are accepted.
        name = as_text(path)
        if name is None:
            deny("path that is not str or bytes (pass str paths)")
            return ""
        return name

    def resolve(path: str) -> str:
        """Absolute path with every symbolic link resolved (missing components kept as named)."""
        if not path.startswith("/"):
            path = getcwd() + "/" + path
        pending = [part for part in path.split("/") if part and part != "."]
        pending.reverse()
        parts: list[str] = []
        links = 0
        while pending:
            part = pending.pop()
            if part == "..":
                if parts:
                    parts.pop()
                continue
            candidate = "/" + "/".join([*parts, part])
            try:
                is_link = (lstat(candidate).st_mode & 0o170000) == 0o120000
            except OSError:
                is_link = False
            if not is_link:
                parts.append(part)
                continue
            links += 1
            if links > 40:
                deny("too many levels of symbolic links")
            target = readlink(candidate)
            if target.startswith("/"):
                parts = []
            more = [p for p in target.split("/") if p and p != "."]
            more.reverse()
            pending.extend(more)
        return "/" + "/".join(parts)

    def inside(path: str, roots: tuple[str, ...]) -> bool:
        for root in roots:
            if path == root or path.startswith(root + "/" if root != "/" else "/"):
                return True
        return False

    def has_parent_step(path: str) -> bool:
        return not path.startswith("/") and ".." in path.split("/")

    def is_device(path: str) -> bool:
        try:
            kind = lstat(path).st_mode & 0o170000
        except OSError:
            return False
        return kind in (0o020000, 0o060000)  # character or block device

    def is_directory(path: str) -> bool:
        try:
            return (lstat(path).st_mode & 0o170000) == 0o040000
        except OSError:
            return False

    def check_open(args: tuple) -> None:
        path, mode, flags = args[0], as_text(args[1]), args[2]
        if is_int(path):
            return  # an already open descriptor: it passed this check when it was opened
        name = text(path)
        if has_parent_step(name):
            # os.open may resolve a relative path against a dir_fd the event does not show.
            deny(f"relative path with '..': {name}")
        real = resolve(name)
        writing = is_int(flags) and (_int(flags) & write_flags) != 0
        if mode is not None:
            for letter in "wax+":
                if letter in mode:
                    writing = True
        if is_device(real) and real not in devices:
            deny(f"device {real}")
        if writing:
            # /dev/stdout and /dev/stderr resolve to this process's pipes.
            if real.startswith(own_pipes):
                return
            if not (inside(real, write_roots) or real in devices):
                deny(f"write outside the work directory: {real}")
            return
        if not inside(real, read_roots):
            deny(f"read outside the work directory and the Python installation: {real}")
        if mode is None and is_directory(real) and not inside(real, write_roots):
            # A directory descriptor outside would let dir_fd-relative calls escape.
            deny(f"directory descriptor outside the work directory: {real}")

    def check_mutation(event: str, args: tuple) -> None:
        paths, dir_fds = mutating[event]
        relative_to_fd = False
        for index in dir_fds:
            if index < _len(args) and args[index] is not None:
                fd = args[index]
                if not (_type(fd) is _int and fd == at_fdcwd):
                    relative_to_fd = True
        for index in paths:
            if index >= _len(args):
                continue
            path = args[index]
            if is_int(path):
                deny(f"{event} on a file descriptor")
            name = text(path)
            if relative_to_fd and has_parent_step(name):
                deny(f"{event}: relative path with '..' and dir_fd: {name}")
            real = resolve(name) if event != "os.symlink" else resolve_link_path(name)
            if not inside(real, write_roots):
                deny(f"{event} outside the work directory: {real}")
        if event == "os.symlink":
            link = text(args[1])
            target = text(args[0])
            base = link.rsplit("/", 1)[0] if "/" in link else "."
            real_target = resolve(target if target.startswith("/") else base + "/" + target)
            if not inside(real_target, write_roots):
                deny(f"symbolic link to outside the work directory: {real_target}")

    def resolve_link_path(name: str) -> str:
        # The link itself is created, not followed: resolve its directory only.
        head, _, tail = name.rpartition("/")
        return resolve(head or ("/" if name.startswith("/") else ".")) + "/" + tail

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            check_open(args)
        elif event in mutating:
            check_mutation(event, args)
        elif event == "import":
            module = as_text(args[0]) or ""
            if module in denied_imports or module.split(".")[0] in denied_imports:
                deny(f"import {module}")
        elif event == "ctypes.dlopen" and args[0] is None:
            return
        elif event in denied_events or event.startswith(denied_prefixes):
            deny(event)
        elif event == "os.kill" and not (_type(args[0]) is _int and args[0] == own_pid):
            deny(f"signal to process {args[0]}")

    sys.addaudithook(hook)


def set_limits(config: dict[str, str]) -> None:
    """Soft = hard (CPU: SIGKILL a second after SIGXCPU), and the guard refuses setrlimit."""
    limits = [
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_FSIZE, int(config["max_file_bytes"])),
        (resource.RLIMIT_NOFILE, int(config["max_open_files"])),
        (resource.RLIMIT_NPROC, int(config["max_processes"])),
        (resource.RLIMIT_AS, int(config["memory_bytes"])),
    ]
    for which, value in limits:
        resource.setrlimit(which, (value, value))
    # CPU seconds count from process start: the soft limit is what the program itself may use,
    # the hard limit (SIGKILL) one second later backs up a program that ignores SIGXCPU.
    usage = resource.getrusage(resource.RUSAGE_SELF)
    spent = int(usage.ru_utime + usage.ru_stime)
    soft = spent + max(1, int(float(config["cpu_seconds"])))
    resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 1))

    def on_cpu_limit(signum: int, frame: object) -> None:
        os.write(2, f"\n{CPU_MARKER}\n".encode())
        os._exit(CPU_EXIT_CODE)

    _signal.signal(_signal.SIGXCPU, on_cpu_limit)


def read_roots() -> tuple[str, ...]:
    """The Python installation and the package folders on sys.path, resolved."""
    import site

    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    roots.update(site.getsitepackages())
    roots.update(entry for entry in sys.path if entry)
    return tuple(sorted(os.path.realpath(root) for root in roots if os.path.isdir(root)))


def add_site_packages() -> None:
    """Make installed packages importable without running site (no .pth file side effects)."""
    import site

    for path in site.getsitepackages():
        if os.path.isdir(path) and path not in sys.path:
            sys.path.append(path)


def new_main_module(name: str) -> dict:
    """A fresh module for the candidate; it also replaces __main__ so this file stays hidden."""
    import types

    module = types.ModuleType(name)
    module.__file__ = os.path.join(os.getcwd(), "program.py")
    sys.modules["__main__"] = module
    sys.modules[name] = module
    return module.__dict__


def find_callable(namespace: dict, fn_name: str) -> object:
    """`Solution().fn_name` when the program defines that class (as prime_code), else a function."""
    solution = namespace.get("Solution")
    if isinstance(solution, type) and hasattr(solution, fn_name):
        return getattr(solution(), fn_name)
    if fn_name in namespace:
        return namespace[fn_name]
    raise NameError(f"function {fn_name!r} not found in the program")


def run_below_init() -> None:
    """In a PID namespace this process is its init, which ignores every signal it has no handler
    for, even the SIGKILL of its own CPU hard limit: fork, let the child run the program, and
    exit with its status (the namespace, and anything left in it, dies with this process)."""
    child = os.fork()
    if child == 0:
        return
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


def main(argv: list[str]) -> None:
    if os.getpid() == 1:
        run_below_init()
    config = dict(item.split("=", 1) for item in argv[1:])
    workdir = os.path.realpath(os.getcwd())
    with open("program.py", encoding="utf-8") as handle:
        source = handle.read()
    arguments = None
    if config["mode"] == "call":
        import json

        arguments = json.loads(sys.stdin.read() or "[]")
    add_site_packages()
    roots = read_roots()
    set_limits(config)
    sys.setrecursionlimit(RECURSION_LIMIT)
    sys.argv = ["program.py"]
    name = "__main__" if config["mode"] == "script" else "solution"
    namespace = new_main_module(name)
    if config["mode"] == "call":
        # As verl's sandbox_fusion wrapper: the preamble only for function-call tests (it costs
        # ~40 ms of imports, more than the rest of a run).
        exec(compile(PREAMBLE, "<preamble>", "exec"), namespace)
    code = compile(source, "program.py", "exec")
    if config["guard"] == "1":
        install_guard(workdir, roots)
    if arguments is None:
        exec(code, namespace)
        return
    # Call mode: the program's prints go to stderr so stdout holds only the JSON result.
    stdout = sys.stdout
    sys.stdout = sys.stderr
    exec(code, namespace)
    result = find_callable(namespace, config["fn_name"])(*arguments)
    sys.stdout = stdout
    if isinstance(result, tuple):
        result = list(result)
    stdout.write("\n" + json.dumps(result, default=repr) + "\n")
    stdout.flush()


if __name__ == "__main__":
    main(sys.argv)
