"""Bootstrap over images: intervals, ratio-of-sums statistics, paired differences, determinism;
and the intervals against outside references: scipy.stats.bootstrap's percentile method, the
closed form of a mean's bootstrap distribution, and coverage on known distributions."""

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


# --- against outside references: scipy's bootstrap, a closed form, coverage --------------------

# Monte Carlo error of a percentile bound. The p-quantile of B draws from a distribution with
# density f at that quantile has standard deviation sqrt(p (1 - p) / B) / f (the asymptotic
# variance of a sample quantile). For a bootstrap distribution close to normal with standard
# deviation SE, f = phi(z_p) / SE, so at p = 0.025 the bound moves by
# sqrt(0.025 * 0.975) / phi(1.96) * SE / sqrt(B) = 2.67 SE / sqrt(B) between seeds.
QUANTILE_NOISE = np.sqrt(0.025 * 0.975) / (np.exp(-(1.96**2) / 2) / np.sqrt(2 * np.pi))
REFERENCE_RESAMPLES = 20_000


def bound_tolerance(standard_error: float, resamples: int, reference_resamples: int) -> float:
    """Five standard deviations of the difference of two independent Monte Carlo estimates of
    one percentile bound (`QUANTILE_NOISE`): a real error of the interval (a level of 0.90
    instead of 0.95 moves each bound by 0.31 SE) is far outside it at these resample counts."""
    spread = QUANTILE_NOISE * standard_error * np.sqrt(1 / resamples + 1 / reference_resamples)
    return float(5 * spread)


def scipy_percentile(data: tuple[np.ndarray, ...], statistic, *, seed: int):
    """scipy.stats.bootstrap's percentile interval (rows resampled together: `paired=True`)."""
    from scipy.stats import bootstrap

    return bootstrap(
        data,
        statistic,
        paired=len(data) > 1,
        vectorized=True,
        n_resamples=REFERENCE_RESAMPLES,
        method="percentile",
        confidence_level=0.95,
        rng=np.random.default_rng(seed),
    )


def assert_same_interval(ours, reference, resamples: int) -> None:
    tolerance = bound_tolerance(reference.standard_error, resamples, REFERENCE_RESAMPLES)
    assert ours.low == pytest.approx(reference.confidence_interval.low, abs=tolerance)
    assert ours.high == pytest.approx(reference.confidence_interval.high, abs=tolerance)


def test_mean_interval_equals_scipys_percentile_bootstrap():
    values = np.random.default_rng(10).exponential(size=200)  # skewed: not a symmetric case
    ours = bootstrap_interval(values, mean, resamples=REFERENCE_RESAMPLES, seed=1)
    reference = scipy_percentile((values,), lambda v, axis: v.mean(axis=axis), seed=2)
    assert ours.estimate == pytest.approx(values.mean())
    assert_same_interval(ours, reference, REFERENCE_RESAMPLES)


def test_ratio_of_sums_interval_equals_scipys_paired_bootstrap():
    # CHAIR_i: an image's (hallucinated, mentions) stay together, as scipy's paired resampling
    per_image = chair_like(300, 0.2, seed=11)
    wrong, mentions = (np.array(column) for column in zip(*per_image.values()))
    ours = bootstrap_interval(per_image, ratio_of_sums, resamples=REFERENCE_RESAMPLES, seed=1)
    reference = scipy_percentile(
        (wrong, mentions), lambda w, m, axis: w.sum(axis=axis) / m.sum(axis=axis), seed=2
    )
    assert_same_interval(ours, reference, REFERENCE_RESAMPLES)


def test_paired_difference_equals_scipys_paired_bootstrap():
    rng = np.random.default_rng(12)
    base = rng.binomial(1, 0.5, size=250).astype(float)
    # the other model agrees with the base on most images: pairing matters for the width
    other = np.where(rng.random(250) < 0.8, base, rng.binomial(1, 0.3, size=250))
    ours = paired_difference(other, base, mean, resamples=REFERENCE_RESAMPLES, seed=1)
    reference = scipy_percentile(
        (other, base), lambda a, b, axis: a.mean(axis=axis) - b.mean(axis=axis), seed=2
    )
    assert_same_interval(ours, reference, REFERENCE_RESAMPLES)
    unpaired = np.hypot(other.std() / np.sqrt(250), base.std() / np.sqrt(250))
    assert reference.standard_error < 0.8 * unpaired  # the case tells paired from unpaired


def test_two_images_give_the_exact_bootstrap_distribution():
    # the mean of two resampled values 0 and 1 is 0 (p 1/4), 1/2 (p 1/2) or 1 (p 1/4): the
    # 2.5 % and 97.5 % points are 0 and 1 exactly
    result = bootstrap_interval([0.0, 1.0], mean, resamples=4000, seed=3)
    assert (result.estimate, result.low, result.high) == (0.5, 0.0, 1.0)


def test_mean_interval_approaches_the_normal_closed_form():
    # The bootstrap distribution of a mean of n values has the plug-in variance / n
    # (sd = values.std(ddof=0) / sqrt(n)) and, for large n, is close to normal, so the
    # percentile interval approaches mean -+ 1.96 sd.
    values = np.random.default_rng(13).normal(3.0, 2.0, size=2000)
    result = bootstrap_interval(values, mean, resamples=REFERENCE_RESAMPLES, seed=4)
    sd = values.std() / np.sqrt(len(values))
    tolerance = bound_tolerance(sd, REFERENCE_RESAMPLES, REFERENCE_RESAMPLES)
    assert result.low == pytest.approx(values.mean() - 1.96 * sd, abs=tolerance)
    assert result.high == pytest.approx(values.mean() + 1.96 * sd, abs=tolerance)


def coverage(trials: int, seed: int, draw, truth: float, statistic) -> float:
    """Share of `trials` 95 % intervals (the evaluation's 1,000 resamples) covering `truth`,
    each over a fresh sample `draw(rng)`."""
    rng = np.random.default_rng(seed)
    covered = 0
    for trial in range(trials):
        found = bootstrap_interval(draw(rng), statistic, resamples=1000, seed=trial)
        covered += found.low <= truth <= found.high
    return covered / trials


# Three binomial standard deviations of a covered share at 0.95 over TRIALS intervals (0.021).
# The percentile interval of a mean of n normal values is about mean -+ 1.96 sqrt((n-1)/n) s /
# sqrt(n), which covers with probability P(|t_(n-1)| <= 1.96 sqrt((n-1)/n)) = 0.946 at n = 100:
# a bias far inside the tolerance, while an interval of the wrong level (0.90: coverage 0.90)
# or one that resampled the wrong unit is far outside it.
TRIALS = 1000
COVERAGE_TOLERANCE = 3 * np.sqrt(0.95 * 0.05 / TRIALS)


def test_mean_intervals_cover_the_true_mean_95_percent_of_the_time():
    rate = coverage(TRIALS, 20, lambda rng: rng.normal(1.0, 1.0, size=100), 1.0, mean)
    assert rate == pytest.approx(0.95, abs=COVERAGE_TOLERANCE)


def test_chair_i_intervals_cover_the_true_rate_95_percent_of_the_time():
    # 100 images, 1-8 mentions each, each mention hallucinated with probability 0.2: the ratio
    # of sums estimates 0.2 without bias
    def draw(rng: np.random.Generator) -> np.ndarray:
        mentions = rng.integers(1, 9, size=100)
        return np.stack([rng.binomial(mentions, 0.2), mentions], axis=1)

    rate = coverage(TRIALS, 21, draw, 0.2, ratio_of_sums)
    assert rate == pytest.approx(0.95, abs=COVERAGE_TOLERANCE)
