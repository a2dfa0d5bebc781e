"""Segment (group) reductions shared by the estimators: ids -> compact index, sums, maxima.

All functions take a compact index ``inv`` (LongTensor[B], values in ``0..G-1``) produced by
:func:`group_index`; empty groups are allowed (their count is 0) and callers must ignore them.
"""

from __future__ import annotations

import torch
from torch import Tensor

_INTEGER_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def check_1d(x: Tensor, name: str, length: int | None = None) -> None:
    """Raise a ValueError naming ``name`` unless ``x`` is a 1-D tensor of ``length``."""
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 1:
        raise ValueError(f"{name} must be 1-D [B], got shape {tuple(x.shape)}")
    if length is not None and x.shape[0] != length:
        raise ValueError(f"{name} has length {x.shape[0]}, expected {length} (one per sample)")


def float_dtype(x: Tensor) -> torch.dtype:
    """Working dtype: float64 stays float64, everything else is computed in float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def group_index(group: Tensor, length: int, name: str = "group") -> tuple[Tensor, int]:
    """Map arbitrary integer group ids (any order, any values) to a compact index.

    Args:
        group: IntTensor[B] of group ids.
        length: expected B.

    Returns:
        (inv LongTensor[B] with values in 0..G-1, G). Samples share a value of ``inv`` exactly
        when they share a group id. Some of the G slots may be empty.
    """
    check_1d(group, name, length)
    if group.dtype not in _INTEGER_DTYPES:
        raise ValueError(f"{name} must hold integer group ids, got dtype {group.dtype}")
    if length == 0:
        return group.new_zeros(0, dtype=torch.long), 0
    lo, hi = torch.aminmax(group)
    lo, hi = int(lo), int(hi)
    # Ids that are already small non-negative integers (the usual 0..n_prompts-1 or
    # compact uids) index the group tables directly: no sort needed. Anything else goes
    # through torch.unique, which sorts but accepts any integer values.
    if lo >= 0 and hi < 2 * length + 1024:
        return group.long(), hi + 1
    _, inv = torch.unique(group, return_inverse=True)
    return inv, int(inv.max()) + 1


def seg_count(inv: Tensor, num_groups: int, dtype: torch.dtype) -> Tensor:
    """Tensor[G]: number of samples per group."""
    return torch.bincount(inv, minlength=num_groups).to(dtype)


def seg_sum(values: Tensor, inv: Tensor, num_groups: int) -> Tensor:
    """Tensor[G]: per-group sum of ``values`` (Tensor[B])."""
    # scatter_add_ is the fastest segment sum on CPU here (index_add_ and bincount with
    # weights take about 1.6x as long at B = 65,536).
    return values.new_zeros(num_groups).scatter_add_(0, inv, values)


def gather(table: Tensor, inv: Tensor) -> Tensor:
    """Tensor[B]: ``table[inv]``; index_select is ~3x faster than advanced indexing on CPU."""
    return table.index_select(0, inv)


def seg_max(values: Tensor, inv: Tensor, num_groups: int) -> Tensor:
    """Tensor[G]: per-group maximum; -inf for empty groups."""
    out = values.new_full((num_groups,), float("-inf"))
    return out.scatter_reduce_(0, inv, values, reduce="amax", include_self=True)
