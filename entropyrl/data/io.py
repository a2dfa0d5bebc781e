"""Input shared by the dataset converters.

JSON / JSON-lines readers (and the image-id lists of `prepare coco --hold-out` and the
caption evaluation) whose errors name the file and the line, a progress bar for long
inputs, and the report of rejected rows (nothing is dropped silently). Outputs are written
through `entropyrl.core.files` (atomic, stable hashes).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from entropyrl.core.files import atomic_path

__all__ = [
    "InputFileError",
    "RejectLog",
    "file_sha256",
    "progress",
    "read_image_list",
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


_FILE_ID = re.compile(r"(\d+)\.(?:jpe?g|png)$", re.IGNORECASE)


def _image_id(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip()
    if text.isdigit():
        return int(text)
    match = _FILE_ID.search(text)
    if match is None:
        raise InputFileError(f"{where}: {text[:80]!r} is neither an image id nor a COCO file name")
    return int(match.group(1))


def read_image_list(path: str | os.PathLike[str]) -> list[int]:
    """Image ids from a list file: JSON (a list of ids or COCO file names, or an object with
    `image_ids`), JSON lines with `image_id` / `image`, or plain text (one id or file name a line,
    `#` comments). The order is kept; a repeated image is an error."""
    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"{path}: image list not found")
    text = path.read_text(encoding="utf-8")
    entries: list[tuple[Any, str]] = []
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    if isinstance(data, Mapping):
        data = data.get("image_ids")
        if not isinstance(data, list):
            raise InputFileError(f"{path}: a JSON object needs an 'image_ids' list")
    if isinstance(data, list):
        entries = [(value, f"{path}, item {i}") for i, value in enumerate(data, 1)]
    else:
        for number, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            value: Any = line
            if line.startswith("{"):
                record = json.loads(line)
                value = record.get("image_id", record.get("image"))
            entries.append((value, f"{path}, line {number}"))
    ids: list[int] = []
    seen: set[int] = set()
    for value, where in entries:
        image_id = _image_id(value, where)
        if image_id in seen:
            raise InputFileError(f"{where}: image {image_id} is listed twice")
        seen.add(image_id)
        ids.append(image_id)
    if not ids:
        raise InputFileError(f"{path}: no images listed")
    return ids
