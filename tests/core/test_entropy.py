"""Token entropy, masked means and <think> segments against naive references."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from entropyrl.core.entropy import masked_mean, segment_mask, sequence_entropy, token_entropy

SETTINGS = settings(max_examples=50, deadline=None, derandomize=True)


def naive_entropy(logits):
    """-sum p log p in float64, row by row from the definition."""
    x = logits.double()
    p = torch.softmax(x, dim=-1)
    return -(p * torch.log_softmax(x, dim=-1)).nan_to_num(0.0).sum(dim=-1)


@SETTINGS
@given(
    st.lists(st.integers(0, 4), min_size=0, max_size=3),
    st.integers(1, 50),
    st.integers(1, 7),
    st.integers(0, 2**31),
    st.floats(0.1, 30),
)
def test_token_entropy_matches_naive_and_chunking_is_identical(lead, vocab, chunk, seed, scale):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(*lead, vocab, generator=gen) * scale
    got = token_entropy(logits)
    assert got.shape == tuple(lead) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), naive_entropy(logits), atol=2e-5, rtol=1e-5)
    assert torch.equal(token_entropy(logits, chunk_size=chunk), got)
    assert (got >= 0).all() and (got <= math.log(vocab) + 1e-5).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_token_entropy_low_precision_input_accumulates_in_float32(dtype):
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(4, 6, 3000, generator=gen) * 3).to(dtype)
    got = token_entropy(logits)
    assert got.dtype == torch.float32
    # Reference on the same (rounded) logits in float64.
    torch.testing.assert_close(got.double(), naive_entropy(logits.double()), atol=1e-4, rtol=1e-5)
    assert torch.equal(token_entropy(logits, chunk_size=5), got)


def test_token_entropy_special_rows():
    logits = torch.tensor(
        [
            [0.0, 0.0, 0.0, 0.0],  # uniform: log 4
            [1e4, 0.0, 0.0, 0.0],  # one-hot: 0, not a tiny negative
            [2.0, float("-inf"), 2.0, float("-inf")],  # masked vocabulary: log 2, no NaN
        ]
    )
    got = token_entropy(logits)
    torch.testing.assert_close(got, torch.tensor([math.log(4), 0.0, math.log(2)]))
    assert got[1] == 0.0
    with pytest.raises(ValueError, match="chunk_size"):
        token_entropy(logits, chunk_size=0)
    with pytest.raises(ValueError, match="logits"):
        token_entropy(torch.zeros(3, dtype=torch.long))


def test_token_entropy_gradient_matches_naive():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 5, 17, generator=gen, requires_grad=True)
    token_entropy(x, chunk_size=4).sum().backward()
    y = x.detach().clone().requires_grad_(True)
    p = torch.softmax(y, -1)
    (-(p * torch.log_softmax(y, -1)).sum()).backward()
    torch.testing.assert_close(x.grad, y.grad, atol=1e-5, rtol=1e-4)


def test_masked_mean():
    values = torch.tensor([[1.0, 2.0, float("nan")], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 1]])
    torch.testing.assert_close(masked_mean(values, mask), torch.tensor([1.5, 0.0, 8.0]))
    torch.testing.assert_close(masked_mean(values, mask, dim=None), torch.tensor(19.0 / 4))
    torch.testing.assert_close(
        masked_mean(values, mask.bool(), dim=0), torch.tensor([4.0, 2.0, 9.0])
    )
    se = sequence_entropy(values, mask)
    assert se[0] == 1.5 and math.isnan(se[1]) and se[2] == 8.0


OPEN, CLOSE = [1, 2], [3]


def find(ids, tag):
    return [t for t in range(len(ids) - len(tag) + 1) if ids[t : t + len(tag)] == tag]


def ref_segment(ids, n_valid, open_ids, close_ids, mode):
    """One sample, plainly: returns (mask list, found)."""
    valid = ids[:n_valid]
    full = [t < n_valid for t in range(len(ids))]
    if mode == "full":
        return full, n_valid > 0
    closes = find(valid, close_ids)
    if not closes:
        return full, False
    last = closes[-1]
    if mode == "answer":
        seg = [last + len(close_ids) <= t < n_valid for t in range(len(ids))]
    else:
        opens = [t for t in find(valid, open_ids) if t + len(open_ids) <= last]
        start = opens[0] + len(open_ids) if opens else 0
        seg = [start <= t < last for t in range(len(ids))]
    if not any(seg):
        return full, False
    return seg, True


@SETTINGS
@given(
    st.lists(st.lists(st.integers(0, 4), min_size=0, max_size=12), min_size=1, max_size=6),
    st.sampled_from(["answer", "thinking", "full"]),
    st.sampled_from([(OPEN, CLOSE), ([1], [3, 4]), ([2], [2])]),
    st.integers(0, 4),
)
def test_segment_mask_matches_loop(rows, mode, tags, pad):
    open_ids, close_ids = tags
    width = max(len(r) for r in rows) + pad
    # Padding uses a tag token on purpose: tags in padding must not count.
    ids = torch.tensor([r + [close_ids[0]] * (width - len(r)) for r in rows], dtype=torch.long)
    mask = torch.tensor([[t < len(r) for t in range(width)] for r in rows], dtype=torch.long)
    got, found = segment_mask(ids, mask, open_ids, close_ids, mode)
    assert got.dtype == torch.bool and found.dtype == torch.bool
    for b, r in enumerate(rows):
        want, want_found = ref_segment(ids[b].tolist(), len(r), open_ids, close_ids, mode)
        assert got[b].tolist() == want, (r, mode)
        assert bool(found[b]) == want_found


def test_segment_mask_examples_and_partition():
    # <think>=[1,2]  </think>=[3]; pad 0.
    ids = torch.tensor(
        [
            [1, 2, 7, 8, 3, 9, 9, 0],  # normal
            [7, 8, 3, 9, 0, 0, 0, 0],  # <think> in the prompt
            [1, 2, 7, 3, 8, 3, 5, 0],  # two closing tags: the last one counts
            [1, 2, 7, 8, 3, 0, 0, 0],  # closing tag at the very end: empty answer
            [7, 8, 9, 0, 0, 0, 0, 0],  # no closing tag
        ]
    )
    mask = ids != 0
    ans, found = segment_mask(ids, mask, OPEN, CLOSE, "answer")
    assert found.tolist() == [True, True, True, False, False]
    assert ans[0].nonzero().flatten().tolist() == [5, 6]
    assert ans[1].nonzero().flatten().tolist() == [3]
    assert ans[2].nonzero().flatten().tolist() == [6]
    assert torch.equal(ans[3], mask[3]) and torch.equal(ans[4], mask[4])  # fallback
    think, tfound = segment_mask(ids, mask, OPEN, CLOSE, "thinking")
    assert tfound.tolist() == [True, True, True, True, False]
    assert think[0].nonzero().flatten().tolist() == [2, 3]
    assert think[1].nonzero().flatten().tolist() == [0, 1]
    assert think[2].nonzero().flatten().tolist() == [2, 3, 4]
    # thinking + tags + answer cover the response exactly once where both were found.
    both = found & tfound
    tags = mask & ~ans & ~think
    assert not (ans & think)[both].any()
    assert (tags[both].sum(-1) == torch.tensor([3, 1, 3])).all()
    # The empty answer has no entropy: NaN, the estimators' "missing".
    h = torch.rand(5, 8)
    assert torch.isnan(
        sequence_entropy(
            h, segment_mask(ids, mask, OPEN, CLOSE, "answer")[0] & found.unsqueeze(-1)
        )[3]
    )
    with pytest.raises(ValueError, match="mode"):
        segment_mask(ids, mask, OPEN, CLOSE, "reasoning")
    with pytest.raises(ValueError, match="response_mask"):
        segment_mask(ids, mask[:, :3], OPEN, CLOSE, "answer")


def test_token_entropy_masked_vocabulary_gradient_is_finite():
    x = torch.tensor([[1.0, float("-inf"), 0.5], [float("-inf")] * 2 + [3.0]], requires_grad=True)
    h = token_entropy(x)
    h.sum().backward()
    assert torch.isfinite(x.grad).all()
    torch.testing.assert_close(h.detach(), token_entropy(x.detach(), chunk_size=1))
