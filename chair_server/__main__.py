"""``python -m chair_server``: check the settings, bind the socket, load the ground truth, serve.

Everything that can fail without the ground truth (settings, the address, the port, the ready
file's folder) fails first, as one line on stderr with exit status 2. Prints ``CHAIR server
listening on http://HOST:PORT`` (flushed) once the ground truth is loaded, and writes the URL to
``--ready-file`` when given, so launchers can use ``--port 0`` without port races.

On SIGTERM or SIGINT the server stops accepting connections, finishes the requests in flight
(at most ``--drain-timeout`` seconds) and exits with status 0.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from waitress import wasyncore
from waitress.channel import HTTPChannel
from waitress.server import BaseWSGIServer, create_server
from waitress.task import ErrorTask

from chair_server.app import create_app
from chair_server.config import ServerSettings, command_line, parse_args
from chair_server.scorer import ChairScorer

log = logging.getLogger("chair_server")

# --supervise: a first start may parse every COCO caption (minutes); past this it has failed
SUPERVISED_START_TIMEOUT = 3600.0


def load_scorer(settings: ServerSettings) -> ChairScorer:
    if settings.coco is not None:
        return ChairScorer.from_coco(settings.coco, cache_dir=settings.cache_dir)
    return ChairScorer.from_ground_truth(settings.ground_truth)


class _AppSlot:
    """The WSGI app the socket is bound with; the real app is put in once the ground truth is
    loaded (nothing is served before: the event loop only starts afterwards)."""

    def __init__(self) -> None:
        self.app: Callable[..., Iterable[bytes]] | None = None

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        assert self.app is not None, "served before the ground truth was loaded"
        return self.app(environ, start_response)


def _json_error_channel(max_body_mb: float) -> type[HTTPChannel]:
    """waitress's own errors (a body over its cap, a malformed request line, headers too
    large) as the service's JSON error contract instead of plain text."""

    class JsonErrorTask(ErrorTask):
        def execute(self) -> None:
            error = self.request.error
            if error.code == 413:
                message = f"request body over the limit of {max_body_mb:g} MiB"
            else:
                message = f"{error.reason}: {error.body}"
            body = json.dumps({"error": message}).encode()
            self.status = f"{error.code} {error.reason}"
            self.response_headers.append(("Content-Type", "application/json"))
            self.set_close_on_finish()
            self.content_length = len(body)
            self.write(body)

    class JsonErrorChannel(HTTPChannel):
        error_task_class = JsonErrorTask

    return JsonErrorChannel


def _fail(message: str) -> int:
    print(f"chair_server: error: {message}", file=sys.stderr, flush=True)
    return 2


def bind(settings: ServerSettings, app: Callable) -> Any:
    """The waitress server, bound and listening (raises OSError/ValueError on a bad address)."""
    server = create_server(
        app,
        host=settings.host,
        port=settings.port,
        threads=settings.workers,
        # waitress's own cap sits above the app's so the app answers 413 with a field name;
        # past it, JsonErrorChannel answers in the same JSON form
        max_request_body_size=2 * settings.max_body_bytes + (1 << 20),
        connection_limit=settings.max_connections,
        channel_timeout=settings.channel_timeout,
        cleanup_interval=max(0.5, min(30.0, settings.channel_timeout / 2)),
        ident="chair_server",
    )
    channel = _json_error_channel(settings.max_body_mb)
    for listener in _listeners(server):
        listener.channel_class = channel
    return server


def _listeners(server: Any) -> list[BaseWSGIServer]:
    """The listening sockets: one, or one per address of a host name (MultiSocketServer)."""
    if isinstance(server, BaseWSGIServer):
        return [server]
    return [d for d in server.map.values() if isinstance(d, BaseWSGIServer)]


def _socket_map(server: Any) -> dict:
    return server._map if isinstance(server, BaseWSGIServer) else server.map


def serve(server: Any, drain_timeout: float, parent_pid: int | None = None) -> None:
    """Run the event loop until SIGTERM/SIGINT (or, with ``parent_pid``, until that process is
    no longer the parent), then drain: no new connections, requests in flight (received in part
    or in full, or being answered) finished within ``drain_timeout`` seconds, then every
    connection closed."""
    stop = threading.Event()

    def _on_signal(signum: int, frame: object) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    socket_map = _socket_map(server)
    listeners = _listeners(server)  # taken now: closing removes them from the map
    loop = {"use_poll": True, "map": socket_map, "count": 1}
    try:
        while not stop.is_set():
            wasyncore.loop(timeout=0.5, **loop)
            if parent_pid is not None and os.getppid() != parent_pid:
                log.warning("launcher (pid %d) is gone: stopping", parent_pid)
                stop.set()
        log.info("stopping: no new connections, finishing requests in flight")
        for listener in listeners:
            listener.accepting = False
            listener.del_channel()
            listener.socket.close()
        deadline = time.monotonic() + drain_timeout
        while time.monotonic() < deadline and _in_flight(socket_map):
            wasyncore.loop(timeout=0.05, **loop)
        left = _in_flight(socket_map)
        if left:
            log.warning("drain time over: closing %d connection(s) with work in flight", left)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for dispatcher in {id(d.task_dispatcher): d.task_dispatcher for d in listeners}.values():
            dispatcher.shutdown(timeout=1)
        wasyncore.close_all(socket_map)


def _in_flight(socket_map: dict) -> int:
    """Connections with a request being received, processed or answered."""
    return sum(
        1
        for channel in list(socket_map.values())
        if isinstance(channel, HTTPChannel)
        and (
            channel.requests
            or channel.total_outbufs_len
            or channel.request is not None  # a request received in part
        )
    )


def supervise(settings: ServerSettings) -> int:
    """``--supervise``: the service runs as a child, started again when it dies, on the same
    port (clients keep their URL), until SIGTERM or SIGINT stops both. The child's output goes
    to this process's stdout, the supervisor's own lines (restarts) to stderr."""
    from chair_server.launch import ChairServerProcess

    port = settings.port or _free_port(settings.host)
    if settings.token:
        os.environ["CHAIR_SERVER_TOKEN"] = settings.token  # the child's, off the command line
    child = command_line(settings, leave_out=("supervise", "port", "parent_pid"))
    parent = str(os.getpid())

    def command(port: int) -> list[str]:
        args = ["--port", str(port), "--parent-pid", parent]
        return [sys.executable, "-m", "chair_server", *child, *args]

    def _exit(signum: int, frame: object) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)  # one stop at a time
        raise SystemExit(0)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit)
    sys.stdout.flush()
    handle = ChairServerProcess(
        command,
        host=settings.host,
        port=port,
        timeout=SUPERVISED_START_TIMEOUT,
        restart=True,
        restart_delay=1.0,
        log=sys.stdout.buffer,
        ready_file=settings.ready_file,
        keep_port=True,
    )
    try:
        try:
            handle.start()
        except (RuntimeError, TimeoutError) as error:
            return _fail(f"the service did not start: {str(error).strip().splitlines()[0]}")
        log.info("supervising the CHAIR service at %s (pid %d)", handle.url, handle.pid)
        while handle.alive() or handle.supervising():
            if settings.parent_pid is not None and os.getppid() != settings.parent_pid:
                log.warning("launcher (pid %d) is gone: stopping", settings.parent_pid)
                break
            time.sleep(0.5)
        return 0 if handle.process is not None and handle.process.returncode == 0 else 1
    finally:
        handle.stop(timeout=settings.drain_timeout + 5.0)


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    settings = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if settings.supervise:
        return supervise(settings)
    slot = _AppSlot()
    try:
        server = bind(settings, slot)
    except (OSError, ValueError, socket.gaierror) as exc:
        if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
            return _fail(
                f"cannot listen on {settings.host}:{settings.port}: the port is in use (another "
                "CHAIR service?): give another with --port N, or --port 0 for a free one"
            )
        return _fail(f"cannot listen on {settings.host}:{settings.port}: {exc}")
    for warning in settings.warnings():
        print(f"chair_server: warning: {warning}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    try:
        scorer = load_scorer(settings)
    except (OSError, ValueError) as exc:
        hint = ""
        if settings.coco and not Path(settings.coco).exists():
            hint = (
                ": --coco takes COCO 2014's annotations folder (e.g. coco/annotations) or the "
                "quick start's world (runs/demo/world, written by `entropyrl demo`: run it "
                "first), or use --ground-truth FILE"
            )
        return _fail(f"cannot load ground truth: {exc}{hint}")
    if scorer.num_images == 0:
        return _fail(f"ground truth from {scorer.source} has no images: every caption would fail")
    log.info(
        "ground truth: %d images from %s in %.1fs%s",
        scorer.num_images,
        scorer.source,
        time.perf_counter() - started,
        " (cache)" if scorer.loaded_from_cache else "",
    )
    slot.app = create_app(scorer, settings)
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    # a host name that resolves to several addresses gives one socket each (MultiSocketServer)
    port = getattr(server, "effective_port", None) or server.effective_listen[0][1]
    url = f"http://{host}:{port}"
    if settings.ready_file:
        tmp = Path(settings.ready_file + ".tmp")
        tmp.write_text(url)
        os.replace(tmp, settings.ready_file)
    print(f"CHAIR server listening on {url}", flush=True)
    serve(server, settings.drain_timeout, settings.parent_pid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
