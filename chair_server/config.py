"""Settings of the CHAIR service: one typed config, the command line mirrors it."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, fields


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
        metadata=_help("WSGI worker threads (default 4; scoring is ~0.05 ms per caption)"),
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

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 1024 * 1024)

    def validate(self) -> ServerSettings:
        """Raise ValueError naming the bad field; returns self for chaining."""
        if (self.coco is None) == (self.ground_truth is None):
            raise ValueError("exactly one of coco / ground_truth is required")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.max_body_mb <= 0:
            raise ValueError(f"max_body_mb must be > 0, got {self.max_body_mb}")
        return self


def parse_args(argv: list[str] | None = None) -> ServerSettings:
    """Command line -> validated ServerSettings (flags mirror the dataclass fields)."""
    parser = argparse.ArgumentParser(
        prog="python -m chair_server", description="CHAIR object-hallucination scoring service"
    )
    source = parser.add_mutually_exclusive_group(required=True)
    types = {"port": int, "workers": int, "max_batch": int, "max_body_mb": float}
    for f in fields(ServerSettings):
        flag = "--" + f.name.replace("_", "-")
        target = source if f.name in ("coco", "ground_truth") else parser
        target.add_argument(
            flag,
            dest=f.name,
            type=types.get(f.name, str),
            default=f.default,
            help=f.metadata["help"],
        )
    args = vars(parser.parse_args(argv))
    if args["token"] is None:
        args["token"] = os.environ.get("CHAIR_SERVER_TOKEN") or None
    try:
        return ServerSettings(**args).validate()
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits
