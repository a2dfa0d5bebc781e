"""Hallucination score -> per-sample clip_high."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from entropyrl.core.clip_schedules import CLIP_RULES, DIRECTIONS, clip_high_bounds
from entropyrl.core.specs import ClipScheduleSpec, SpecError

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True)

scores = st.lists(
    st.one_of(st.just(math.nan), st.just(0.0), st.just(1e-4), st.floats(0, 1.5, width=32)),
    min_size=0,
    max_size=20,
)


def ref(x, rule, low, high, threshold, direction, neutral, saturation, temperature):
    if math.isnan(x):
        return neutral
    if rule == "step":
        # Scores are compared in float32: a stored 1e-4 is at the threshold, not below it.
        share = 0.0 if np.float32(x) < np.float32(threshold) else 1.0
    elif rule == "linear":
        share = min(max((x - threshold) / (saturation - threshold), 0.0), 1.0)
    else:
        share = 1 / (1 + math.exp(-(x - threshold) / temperature))
    if direction == "hallucinated_low":
        low, high = high, low
    return low + (high - low) * share


@SETTINGS
@given(
    scores,
    st.sampled_from(CLIP_RULES),
    st.sampled_from(DIRECTIONS),
    st.floats(0, 1),
    st.floats(0, 1),
    st.one_of(st.none(), st.floats(0, 1)),
)
def test_matches_reference(values, rule, direction, low, high, neutral):
    x = torch.tensor(values, dtype=torch.float32)
    spec = ClipScheduleSpec(rule=rule, low=low, high=high, direction=direction, neutral=neutral)
    got = clip_high_bounds(x, spec)
    assert got.dtype == torch.float32 and got.shape == x.shape
    n = low if neutral is None else neutral
    for v, g in zip(x.tolist(), got.tolist()):
        want = ref(v, rule, low, high, 1e-4, direction, n, 1.0, 0.05)
        assert g == pytest.approx(want, rel=1e-5, abs=1e-6)
    lo, hi = min(low, high), max(low, high)
    finite = ~torch.isnan(x)
    assert ((got[finite] >= lo - 1e-6) & (got[finite] <= hi + 1e-6)).all()


def test_entropyrl_step_rule_and_direction():
    chair = torch.tensor([0.0, 5e-5, 1e-4, 0.2, float("nan")])
    got = clip_high_bounds(chair, ClipScheduleSpec())
    torch.testing.assert_close(got, torch.tensor([0.3, 0.3, 0.5, 0.5, 0.3]))
    flipped = clip_high_bounds(chair, ClipScheduleSpec(direction="hallucinated_low", neutral=0.4))
    torch.testing.assert_close(flipped, torch.tensor([0.5, 0.5, 0.3, 0.3, 0.4]))


def test_linear_and_sigmoid_are_monotone_in_the_score():
    x = torch.linspace(0, 1.2, 50)
    for rule in ("linear", "sigmoid"):
        up = clip_high_bounds(x, ClipScheduleSpec(rule=rule))
        down = clip_high_bounds(x, ClipScheduleSpec(rule=rule, direction="hallucinated_low"))
        assert (up.diff() >= 0).all() and (down.diff() <= 0).all()
    lin = clip_high_bounds(
        torch.tensor([0.0, 0.1, 0.3, 0.5, 2.0]),
        ClipScheduleSpec(rule="linear", threshold=0.1, saturation=0.5),
    )
    torch.testing.assert_close(lin, torch.tensor([0.3, 0.3, 0.4, 0.5, 0.5]))
    sig = clip_high_bounds(torch.tensor([0.2]), ClipScheduleSpec(rule="sigmoid", threshold=0.2))
    torch.testing.assert_close(sig, torch.tensor([0.4]))


def test_missing_scores_get_the_neutral_bound():
    spec = ClipScheduleSpec(low=0.1, high=0.9, neutral=0.4)
    torch.testing.assert_close(clip_high_bounds(None, spec, batch_size=3), torch.full((3,), 0.4))
    torch.testing.assert_close(
        clip_high_bounds(torch.tensor([float("nan"), 0.5]), spec, batch_size=2),
        torch.tensor([0.4, 0.9]),
    )
    assert clip_high_bounds(None, ClipScheduleSpec(), batch_size=2).tolist() == pytest.approx(
        [0.3, 0.3]
    )


def test_spec_checks_the_settings_once_and_the_function_checks_the_scores():
    # The settings are the spec's to refuse, at construction, naming the field.
    with pytest.raises(SpecError, match="step"):
        ClipScheduleSpec(rule="cosine")
    with pytest.raises(SpecError, match="hallucinated_high"):
        ClipScheduleSpec(direction="up")
    with pytest.raises(SpecError, match="low"):
        ClipScheduleSpec(low=-0.1)
    with pytest.raises(SpecError, match="high"):
        ClipScheduleSpec(high=float("nan"))
    with pytest.raises(SpecError, match="neutral"):
        ClipScheduleSpec(neutral=-1.0)
    with pytest.raises(SpecError, match="saturation"):
        ClipScheduleSpec(rule="linear", saturation=1e-5)
    with pytest.raises(SpecError, match="temperature"):
        ClipScheduleSpec(rule="sigmoid", temperature=0.0)
    # The scores are the function's.
    spec = ClipScheduleSpec()
    with pytest.raises(ValueError, match="chair_i"):
        clip_high_bounds(torch.tensor([-0.5]), spec)
    with pytest.raises(ValueError, match="1-D"):
        clip_high_bounds(torch.zeros(2, 2), spec)
    with pytest.raises(ValueError, match="rows"):
        clip_high_bounds(torch.zeros(3), spec, batch_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        clip_high_bounds(None, spec)
