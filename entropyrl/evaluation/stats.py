"""Percentile bootstrap over images, for one model and for the difference of two.

The unit that was sampled is the image, so images are what is resampled (with replacement),
never captions or mentions: the mentions of one caption are not independent. Each image carries
its raw values, not a finished per-image metric, because the metrics are mostly ratios of sums
(CHAIR_i = hallucinated mentions / mentions over all images) and a mean of per-image ratios is
another metric. A statistic maps the per-image values of a batch of resamples to one number per
resample:

    values[B, n]      -> statistic -> [B]   e.g. `mean` (CHAIR_s from 0/1 per image)
    values[B, n, k]   -> statistic -> [B]   e.g. `ratio_of_sums` (k = 2: numerator, denominator)

The index matrix `[resamples, n_images]` comes from `numpy.random.default_rng(seed)`, so a seed
fixes every interval; a paired difference applies the same matrix to both models.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "BootstrapInterval",
    "PairedDifference",
    "Statistic",
    "bootstrap_indices",
    "bootstrap_interval",
    "mean",
    "paired_difference",
    "per_image_values",
    "ratio_of_sums",
]

Statistic = Callable[[np.ndarray], np.ndarray]
# {image_id: value or (numerator, denominator, ...)} or rows [n, ...] (row i = image i)
PerImage = Mapping[Hashable, Any] | np.ndarray | Sequence[Any]
_CHUNK_ELEMENTS = 1 << 22  # gathered values per chunk of resamples (32 MiB of float64)


def mean(values: np.ndarray) -> np.ndarray:
    """Mean of one value per image: `[B, n] -> [B]`."""
    if values.ndim != 2:
        raise ValueError(f"mean takes one value per image ([B, n]), got shape {values.shape}")
    return values.mean(axis=1)


def ratio_of_sums(values: np.ndarray) -> np.ndarray:
    """Sum of numerators / sum of denominators: `[B, n, 2] -> [B]`; NaN where the latter is 0."""
    if values.ndim != 3 or values.shape[2] != 2:
        raise ValueError(
            f"ratio_of_sums takes (numerator, denominator) per image ([B, n, 2]), "
            f"got shape {values.shape}"
        )
    sums = values.sum(axis=1)
    numerator, denominator = sums[:, 0], sums[:, 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denominator != 0, numerator / denominator, np.nan)


@dataclass(frozen=True)
class BootstrapInterval:
    """Statistic on all images and its percentile interval at `level`."""

    estimate: float
    low: float
    high: float
    level: float
    resamples: int
    n_images: int


@dataclass(frozen=True)
class PairedDifference:
    """statistic(a) - statistic(b) on the same images, its percentile interval, and whether
    the interval leaves out 0 (the difference is clear at `level`)."""

    estimate: float
    low: float
    high: float
    level: float
    resamples: int
    n_images: int
    estimate_a: float
    estimate_b: float
    excludes_zero: bool


def per_image_values(per_image: PerImage) -> tuple[np.ndarray, list[Hashable] | None]:
    """`([n, ...] float64 array, image ids or None)`; a mapping is ordered by sorted image id,
    so the order it was filled in does not move the resamples."""
    keys: list[Hashable] | None = None
    if isinstance(per_image, Mapping):
        keys = sorted(per_image)  # type: ignore[type-var]
        rows = [per_image[key] for key in keys]
    else:
        rows = per_image
    try:
        values = np.asarray(rows, dtype=np.float64)
    except ValueError as error:
        raise ValueError(f"per-image values must all have the same shape ({error})") from None
    if values.ndim == 0 or values.shape[0] == 0:
        raise ValueError("no images to resample")
    return values, keys


def bootstrap_indices(n_images: int, resamples: int, seed: int) -> np.ndarray:
    """`[resamples, n_images]` int64 image indices drawn with replacement."""
    if n_images < 1:
        raise ValueError(f"n_images must be >= 1, got {n_images}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    return np.random.default_rng(seed).integers(0, n_images, size=(resamples, n_images))


def _apply(statistic: Statistic, values: np.ndarray, indices: np.ndarray | None) -> np.ndarray:
    """statistic over `values[indices]` (`[B, n, ...]`), in chunks of resamples; `[B]` floats."""
    if indices is None:
        batches = [values[None]]
    else:
        per_row = max(1, int(np.prod(values.shape)))
        step = max(1, _CHUNK_ELEMENTS // per_row)
        batches = (values[indices[i : i + step]] for i in range(0, len(indices), step))
    out = []
    for batch in batches:
        result = np.asarray(statistic(batch), dtype=np.float64)
        if result.shape != (batch.shape[0],):
            raise ValueError(
                f"statistic must return one value per resample: shape {(batch.shape[0],)}, "
                f"got {result.shape}"
            )
        out.append(result)
    return np.concatenate(out)


def _finite(stats: np.ndarray, what: str) -> np.ndarray:
    bad = int(np.sum(~np.isfinite(stats)))
    if bad:
        raise ValueError(
            f"the statistic is undefined (NaN or infinite) on {bad} of {len(stats)} {what} "
            "(a ratio over nothing?); leaving them out would bias the interval"
        )
    return stats


def _bounds(stats: np.ndarray, level: float) -> tuple[float, float]:
    alpha = 1.0 - level
    low, high = np.quantile(stats, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


def _check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")


def bootstrap_interval(
    per_image: PerImage,
    statistic: Statistic = mean,
    *,
    resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> BootstrapInterval:
    """Percentile bootstrap interval of `statistic`, resampling images with replacement.

    `per_image`: `{image_id: value or (numerator, denominator, ...)}` or an array `[n, ...]`.
    The estimate is the statistic on all images (not the mean of the resamples). A statistic
    undefined on the sample or on a resample is a ValueError.
    """
    _check_level(level)
    values, _ = per_image_values(per_image)
    indices = bootstrap_indices(values.shape[0], resamples, seed)
    estimate = _finite(_apply(statistic, values, None), "full sample")[0]
    low, high = _bounds(_finite(_apply(statistic, values, indices), "resamples"), level)
    return BootstrapInterval(float(estimate), low, high, level, resamples, values.shape[0])


def _paired_values(model_a: PerImage, model_b: PerImage) -> tuple[np.ndarray, np.ndarray]:
    a, keys_a = per_image_values(model_a)
    b, keys_b = per_image_values(model_b)
    if (keys_a is None) != (keys_b is None):
        raise ValueError("model_a and model_b must both be mappings or both be arrays")
    if keys_a is not None and keys_a != keys_b:
        only_a = sorted(set(keys_a) - set(keys_b))[:5]  # type: ignore[type-var]
        only_b = sorted(set(keys_b) - set(keys_a))[:5]  # type: ignore[type-var]
        raise ValueError(
            f"the models were scored on different images (only in a: {only_a}, "
            f"only in b: {only_b}, at most 5 shown)"
        )
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"model_a has {a.shape[0]} images, model_b {b.shape[0]}")
    return a, b


def paired_difference(
    model_a: PerImage,
    model_b: PerImage,
    statistic: Statistic = mean,
    *,
    resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> PairedDifference:
    """Interval of statistic(a) - statistic(b), both on the same resampled images.

    Pairing keeps the between-image variation both models share (an image hard for one is
    mostly hard for the other) out of the difference, so the interval is usually much narrower
    than two separate intervals would suggest.
    Mappings must cover the same image ids; arrays must be row-aligned (row i = same image).
    """
    _check_level(level)
    a, b = _paired_values(model_a, model_b)
    indices = bootstrap_indices(a.shape[0], resamples, seed)
    estimate_a = float(_finite(_apply(statistic, a, None), "full sample of model_a")[0])
    estimate_b = float(_finite(_apply(statistic, b, None), "full sample of model_b")[0])
    stats_a = _finite(_apply(statistic, a, indices), "resamples of model_a")
    stats_b = _finite(_apply(statistic, b, indices), "resamples of model_b")
    low, high = _bounds(stats_a - stats_b, level)
    return PairedDifference(
        estimate=estimate_a - estimate_b,
        low=low,
        high=high,
        level=level,
        resamples=resamples,
        n_images=a.shape[0],
        estimate_a=estimate_a,
        estimate_b=estimate_b,
        excludes_zero=low > 0.0 or high < 0.0,
    )
