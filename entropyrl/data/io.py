"""Input/output shared by the dataset converters.

Atomic outputs (a half-written parquet file must never look like a dataset), JSON / JSON-lines
readers whose errors name the file and the line, a progress bar for long inputs, stable hashes
for order-independent splits, and the report of rejected rows (nothing is dropped silently).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "InputFileError",
    "RejectLog",
    "atomic_path",
    "canonical_json",
    "current_umask",
    "progress",
    "read_json",
    "read_records",
    "stable_hash",
    "write_json",
    "write_parquet",
]

T = TypeVar("T")
PROGRESS_MIN_ITEMS = 2000  # below this a bar is noise


class InputFileError(ValueError):
    """A converter input is missing or not parseable; the message names the file (and line)."""


_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process umask, read without changing it where the system allows (Linux /proc)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    with _UMASK_LOCK:  # elsewhere: set and restore (threads of this module are serialised)
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only on success.

    The file gets the mode any tool's new file gets (0666 less the umask): mkstemp's 0600,
    kept private while it is written, would otherwise leave data files unreadable to others.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def write_json(obj: Any, path: str | os.PathLike[str]) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


def write_parquet(rows: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """Write rows (dicts with the same keys) as one parquet file, atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(list(rows))
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def canonical_json(obj: Any) -> str:
    """One spelling per JSON value (sorted keys, no spaces): the input of :func:`stable_hash`."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def stable_hash(*parts: Any) -> int:
    """sha1 of the parts' canonical JSON as an int: same on every machine and Python run."""
    digest = hashlib.sha1(canonical_json(list(parts)).encode("utf-8")).hexdigest()
    return int(digest, 16)


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
