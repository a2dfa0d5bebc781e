"""Bootstrap over images: intervals, ratio-of-sums statistics, paired differences, determinism."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entropyrl.evaluation import stats
from entropyrl.evaluation.stats import (
    bootstrap_indices,
    bootstrap_interval,
    mean,
    paired_difference,
    per_image_values,
    ratio_of_sums,
)


def chair_like(n: int, rate: float, seed: int) -> dict[int, tuple[int, int]]:
    """{image_id: (hallucinated mentions, mentions)} with about `rate` of mentions wrong."""
    rng = np.random.default_rng(seed)
    mentions = rng.integers(1, 9, size=n)
    wrong = rng.binomial(mentions, rate)
    return {1000 + i: (int(w), int(m)) for i, (w, m) in enumerate(zip(wrong, mentions))}


def test_indices_shape_and_range():
    idx = bootstrap_indices(7, 50, seed=1)
    assert idx.shape == (50, 7) and idx.min() >= 0 and idx.max() <= 6
    assert np.array_equal(idx, bootstrap_indices(7, 50, seed=1))
    with pytest.raises(ValueError):
        bootstrap_indices(0, 10, 0)
    with pytest.raises(ValueError):
        bootstrap_indices(3, 0, 0)


def test_interval_contains_the_estimate():
    values = np.random.default_rng(0).binomial(1, 0.3, size=400).astype(float)
    result = bootstrap_interval(values, mean, resamples=2000, seed=0)
    assert result.estimate == values.mean()
    assert result.low < result.estimate < result.high
    assert (result.resamples, result.n_images, result.level) == (2000, 400, 0.95)


def test_interval_shrinks_with_more_images():
    small = bootstrap_interval(chair_like(50, 0.2, seed=1), ratio_of_sums, seed=0)
    large = bootstrap_interval(chair_like(2000, 0.2, seed=1), ratio_of_sums, seed=0)
    assert (large.high - large.low) < (small.high - small.low) / 3  # ~ sqrt(40) = 6.3


def test_ratio_of_sums_is_the_direct_computation_not_a_mean_of_ratios():
    per_image = chair_like(300, 0.15, seed=2)
    result = bootstrap_interval(per_image, ratio_of_sums, resamples=500)
    wrong = sum(w for w, _ in per_image.values())
    total = sum(m for _, m in per_image.values())
    assert result.estimate == wrong / total
    mean_of_ratios = np.mean([w / m for w, m in per_image.values()])
    assert result.estimate != mean_of_ratios
    assert result.low <= result.estimate <= result.high


def test_resamples_match_a_plain_loop():
    per_image = chair_like(40, 0.3, seed=3)
    values, keys = per_image_values(per_image)
    assert values.shape == (40, 2)
    assert keys == sorted(per_image)
    idx = bootstrap_indices(len(keys), 300, seed=9)
    by_loop = []
    for row in idx:
        ids = [keys[i] for i in row]
        by_loop.append(sum(per_image[k][0] for k in ids) / sum(per_image[k][1] for k in ids))
    result = bootstrap_interval(per_image, ratio_of_sums, resamples=300, seed=9)
    low, high = np.quantile(by_loop, [0.025, 0.975])
    assert result.low == pytest.approx(low) and result.high == pytest.approx(high)


def test_chunked_resampling_gives_the_same_interval(monkeypatch):
    per_image = chair_like(64, 0.25, seed=4)
    whole = bootstrap_interval(per_image, ratio_of_sums, resamples=257, seed=2)
    monkeypatch.setattr(stats, "_CHUNK_ELEMENTS", 300)  # a few resamples per chunk
    assert bootstrap_interval(per_image, ratio_of_sums, resamples=257, seed=2) == whole


def test_seed_determinism_and_fill_order():
    per_image = chair_like(100, 0.2, seed=5)
    first = bootstrap_interval(per_image, ratio_of_sums, seed=7)
    assert bootstrap_interval(per_image, ratio_of_sums, seed=7) == first
    reversed_fill = dict(reversed(list(per_image.items())))
    assert bootstrap_interval(reversed_fill, ratio_of_sums, seed=7) == first
    other = bootstrap_interval(per_image, ratio_of_sums, seed=8)
    assert (other.low, other.high) != (first.low, first.high)
    assert other.estimate == first.estimate


def test_paired_difference_of_identical_models_is_exactly_zero():
    per_image = chair_like(120, 0.2, seed=6)
    result = paired_difference(per_image, dict(per_image), ratio_of_sums)
    assert (result.estimate, result.low, result.high) == (0.0, 0.0, 0.0)
    assert result.excludes_zero is False


def test_paired_difference_clear_case_excludes_zero():
    base = chair_like(200, 0.10, seed=7)
    worse = chair_like(200, 0.30, seed=8)
    result = paired_difference(worse, base, ratio_of_sums, seed=0)
    assert result.excludes_zero and result.low > 0
    assert result.estimate == pytest.approx(result.estimate_a - result.estimate_b)
    assert result.low < result.estimate < result.high
    flipped = paired_difference(base, worse, ratio_of_sums, seed=0)
    assert flipped.excludes_zero and flipped.high < 0
    assert flipped.low == pytest.approx(-result.high) and flipped.high == pytest.approx(-result.low)


def test_paired_difference_uses_the_same_images_for_both():
    # b is a plus a constant on every image: paired, every resample differs by that constant
    a = np.random.default_rng(1).random(150)
    result = paired_difference(a + 0.5, a, mean, seed=3)
    assert result.low == pytest.approx(0.5) and result.high == pytest.approx(0.5)
    assert result.excludes_zero


def test_paired_difference_of_noise_includes_zero():
    rng = np.random.default_rng(2)
    a, b = rng.binomial(1, 0.4, 300), rng.binomial(1, 0.4, 300)
    result = paired_difference(a, b, mean, seed=1)
    assert result.low < 0 < result.high or not result.excludes_zero


def test_errors():
    with pytest.raises(ValueError, match="no images"):
        bootstrap_interval([], mean)
    with pytest.raises(ValueError, match="undefined"):
        bootstrap_interval({1: (0, 0), 2: (0, 0)}, ratio_of_sums)
    with pytest.raises(ValueError, match="undefined"):
        # defined on the sample, not on the resamples made of image 1 only
        bootstrap_interval({1: (0, 0), 2: (1, 2)}, ratio_of_sums, resamples=200)
    with pytest.raises(ValueError, match="level"):
        bootstrap_interval([1.0, 2.0], mean, level=1.0)
    with pytest.raises(ValueError, match="one value per resample"):
        bootstrap_interval([[1.0, 2.0], [3.0, 4.0]], lambda v: v.sum(axis=1))
    with pytest.raises(ValueError, match="ratio_of_sums takes"):
        bootstrap_interval([1.0, 2.0], ratio_of_sums)
    with pytest.raises(ValueError, match="mean takes"):
        bootstrap_interval([[1.0, 2.0]], mean)
    with pytest.raises(ValueError, match="different images"):
        paired_difference({1: 0.5, 2: 0.1}, {1: 0.5, 3: 0.1})
    with pytest.raises(ValueError, match="model_a has 2 images"):
        paired_difference([0.5, 0.1], [0.5])
    with pytest.raises(ValueError, match="same shape"):
        bootstrap_interval({1: (1, 2), 2: (1,)}, ratio_of_sums)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 8)).map(lambda t: (min(t), t[1])),
        min_size=1,
        max_size=60,
    ),
    st.integers(0, 2**32 - 1),
)
def test_interval_properties(rows, seed):
    result = bootstrap_interval(rows, ratio_of_sums, resamples=200, seed=seed)
    direct = sum(w for w, _ in rows) / sum(m for _, m in rows)
    assert result.estimate == pytest.approx(direct)
    assert 0.0 <= result.low <= result.high <= 1.0
    assert bootstrap_interval(rows, ratio_of_sums, resamples=200, seed=seed) == result
