"""Input shared by the dataset converters.

JSON / JSON-lines readers whose errors name the file and the line, a progress bar for long
inputs, and the report of rejected rows (nothing is dropped silently). Outputs are written
through `entropyrl.files` (atomic, stable hashes).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from entropyrl.files import atomic_path

__all__ = [
    "InputFileError",
    "RejectLog",
    "file_sha256",
    "progress",
    "read_json",
    "read_records",
]

T = TypeVar("T")
PROGRESS_MIN_ITEMS = 2000  # below this a bar is noise


class InputFileError(ValueError):
    """A converter input is missing or not parseable; the message names the file (and line)."""


def progress(items: Iterable[T], *, total: int | None = None, desc: str = "") -> Iterable[T]:
    """A tqdm bar on stderr for long inputs (and only on a terminal); the items unchanged."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    if total is not None and total < PROGRESS_MIN_ITEMS:
        return items
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return items
    return tqdm(items, total=total, desc=desc, unit="row", disable=None, leave=False)


def _require_file(path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    if not path.exists():
        raise InputFileError(f"{path}: file not found")
    if not path.is_file():
        raise InputFileError(f"{path}: not a regular file")
    return path


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 of a file's bytes (hex), read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with _require_file(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_json(path: str | os.PathLike[str]) -> Any:
    """One JSON document; a parse error names the file, line and column."""
    path = _require_file(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        raise InputFileError(f"{path}: not UTF-8 text ({error})") from None
    except json.JSONDecodeError as error:
        raise InputFileError(
            f"{path}, line {error.lineno}, column {error.colno}: invalid JSON ({error.msg})"
        ) from None


def read_records(path: str | os.PathLike[str]) -> list[tuple[int, Any]]:
    """``[(line_number, record)]`` from a JSON array file or a JSON-lines file.

    BFCL ships JSON lines under a ``.json`` name, so the content decides: a file whose first
    non-blank character is ``[`` is one array (numbered by element, from 1), otherwise one
    record per non-blank line. A line that is not JSON is an input-file error naming the line.
    """
    path = _require_file(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise InputFileError(f"{path}: not UTF-8 text ({error})") from None
    if text.lstrip().startswith("["):
        data = read_json(path)
        return [(index + 1, record) for index, record in enumerate(data)]
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append((number, json.loads(line)))
        except json.JSONDecodeError as error:
            raise InputFileError(
                f"{path}, line {number}, column {error.colno}: invalid JSON ({error.msg})"
            ) from None
    return records


@dataclass
class RejectLog:
    """Rows a converter could not use, with the reason; reported, never silently dropped."""

    source: str = ""
    entries: list[dict[str, Any]] = field(default_factory=list)

    def add(self, line: int | str, reason: str, *, source: str | None = None) -> None:
        self.entries.append(
            {
                "source": source if source is not None else self.source,
                "line": line,
                "reason": reason,
            }
        )

    def __len__(self) -> int:
        return len(self.entries)

    def first(self, limit: int = 20) -> list[str]:
        """Human-readable lines for the first ``limit`` rejects."""
        return [
            f"{entry['source']}:{entry['line']}: {entry['reason']}"
            for entry in self.entries[:limit]
        ]

    def write(self, path: str | os.PathLike[str]) -> Path | None:
        """Write all rejects as JSON lines (atomically); None, and no file, when there are none."""
        path = Path(path)
        if not self.entries:
            path.unlink(missing_ok=True)  # a stale report from an earlier run would mislead
            return None
        with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as handle:
            for entry in self.entries:
                handle.write(json.dumps(entry, ensure_ascii=False) + "\n")
        return path
