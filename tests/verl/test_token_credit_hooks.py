"""The token mechanisms' step logic on verl's per-sample reward extra info (hand-built rows)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tensordict.tensorclass import NonTensorData

from entropyrl.core.specs import ClipScheduleSpec
from entropyrl.core.token_credit import hallucinated_token_mask
from entropyrl.verl.hooks import (
    TOKEN_POSITIONS_KEY,
    clip_low_from_chair,
    require_token_positions,
    token_credit_metrics,
    token_penalty_from_step,
    token_positions_from_spans,
)


def hallucinated_tokens(extra, mask):
    """The trainer's mask from rows that report positions (no spans: no tokenizer is read)."""
    responses = torch.zeros(mask.shape, dtype=torch.long)
    return hallucinated_token_mask(
        token_positions_from_spans(extra, responses, mask, tokenizer=None), mask
    )


def rows(*positions):
    return [
        {"reward_extra_info": {"chair_i": 0.0}}
        if p is None
        else NonTensorData({"reward_extra_info": {TOKEN_POSITIONS_KEY: p}})
        for p in positions
    ]


def test_penalty_from_extra_info_matches_a_loop():
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]])
    extra = rows([1, 2], np.array([0]), None)
    hall, scored = hallucinated_tokens(extra, mask)
    assert scored.tolist() == [True, True, False]
    adv = torch.tensor([0.5, -1.0, 0.0]).unsqueeze(-1) * mask
    moved, metrics = token_penalty_from_step(adv, hall, mask, beta=0.25)
    want = adv.clone()
    for b, p in enumerate([[1, 2], [0], []]):
        for t in p:
            want[b, t] -= 0.25
    torch.testing.assert_close(moved, want)
    assert metrics == {"token_credit/penalised_tokens": 3.0}
    shares = token_credit_metrics(hall, mask, scored)
    assert shares["token_credit/hallucinated_token_frac"] == pytest.approx(3 / 7)
    assert shares["token_credit/unscored_samples"] == 1.0


def test_a_step_without_positions_is_refused_and_bad_rows_too():
    mask = torch.ones(2, 3)
    _, scored = hallucinated_tokens(rows(None, None), mask)
    with pytest.raises(ValueError, match="token_penalty is on"):
        require_token_positions(scored, None, "algorithm.token_penalty")
    with pytest.raises(ValueError, match="list of token indices"):
        hallucinated_tokens(rows(["a"], None), mask)
    with pytest.raises(ValueError, match="outside its response"):
        hallucinated_tokens(rows([3], None), mask)


def test_clip_low_from_chair():
    chair = torch.tensor([0.0, 0.3, math.nan])
    assert clip_low_from_chair(chair, ClipScheduleSpec()) == (None, {})
    low, metrics = clip_low_from_chair(chair, ClipScheduleSpec(enable=True, low=0.2, high=0.4))
    torch.testing.assert_close(low, torch.tensor([0.2, 0.4, 0.2]))
    assert metrics["clip/low_bound_max"] == pytest.approx(0.4)
