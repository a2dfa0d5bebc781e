"""The token-level credit functions at their edges: positions at the ends of the response, bounds
given per sample or per token, a share over no tokens, and each refusal's message."""

from __future__ import annotations

import math

import pytest
import torch

from entropyrl.core.token_credit import (
    hallucinated_token_mask,
    hallucinated_token_share,
    token_clip_bounds,
    token_penalty_advantage,
)

MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])


def test_positions_at_both_ends_of_the_response():
    out, scored = hallucinated_token_mask([[0, 2], [3]], MASK)
    assert out.dtype == torch.float32
    assert out.tolist() == [[1, 0, 1, 0], [0, 0, 0, 1]]
    assert scored.dtype == torch.bool and scored.tolist() == [True, True]
    out, scored = hallucinated_token_mask([None, []], MASK)
    assert out.sum() == 0 and scored.tolist() == [False, True]


@pytest.mark.parametrize("positions", [[[-1], []], [[4], []], [[3], []], [[], [5]]])
def test_a_position_off_the_response_is_refused(positions):
    with pytest.raises(
        ValueError, match=r"^a hallucinated token position lies outside its response$"
    ):
        hallucinated_token_mask(positions, MASK)


def test_row_count_must_match():
    with pytest.raises(ValueError, match=r"^positions has 1 rows, the batch has 2$"):
        hallucinated_token_mask([[0]], MASK)


def test_penalty_on_per_sample_and_per_token_advantages():
    h = torch.tensor([[1, 0, 1, 0], [0, 0, 0, 1]], dtype=torch.float64)
    a = torch.tensor([0.5, -1.0], dtype=torch.float64)
    got = token_penalty_advantage(a, h, MASK, beta=0.25)
    assert got.dtype == torch.float64
    assert got.tolist() == [[0.25, 0.5, 0.25, 0.5], [-1.0, -1.0, -1.0, -1.25]]
    per_token = torch.arange(8, dtype=torch.float32).reshape(2, 4)
    got = token_penalty_advantage(per_token, h, MASK, beta=1)
    assert got.dtype == torch.float32
    assert got.tolist() == [[-1.0, 1.0, 1.0, 3.0], [4.0, 5.0, 6.0, 6.0]]
    with pytest.raises(ValueError, match=r"^advantages must be \[B\] or \[B, T\], got \(3,\)$"):
        token_penalty_advantage(torch.ones(3), h, MASK, beta=1)
    for beta in (-0.1, math.inf, "1"):
        with pytest.raises(ValueError, match=r"^beta must be a finite number >= 0, got "):
            token_penalty_advantage(a, h, MASK, beta=beta)
    assert token_penalty_advantage(a, h, MASK, beta=0).tolist() == [[0.5] * 4, [-1.0] * 4]


def test_the_mask_must_be_zero_or_one_on_the_response():
    bad = torch.tensor([[0.5, 0, 0, 0], [0, 0, 0, 0]])
    with pytest.raises(
        ValueError,
        match=r"^hallucinated_tokens must be 0 or 1 on response tokens \(got NaN or other\)$",
    ):
        token_penalty_advantage(torch.zeros(2), bad, MASK, beta=1)
    off = torch.tensor([[0, 0, 0, float("nan")], [0, 0, 0, 1]])  # NaN off the response: ignored
    assert token_penalty_advantage(torch.zeros(2), off, MASK, beta=1)[0].tolist() == [0.0] * 4
    with pytest.raises(
        ValueError,
        match=r"^hallucinated_tokens must be \[B, T\] like the response mask \(2, 4\), got \(2, 3\)$",
    ):
        token_penalty_advantage(torch.zeros(2), torch.zeros(2, 3), MASK, beta=1)


def test_clip_bounds_from_floats_samples_and_tokens():
    h = torch.tensor([[1, 0, 0, 0], [0, 0, 0, 1]])
    low, high = token_clip_bounds(
        h, MASK, base_low=0.2, base_high=0.28, token_low=0.1, token_high=0.5
    )
    assert low.dtype == high.dtype == torch.float64
    assert low.tolist() == [[0.1, 0.2, 0.2, 0.2], [0.2, 0.2, 0.2, 0.1]]
    assert high.tolist() == [[0.5, 0.28, 0.28, 0.28], [0.28, 0.28, 0.28, 0.5]]
    per_sample = torch.tensor([0.3, 0.4], dtype=torch.float32)
    low, _ = token_clip_bounds(
        h, MASK, base_low=per_sample, base_high=0.28, token_low=0.0, token_high=0.0
    )
    assert low[0].tolist() == [0.0, pytest.approx(0.3), pytest.approx(0.3), pytest.approx(0.3)]
    assert low[1, :3].tolist() == [pytest.approx(0.4)] * 3
    per_token = torch.full((2, 4), 0.25)
    _, high = token_clip_bounds(
        h, MASK, base_low=0.2, base_high=per_token, token_low=0.1, token_high=0.9
    )
    assert high.tolist() == [[0.9, 0.25, 0.25, 0.25], [0.25, 0.25, 0.25, 0.9]]
    for name, shape in (("base_low", (4,)), ("base_high", (2, 3))):
        kwargs = {"base_low": 0.2, "base_high": 0.2, name: torch.zeros(shape)}
        with pytest.raises(
            ValueError,
            match=rf"^{name} must be a float, \[B\] or \[B, T\], got {tuple(shape)}".replace(
                "(", r"\("
            ).replace(")", r"\)"),
        ):
            token_clip_bounds(h, MASK, token_low=0.1, token_high=0.1, **kwargs)
    for name in ("token_low", "token_high"):
        for bad in (-0.1, math.inf):
            kwargs = {"token_low": 0.1, "token_high": 0.1, name: bad}
            with pytest.raises(
                ValueError, match=rf"^{name} must be a finite number >= 0, got {bad}$"
            ):
                token_clip_bounds(h, MASK, base_low=0.2, base_high=0.2, **kwargs)


def test_share_over_scored_rows_and_over_none():
    h = torch.tensor([[1, 0, 1, 0], [0, 0, 0, 1]])
    assert hallucinated_token_share(h, MASK) == (pytest.approx(3 / 7), 7)
    assert hallucinated_token_share(h, MASK, torch.tensor([False, True])) == (0.25, 4)
    share, tokens = hallucinated_token_share(h, MASK, torch.tensor([False, False]))
    assert math.isnan(share) and tokens == 0
    share, tokens = hallucinated_token_share(torch.zeros(1, 0), torch.zeros(1, 0))
    assert math.isnan(share) and tokens == 0
