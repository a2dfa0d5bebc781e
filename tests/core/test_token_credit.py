"""Token penalty, token clip and clip-low schedule against written-out per-token formulas."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from entropyrl.core.clip_schedules import CLIP_RULES, DIRECTIONS, clip_low_bounds
from entropyrl.core.losses import ppo_clip_loss
from entropyrl.core.specs import ClipScheduleSpec
from entropyrl.core.token_credit import (
    hallucinated_token_mask,
    hallucinated_token_share,
    token_clip_bounds,
    token_penalty_advantage,
)

SETTINGS = settings(max_examples=50, deadline=None, derandomize=True)


def batch(seed, bsz, seq, share=0.3, per_token=False):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(bsz, seq, generator=gen, dtype=torch.float64) * 3
    new = old + torch.randn(bsz, seq, generator=gen, dtype=torch.float64) * 0.6
    shape = (bsz, seq) if per_token else (bsz,)
    adv = torch.randn(*shape, generator=gen, dtype=torch.float64)
    mask = (torch.rand(bsz, seq, generator=gen) > 0.25).long()
    hall = ((torch.rand(bsz, seq, generator=gen) < share) & mask.bool()).float()
    return new, old, adv, mask, hall


def ref_penalty(adv, hall, mask, beta):
    bsz, seq = mask.shape
    out = [[0.0] * seq for _ in range(bsz)]
    for b in range(bsz):
        for t in range(seq):
            a = float(adv[b, t]) if adv.dim() == 2 else float(adv[b])
            if mask[b, t] and hall[b, t] == 1:
                a -= beta
            out[b][t] = a
    return out


def ref_token_clip_loss(new, old, adv, mask, hall, base_low, base_high, tok_low, tok_high, c):
    """Token loop: each token's bounds picked by hand, then PPO with dual clip; token mean."""
    losses = []
    bsz, seq = new.shape
    for b in range(bsz):
        for t in range(seq):
            if not mask[b, t]:
                continue
            low = tok_low if hall[b, t] == 1 else float(base_low[b])
            high = tok_high if hall[b, t] == 1 else float(base_high[b])
            a = float(adv[b, t]) if adv.dim() == 2 else float(adv[b])
            rho = math.exp(min(max(float(new[b, t] - old[b, t]), -20.0), 20.0))
            loss = max(-a * rho, -a * min(max(rho, 1 - low), 1 + high))
            if c is not None and a < 0:
                loss = min(loss, -a * c)
            losses.append(loss)
    return sum(losses) / max(len(losses), 1)


@SETTINGS
@given(
    st.integers(0, 2**31),
    st.integers(1, 5),
    st.integers(1, 7),
    st.floats(0, 2),
    st.sampled_from([0.0, 0.3, 1.0]),
    st.booleans(),
)
def test_token_penalty_matches_reference(seed, bsz, seq, beta, share, per_token):
    _, _, adv, mask, hall = batch(seed, bsz, seq, share, per_token)
    got = token_penalty_advantage(adv, hall, mask, beta=beta)
    assert got.shape == mask.shape and got.dtype == adv.dtype
    torch.testing.assert_close(
        got, torch.tensor(ref_penalty(adv, hall, mask, beta), dtype=adv.dtype)
    )


def test_token_penalty_by_hand():
    adv = torch.tensor([1.0, -0.5, 0.0])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    hall = torch.tensor([[0, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)
    got = token_penalty_advantage(adv, hall, mask, beta=0.5)
    want = torch.tensor([[1.0, 0.5, 0.5, 1.0], [-1.0, -1.0, -0.5, -0.5], [0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(got, want)
    # no hallucinated token: every token keeps its group advantage; a group of one (A = 0) too
    torch.testing.assert_close(
        token_penalty_advantage(adv, torch.zeros(3, 4), mask, beta=0.5),
        adv.unsqueeze(-1).expand(3, 4),
    )


def test_token_penalty_edges():
    mask = torch.tensor([[1, 1, 0]])
    # NaN off the response (padding) passes through untouched; on it, it is refused.
    adv = torch.tensor([[0.2, 0.1, float("nan")]])
    hall = torch.tensor([[1.0, 0.0, float("nan")]])
    got = token_penalty_advantage(adv, hall, mask, beta=1.0)
    assert got[0, 0] == pytest.approx(-0.8) and got[0, 1] == pytest.approx(0.1)
    assert math.isnan(got[0, 2])
    # a 1 off the response (a mention past the truncation) moves nothing
    off = token_penalty_advantage(
        torch.zeros(1, 3), torch.tensor([[0.0, 0.0, 1.0]]), mask, beta=1.0
    )
    assert off.tolist() == [[0.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="0 or 1"):
        token_penalty_advantage(adv, torch.tensor([[float("nan"), 0.0, 0.0]]), mask, beta=1.0)
    with pytest.raises(ValueError, match="0 or 1"):
        token_penalty_advantage(adv, torch.tensor([[0.5, 0.0, 0.0]]), mask, beta=1.0)
    with pytest.raises(ValueError, match="beta"):
        token_penalty_advantage(adv, hall, mask, beta=-1.0)
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        token_penalty_advantage(adv, hall[:, :2], mask, beta=1.0)
    empty = torch.zeros(0, 3)
    assert token_penalty_advantage(torch.zeros(0), empty, empty, beta=1.0).shape == (0, 3)


@SETTINGS
@given(
    st.integers(0, 2**31),
    st.integers(1, 5),
    st.integers(1, 7),
    st.sampled_from([0.0, 0.3, 1.0]),
    st.floats(0, 0.9),
    st.floats(0, 1),
    st.booleans(),
    st.sampled_from([None, 3.0]),
)
def test_token_clip_loss_matches_reference(seed, bsz, seq, share, tok_low, tok_high, per_sample, c):
    new, old, adv, mask, hall = batch(seed, bsz, seq, share)
    gen = torch.Generator().manual_seed(seed + 1)
    if per_sample:
        base_low = torch.rand(bsz, generator=gen) * 0.5
        base_high = torch.rand(bsz, generator=gen) * 0.5
    else:
        base_low, base_high = 0.2, 0.28
    low, high = token_clip_bounds(
        hall, mask, base_low=base_low, base_high=base_high, token_low=tok_low, token_high=tok_high
    )
    assert low.shape == high.shape == mask.shape
    loss, _, _ = ppo_clip_loss(new, old, adv, mask, clip_low=low, clip_high=high, clip_c=c)
    bl = base_low if per_sample else torch.full((bsz,), base_low, dtype=torch.float64)
    bh = base_high if per_sample else torch.full((bsz,), base_high, dtype=torch.float64)
    want = ref_token_clip_loss(new, old, adv, mask, hall, bl, bh, tok_low, tok_high, c)
    assert float(loss) == pytest.approx(want, rel=1e-9, abs=1e-12)
    # with no hallucinated token the per-token loss is the per-sample one exactly
    plain, _, _ = ppo_clip_loss(
        new, old, adv, mask, clip_low=base_low, clip_high=base_high, clip_c=c
    )
    none_low, none_high = token_clip_bounds(
        torch.zeros_like(hall),
        mask,
        base_low=base_low,
        base_high=base_high,
        token_low=tok_low,
        token_high=tok_high,
    )
    same, _, _ = ppo_clip_loss(
        new, old, adv, mask, clip_low=none_low, clip_high=none_high, clip_c=c
    )
    assert float(same) == float(plain)


def test_token_clip_bounds_by_hand():
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    hall = torch.tensor([[0, 1, 0], [1, 1, 0]], dtype=torch.float32)
    low, high = token_clip_bounds(
        hall, mask, base_low=0.2, base_high=torch.tensor([0.3, 0.5]), token_low=0.1, token_high=0.6
    )
    torch.testing.assert_close(
        low, torch.tensor([[0.2, 0.1, 0.2], [0.1, 0.1, 0.2]], dtype=torch.float64)
    )
    torch.testing.assert_close(
        high, torch.tensor([[0.3, 0.6, 0.3], [0.6, 0.6, 0.5]], dtype=torch.float64)
    )
    # every token hallucinated: every response token gets the token bounds
    low, high = token_clip_bounds(
        mask.float(), mask, base_low=0.2, base_high=0.28, token_low=0.4, token_high=0.1
    )
    assert (low[mask.bool()] == 0.4).all() and (high[mask.bool()] == 0.1).all()
    with pytest.raises(ValueError, match="token_high"):
        token_clip_bounds(hall, mask, base_low=0.2, base_high=0.3, token_low=0.1, token_high=-1)


def test_one_clipped_token_by_hand():
    # ratio 1.5 with A > 0: base bound 0.28 clips at 1.28, the hallucinated token's 0.6 does not.
    new = torch.log(torch.tensor([[1.5, 1.5]], dtype=torch.float64))
    old = torch.zeros_like(new)
    mask = torch.ones(1, 2)
    low, high = token_clip_bounds(
        torch.tensor([[0.0, 1.0]]),
        mask,
        base_low=0.2,
        base_high=0.28,
        token_low=0.2,
        token_high=0.6,
    )
    loss, metrics, clipped = ppo_clip_loss(
        new,
        old,
        torch.tensor([1.0], dtype=torch.float64),
        mask,
        clip_low=low,
        clip_high=high,
        agg=None,
    )
    torch.testing.assert_close(loss, torch.tensor([[-1.28, -1.5]], dtype=torch.float64))
    assert clipped.high.tolist() == [[True, False]] and metrics["clip/frac_high"] == 0.5
    assert metrics["clip/high_mean"] == pytest.approx(0.44)


def test_bounds_of_the_wrong_shape_are_refused():
    new, old, adv, mask, _ = batch(0, 3, 4)
    with pytest.raises(ValueError, match="clip_low as a tensor"):
        ppo_clip_loss(new, old, adv, mask, clip_low=torch.zeros(3, 2))


scores = st.lists(
    st.one_of(st.just(math.nan), st.just(0.0), st.just(1e-4), st.floats(0, 1.5, width=32)),
    min_size=0,
    max_size=20,
)


@SETTINGS
@given(
    scores,
    st.sampled_from(CLIP_RULES),
    st.sampled_from(DIRECTIONS),
    st.floats(0, 0.9),
    st.floats(0, 0.9),
    st.one_of(st.none(), st.floats(0, 0.9)),
)
def test_clip_low_rule_matches_reference(values, rule, direction, low, high, neutral):
    spec = ClipScheduleSpec(rule=rule, low=low, high=high, direction=direction, neutral=neutral)
    got = clip_low_bounds(torch.tensor(values, dtype=torch.float32), spec)
    for x, g in zip(values, got.tolist()):
        if math.isnan(x):
            want = low if neutral is None else neutral
        else:
            if rule == "step":
                s = 0.0 if np.float32(x) < np.float32(1e-4) else 1.0
            elif rule == "linear":
                s = min(max((x - 1e-4) / (1.0 - 1e-4), 0.0), 1.0)
            else:
                s = 1 / (1 + math.exp(-(x - 1e-4) / 0.05))
            a, b = (low, high) if direction == "hallucinated_high" else (high, low)
            want = a + (b - a) * s
        assert g == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_clip_low_rule_by_hand_and_in_the_loss():
    chair = torch.tensor([0.0, 0.5, float("nan")])
    low = clip_low_bounds(chair, ClipScheduleSpec(low=0.2, high=0.4))
    torch.testing.assert_close(low, torch.tensor([0.2, 0.4, 0.2]))
    # a hallucinating sample with A < 0 and ratio 0.7 is floored at 0.6, a clean one at 0.8
    new = torch.log(torch.full((3, 1), 0.7, dtype=torch.float64))
    loss, _, clipped = ppo_clip_loss(
        new,
        torch.zeros_like(new),
        torch.full((3,), -1.0, dtype=torch.float64),
        torch.ones(3, 1),
        clip_low=low,
        clip_high=0.28,
        agg=None,
    )
    torch.testing.assert_close(loss, torch.tensor([[0.8], [0.7], [0.8]], dtype=torch.float64))
    assert clipped.low.flatten().tolist() == [True, False, True]
    assert len(clip_low_bounds(None, ClipScheduleSpec(), batch_size=2)) == 2


def test_mask_from_positions_and_share():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]])
    hall, scored = hallucinated_token_mask([[1, 2], [], None], mask)
    torch.testing.assert_close(
        hall, torch.tensor([[0, 1, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]]).float()
    )
    assert scored.tolist() == [True, True, False]
    share, tokens = hallucinated_token_share(hall, mask, scored)
    assert (share, tokens) == (pytest.approx(2 / 5), 5)
    assert math.isnan(hallucinated_token_share(hall, torch.zeros_like(mask))[0])
    with pytest.raises(ValueError, match="outside its response"):
        hallucinated_token_mask([[3], [], None], mask)
    with pytest.raises(ValueError, match="rows"):
        hallucinated_token_mask([[0]], mask)
