"""Settings of the CHAIR service: one typed config, the command line mirrors it."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from chair_server.options import OneLineParser, add_options, to_command_line

# --max-body-mb bounds: under 1 KiB no real request fits; over 1 GiB one request could exhaust memory
MIN_BODY_MB = 1 / 1024
MAX_BODY_MB = 1024.0


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass(frozen=True)
class ServerSettings:
    """Every knob of ``python -m chair_server``; each field's help names its default and why."""

    coco: str | None = field(
        default=None,
        metadata=_help(
            "folder with COCO 2014 annotation files (instances_/captions_{train,val}2014.json, "
            "any subset); ground truth = instance categories + objects in the reference captions"
        ),
    )
    ground_truth: str | None = field(
        default=None,
        metadata=_help('JSON file {"<image_id>": ["person", ...]} (a cache or detector outputs)'),
    )
    host: str = field(
        default="127.0.0.1",
        metadata=_help("bind address (default 127.0.0.1: loopback only, the service has no TLS)"),
    )
    port: int = field(
        default=5000,
        metadata=_help("TCP port (default 5000); 0 picks a free port (see --ready-file)"),
    )
    workers: int = field(
        default=4,
        metadata=_help(
            "WSGI worker threads (default 4); scoring holds the GIL, so more processes, not "
            "more threads, add capacity (docs/scaling.md: the CHAIR service at scale)"
        ),
    )
    max_batch: int = field(
        default=4096,
        metadata=_help("most captions per request (default 4096); more -> 413"),
    )
    max_body_mb: float = field(
        default=8.0, metadata=_help("largest request body in MiB (default 8); larger -> 413")
    )
    token: str | None = field(
        default=None,
        metadata=_help(
            "bearer token required on every route but /health (default: $CHAIR_SERVER_TOKEN, "
            "else none)"
        ),
    )
    cache_dir: str | None = field(
        default=None,
        metadata=_help(
            "ground-truth cache folder for --coco (default $CHAIR_CACHE_DIR or ~/.cache/chair_server)"
        ),
    )
    ready_file: str | None = field(
        default=None,
        metadata=_help("write the server URL to this file once serving (for launchers)"),
    )
    max_caption_chars: int = field(
        default=20000,
        metadata=_help(
            "longest caption scored, in characters (default 20000, ~8x a 512-token caption); "
            "a longer one gets a per-caption error entry"
        ),
    )
    max_connections: int = field(
        default=500,
        metadata=_help(
            "open TCP connections served at once (default 500; waitress's own default of 100 "
            "let 100 idle sockets lock every client out)"
        ),
    )
    channel_timeout: float = field(
        default=15.0,
        metadata=_help(
            "seconds an idle connection (no bytes received, no request in flight) stays open "
            "(default 15; waitress's default is 120)"
        ),
    )
    drain_timeout: float = field(
        default=10.0,
        metadata=_help(
            "on SIGTERM/SIGINT: seconds to finish requests in flight before exiting (default 10)"
        ),
    )
    supervise: bool = field(
        default=False,
        metadata=_help(
            "run the service as a child process and start it again (same port, backoff) "
            "when it dies; SIGTERM/SIGINT stop both (default: off)"
        ),
    )
    parent_pid: int | None = field(
        default=None,
        metadata=_help(
            "stop (as on SIGTERM) once the process with this pid is no longer this server's "
            "parent (default: never); launchers pass their own pid so the service does not "
            "outlive them"
        ),
    )

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 1024 * 1024)

    def validate(self) -> ServerSettings:
        """Raise ValueError naming the bad field; returns self for chaining.

        Everything that can be checked without the ground truth is checked here, so a bad
        command line fails in a second instead of after minutes of parsing annotations.
        """
        if (self.coco is None) == (self.ground_truth is None):
            raise ValueError("exactly one of coco / ground_truth is required")
        if not self.host.strip():
            raise ValueError("host must not be empty")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if not (math.isfinite(self.max_body_mb) and MIN_BODY_MB <= self.max_body_mb <= MAX_BODY_MB):
            raise ValueError(
                f"max_body_mb must be a number in [{MIN_BODY_MB:g}, {MAX_BODY_MB:g}], "
                f"got {self.max_body_mb}"
            )
        if self.max_caption_chars < 1:
            raise ValueError(f"max_caption_chars must be >= 1, got {self.max_caption_chars}")
        if self.max_connections < 2:
            raise ValueError(f"max_connections must be >= 2, got {self.max_connections}")
        for name in ("channel_timeout", "drain_timeout"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value}")
        if self.parent_pid is not None and self.parent_pid < 1:
            raise ValueError(f"parent_pid must be a process id >= 1, got {self.parent_pid}")
        if self.token is not None and not self.token.strip():
            raise ValueError("token must not be empty (leave --token out to run without one)")
        if self.ready_file is not None:
            folder = Path(self.ready_file).resolve().parent
            if not folder.is_dir():
                raise ValueError(f"ready_file: folder {folder} does not exist")
        return self

    def warnings(self) -> list[str]:
        """Settings that are allowed but probably unwanted."""
        found = []
        if self.token is None and self.host not in ("127.0.0.1", "localhost", "::1"):
            found.append(
                f"host {self.host} accepts connections from other machines and no --token is "
                "set: anyone who can reach the port can use the service"
            )
        return found


def parse_args(argv: list[str] | None = None) -> ServerSettings:
    """Command line -> validated ServerSettings (flags mirror the dataclass fields)."""
    parser = OneLineParser(
        prog="python -m chair_server", description="CHAIR object-hallucination scoring service"
    )
    # the help texts name their defaults; a switch is off unless given
    add_options(
        parser,
        ServerSettings,
        show_default=False,
        negatable=False,
        exclusive=("coco", "ground_truth"),
    )
    args = vars(parser.parse_args(argv))
    if args["token"] is None:
        args["token"] = os.environ.get("CHAIR_SERVER_TOKEN") or None
    try:
        return ServerSettings(**args).validate()
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def command_line(settings: ServerSettings, *, leave_out: tuple[str, ...] = ()) -> list[str]:
    """The flags that give ``settings`` back (defaults left out), for starting a child service.

    The token is never put on a command line (other users can read it there): pass it in
    ``CHAIR_SERVER_TOKEN``.
    """
    return to_command_line(settings, leave_out=(*leave_out, "token"))
