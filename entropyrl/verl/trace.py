"""Per-sample records of a real verl run, to check that each sample's values reach the loss.

With `ENTROPYRL_TRACE_DIR=DIR`, the entropy-aware trainer writes one JSON line per sample and
step to `DIR/driver.jsonl` (the clip bound it computed from CHAIR_i, the advantage) and the actor
loss writes one line per sample and micro-batch to `DIR/worker-<rank>-<pid>.jsonl` (the bound and
advantage it actually used). Samples are matched by a key derived from the response tokens, which
both sides hold; the tests join the files. Off by default: nothing is computed or written.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

TRACE_ENV = "ENTROPYRL_TRACE_DIR"


def trace_dir() -> Path | None:
    path = os.environ.get(TRACE_ENV)
    return Path(path) if path else None


def sample_keys(responses: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
    """One key per row [B]: a hash of the row's response tokens under its mask."""
    keys = []
    for tokens, mask in zip(responses.detach().cpu(), response_mask.detach().cpu().bool()):
        data = tokens[mask].to(torch.int64).numpy().tobytes()
        keys.append(hashlib.sha1(data).hexdigest()[:16])
    return keys


def _first_token_values(values: torch.Tensor, response_mask: torch.Tensor) -> list[float | None]:
    """The value at each row's first response token ([B, T] -> [B]); None for empty rows."""
    values, mask = values.detach().cpu().float(), response_mask.detach().cpu().bool()
    out: list[float | None] = []
    for row, row_mask in zip(values, mask):
        positions = torch.nonzero(row_mask, as_tuple=False)
        out.append(float(row[positions[0, 0]]) if len(positions) else None)
    return out


def write(name: str, rows: Iterable[dict[str, Any]]) -> None:
    directory = trace_dir()
    if directory is None:
        return
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f"{name}.jsonl", "a") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def sample_rows(
    *,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    clip_high: torch.Tensor | None,
    advantages: torch.Tensor | None,
    **extra: Any,
) -> list[dict[str, Any]]:
    """Trace rows for a batch: key, clip bound (None without one), advantage at token 0."""
    keys = sample_keys(responses, response_mask)
    bounds = (
        [None] * len(keys)
        if clip_high is None
        else [float(v) for v in clip_high.detach().cpu().reshape(-1)]
    )
    advantage = (
        [None] * len(keys) if advantages is None else _first_token_values(advantages, response_mask)
    )
    return [
        {"key": key, "clip_high": bound, "advantage": adv, **extra}
        for key, bound, adv in zip(keys, bounds, advantage)
    ]


def read(directory: Path, prefix: str) -> list[dict[str, Any]]:
    """Every row of the trace files `DIR/<prefix>*.jsonl`."""
    rows = []
    for path in sorted(directory.glob(f"{prefix}*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows
