"""The segment helpers every group formula stands on, at their edges: empty groups, ids that
are not small, non-integer ids, and each refusal's message."""

from __future__ import annotations

import pytest
import torch

from entropyrl.core._segments import check_1d, group_index, seg_count, seg_max, seg_sum


def test_check_1d_names_the_argument():
    with pytest.raises(ValueError, match=r"^scores must be a torch\.Tensor, got list$"):
        check_1d([1.0], "scores")
    with pytest.raises(ValueError, match=r"^scores must be 1-D \[B\], got shape \(2, 1\)$"):
        check_1d(torch.zeros(2, 1), "scores")
    with pytest.raises(ValueError, match=r"^scores has length 2, expected 3 \(one per sample\)$"):
        check_1d(torch.zeros(2), "scores", 3)
    check_1d(torch.zeros(3), "scores", 3)


def test_group_index_of_any_ids():
    inv, groups = group_index(torch.tensor([5, 5, 2]), 3)
    assert inv.dtype == torch.long
    assert inv.tolist() == [5, 5, 2] and groups == 6  # small ids index directly (empty slots)
    inv, groups = group_index(torch.tensor([-7, 10**6, -7, 3]), 4)
    assert inv.tolist() == [0, 2, 0, 1] and groups == 3
    inv, groups = group_index(torch.zeros(0, dtype=torch.int32), 0)
    assert inv.dtype == torch.long and inv.numel() == 0 and groups == 0
    with pytest.raises(
        ValueError, match=r"^uid must hold integer group ids, got dtype torch\.float32$"
    ):
        group_index(torch.tensor([1.0]), 1, name="uid")
    with pytest.raises(ValueError, match=r"^group has length 1, expected 2 \(one per sample\)$"):
        group_index(torch.tensor([1]), 2)


def test_segment_reductions_keep_empty_groups():
    inv = torch.tensor([0, 0, 2])
    values = torch.tensor([-5.0, -7.0, 3.0])
    assert seg_count(inv, 4, torch.float32).tolist() == [2.0, 0.0, 1.0, 0.0]
    assert seg_count(inv, 4, torch.long).dtype == torch.long
    assert seg_sum(values, inv, 4).tolist() == [-12.0, 0.0, 3.0, 0.0]
    assert seg_max(values, inv, 4).tolist() == [-5.0, float("-inf"), 3.0, float("-inf")]
