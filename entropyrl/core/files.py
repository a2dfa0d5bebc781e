"""Files the project writes: atomically (a half-written file never looks finished), with the
mode any tool's new file gets, JSON that every parser reads (a missing or non-finite number is
`null`, never `NaN` or `Infinity`, which jq and JavaScript reject), stable hashes of JSON
values for order-independent splits, and the caches built once per machine: where they live,
the digest of the source that builds them, and a folder that appears whole or not at all.

The lowest layer: data converters, rewards (the CIDEr-D statistics cache) and the runners use it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "atomic_folder",
    "atomic_path",
    "cache_home",
    "canonical_json",
    "current_umask",
    "finite_json",
    "json_dumps",
    "source_digest",
    "stable_hash",
    "write_json",
    "write_parquet",
]

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


@contextlib.contextmanager
def atomic_folder(target: Path, complete: Callable[[Path], bool]) -> Iterator[Path]:
    """Yield an empty folder beside `target` to fill; rename it onto `target` only on success.

    When another process put a folder there first (the rename fails), theirs is kept if
    `complete(target)` holds; otherwise the error stands. The staging folder never stays.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        yield staging
        try:
            os.replace(staging, target)
        except OSError:  # another process filled it first: keep theirs
            if not complete(target):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def cache_home() -> Path:
    """Where entropyrl keeps what it builds once per machine (tokenizers, warm-up checkpoints):
    `$ENTROPYRL_CACHE`, else `$XDG_CACHE_HOME/entropyrl`, else `~/.cache/entropyrl`, read at
    each call."""
    base = os.environ.get("ENTROPYRL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "entropyrl"
    )
    return Path(base)


def source_digest(names: Sequence[str]) -> str:
    """sha256 of the package files `names` (paths under `entropyrl/`) as installed, names and
    bytes in that order: a cache keyed by it is rebuilt when the code that built it changes."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode() + b"\0" + (package / name).read_bytes() + b"\0")
    return digest.hexdigest()


def finite_json(obj: Any) -> Any:
    """``obj`` with every NaN and infinity as None, through dicts, lists and tuples (tuples become
    lists, as JSON writes them); numpy and torch scalars (0-d: ``.item()``) become Python
    numbers first. Other values are returned as they are."""
    if isinstance(obj, float):  # numpy.float64 too
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, str | int):  # bool is an int
        return obj
    if isinstance(obj, dict):
        return {key: finite_json(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite_json(value) for value in obj]
    item = getattr(obj, "item", None)
    if callable(item) and getattr(obj, "ndim", None) == 0:  # numpy scalar, 0-d array or tensor
        return finite_json(item())
    return obj


def json_dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of ``finite_json(obj)`` with ``allow_nan=False``: strict JSON, null for a
    missing or non-finite number. Keyword arguments go to ``json.dumps``."""
    return json.dumps(finite_json(obj), allow_nan=False, **kwargs)


def write_json(obj: Any, path: str | os.PathLike[str], *, indent: int | None = 1) -> None:
    """``obj`` as strict JSON (``json_dumps``, UTF-8, a final newline), written atomically."""
    text = json_dumps(obj, ensure_ascii=False, indent=indent) + "\n"
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


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
