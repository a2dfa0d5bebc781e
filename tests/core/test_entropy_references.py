"""Token entropy, masked means and the think-tag segments against written-out references:
large logits, a single kept token, rows that differ, tags at the edges of the response."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from entropyrl.core.entropy import masked_mean, segment_mask, sequence_entropy, token_entropy


def _entropy_reference(row: list[float]) -> float:
    top = max(row)
    e = [math.exp(x - top) for x in row]
    total = sum(e)
    return -sum(p / total * math.log(p / total) for p in e if p > 0)


@pytest.mark.parametrize("requires_grad", [False, True])
def test_entropy_of_large_logits_is_finite_and_exact(requires_grad):
    logits = torch.tensor([[1000.0, 999.0, 998.0], [-2000.0, -2000.5, -3000.0], [5e4, 0.0, -5e4]])
    logits.requires_grad_(requires_grad)
    got = token_entropy(logits)
    want = [_entropy_reference(row) for row in logits.tolist()]
    assert torch.isfinite(got).all()
    assert got.tolist() == pytest.approx(want, abs=1e-5)
    if requires_grad:
        got.sum().backward()
        assert torch.isfinite(logits.grad).all()


@pytest.mark.parametrize("chunk_size", [None, 1, 2, 5])
def test_chunks_and_leading_shapes_give_the_rows_entropy(chunk_size):
    logits = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(0)) * 3
    got = token_entropy(logits, chunk_size=chunk_size)
    assert got.shape == (2, 3)
    want = [[_entropy_reference(r) for r in block] for block in logits.tolist()]
    for g, w in zip(got.tolist(), want):
        assert g == pytest.approx(w, abs=1e-5)


def test_token_entropy_refuses_what_has_no_vocabulary():
    for bad in ([1.0, 2.0], torch.tensor(1.0)):
        with pytest.raises(
            ValueError, match=r"^logits must be a tensor with a vocabulary dimension \[\.\.\., V\]$"
        ):
            token_entropy(bad)
    with pytest.raises(ValueError, match=r"^logits has an empty vocabulary dimension$"):
        token_entropy(torch.zeros(2, 0))
    with pytest.raises(ValueError, match=r"^logits must be floating point, got torch.int64$"):
        token_entropy(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^chunk_size must be a positive int or None, got 0$"):
        token_entropy(torch.zeros(2, 3), chunk_size=0)
    assert token_entropy(torch.zeros(0, 4)).shape == (0,)


def test_masked_mean_with_one_kept_token_and_per_row():
    values = torch.tensor([[2.0, float("nan"), 4.0], [1.0, 3.0, float("inf")]])
    mask = torch.tensor([[0, 0, 1], [1, 1, 0]])
    assert float(masked_mean(values, mask, dim=None)) == pytest.approx((4 + 1 + 3) / 3)
    assert float(masked_mean(values, torch.tensor([[0, 0, 1], [0, 0, 0]]), dim=None)) == 4.0
    assert masked_mean(values, mask).tolist() == [4.0, 2.0]
    assert masked_mean(values, torch.zeros(2, 3)).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match=r"^mask shape \(2, 2\) != values shape \(2, 3\)$"):
        masked_mean(values, torch.ones(2, 2))


def test_sequence_entropy_is_each_rows_own_mean():
    h = torch.tensor([[1.0, 3.0, 9.0], [0.5, 0.5, 2.0], [7.0, 7.0, 7.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    got = sequence_entropy(h, mask)
    assert got.dtype == torch.float32
    assert got[:2].tolist() == pytest.approx([2.0, 1.0])
    assert math.isnan(got[2])
    with pytest.raises(ValueError, match=r"^token_entropy must be \[B, T\], got shape \(3,\)$"):
        sequence_entropy(h[0], mask[0])


OPEN, CLOSE = (7, 8), (9,)


def _starts(ids, valid, tag):
    n = len(tag)
    return [
        t
        for t in range(len(ids) - n + 1)
        if tuple(ids[t : t + n]) == tuple(tag) and all(valid[t : t + n])
    ]


def _segment_reference(ids, valid, open_ids, close_ids, mode):
    if mode == "full":
        return list(valid), any(valid)
    closes = _starts(ids, valid, close_ids)
    if not closes:
        return list(valid), False
    last = max(closes)
    if mode == "answer":
        seg = [v and t >= last + len(close_ids) for t, v in enumerate(valid)]
    else:
        opens = [o for o in _starts(ids, valid, open_ids) if o + len(open_ids) <= last]
        start = min(opens) + len(open_ids) if opens else 0
        seg = [v and start <= t < last for t, v in enumerate(valid)]
    return (seg, True) if any(seg) else (list(valid), False)


rows = st.integers(0, 9).flatmap(
    lambda n: st.tuples(
        st.lists(st.sampled_from([1, 2, 7, 8, 9]), min_size=n, max_size=n),
        st.lists(st.booleans(), min_size=n, max_size=n),
    )
)


@settings(max_examples=300, deadline=None)
@given(
    batch=st.lists(rows, min_size=1, max_size=4).filter(lambda b: len({len(r[0]) for r in b}) == 1),
    mode=st.sampled_from(["answer", "thinking", "full"]),
    tags=st.sampled_from([(OPEN, CLOSE), ((7,), (8, 9)), ((9,), (7,))]),
)
def test_segments_are_the_documented_spans(batch, mode, tags):
    open_ids, close_ids = tags
    ids = torch.tensor([r[0] for r in batch], dtype=torch.long).reshape(len(batch), -1)
    valid = torch.tensor([r[1] for r in batch], dtype=torch.bool).reshape(len(batch), -1)
    got, found = segment_mask(ids, valid.int(), open_ids, close_ids, mode)
    for b, (row_ids, row_valid) in enumerate(batch):
        want, want_found = _segment_reference(row_ids, row_valid, open_ids, close_ids, mode)
        assert got[b].tolist() == want and bool(found[b]) == want_found


def test_segment_edges():
    ids = torch.tensor([[9, 1, 2]])
    mask = torch.ones(1, 3)
    # the answer mode needs no opening tag
    seg, found = segment_mask(ids, mask, [], [9], "answer")
    assert seg.tolist() == [[False, True, True]] and found.tolist() == [True]
    # a tag as long as the response, and one longer
    seg, found = segment_mask(ids, mask, [7], [9, 1, 2], "answer")
    assert seg.tolist() == [[True, True, True]] and found.tolist() == [False]
    seg, found = segment_mask(ids, mask, [7], [9, 1, 2, 3], "answer")
    assert found.tolist() == [False]
    # an opening tag just after the last closing tag does not start the thinking span
    seg, found = segment_mask(torch.tensor([[1, 9, 7, 2]]), torch.ones(1, 4), [7], [9], "thinking")
    assert seg.tolist() == [[True, False, False, False]] and found.tolist() == [True]
    with pytest.raises(ValueError, match=r"^close_ids must name at least one token id$"):
        segment_mask(ids, mask, [7], [], "answer")
    with pytest.raises(ValueError, match=r"^open_ids must name at least one token id$"):
        segment_mask(ids, mask, [], [9], "thinking")
    with pytest.raises(ValueError, match=r"^response_ids must be \[B, T\], got shape \(3,\)$"):
        segment_mask(ids[0], mask[0], [7], [9], "answer")
    with pytest.raises(
        ValueError, match=r"^mode must be one of \('answer', 'thinking', 'full'\), got 'Answer'$"
    ):
        segment_mask(ids, mask, [7], [9], "Answer")
    empty, found = segment_mask(
        torch.zeros(2, 0, dtype=torch.long), torch.zeros(2, 0), [7], [9], "answer"
    )
    assert empty.shape == (2, 0) and found.tolist() == [False, False]
