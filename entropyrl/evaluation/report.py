"""From per-image values to the comparison: intervals, paired differences, table, figure.

`summarise` turns `{model: {metric: {image_id: value}}}` of one protocol into, per model, every
metric's estimate with its 95 % bootstrap interval over images and, for every model but the base,
its paired difference from the base on the same resampled images. `markdown_table` writes what a
paper's table holds, marking a difference whose interval leaves out 0; `draw_figure` puts the
models side by side with their intervals.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from entropyrl.evaluation.stats import bootstrap_interval, paired_difference

__all__ = ["draw_figure", "markdown_table", "summarise"]

Statistic = Callable[[np.ndarray], np.ndarray]


def _interval(values: Mapping[int, Any], statistic: Statistic, **bootstrap: Any) -> dict[str, Any]:
    try:
        found = bootstrap_interval(values, statistic, **bootstrap)
    except ValueError as error:  # e.g. CHAIR_i of captions that mention nothing
        return {"estimate": None, "low": None, "high": None, "note": str(error)}
    return {"estimate": found.estimate, "low": found.low, "high": found.high}


def _difference(
    values: Mapping[int, Any], base: Mapping[int, Any], statistic: Statistic, **bootstrap: Any
) -> dict[str, Any]:
    try:
        found = paired_difference(values, base, statistic, **bootstrap)
    except ValueError as error:
        return {
            "estimate": None,
            "low": None,
            "high": None,
            "excludes_zero": None,
            "note": str(error),
        }
    return {
        "estimate": found.estimate,
        "low": found.low,
        "high": found.high,
        "excludes_zero": found.excludes_zero,
    }


def summarise(
    per_model: Mapping[str, Mapping[str, Mapping[int, Any]]],
    statistics: Mapping[str, Statistic],
    *,
    base: str | None,
    resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, Any]:
    """`{model: {"metrics": {metric: interval}, "vs_base": {metric: difference}}}`.

    Intervals and differences use the same resample indices (one `seed`) for every model and
    metric, so differences are paired. A metric undefined on the sample (a ratio over nothing)
    gets None values and a note, not an error.
    """
    bootstrap = {"resamples": resamples, "seed": seed, "level": level}
    out: dict[str, Any] = {}
    for model, values in per_model.items():
        entry: dict[str, Any] = {
            "metrics": {
                name: _interval(values[name], statistic, **bootstrap)
                for name, statistic in statistics.items()
            }
        }
        if base is not None and model != base:
            entry["vs_base"] = {
                name: _difference(values[name], per_model[base][name], statistic, **bootstrap)
                for name, statistic in statistics.items()
            }
        out[model] = entry
    return out


def _number(value: float | None, scale: float, digits: int) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value * scale:.{digits}f}"


def _signed(value: float | None, scale: float, digits: int) -> str:
    text = _number(value, scale, digits)
    return text if text == "–" or text.startswith("-") else f"+{text}"


def markdown_table(
    title: str,
    summary: Mapping[str, Any],
    columns: Sequence[tuple[str, str, float, bool | None]],
    *,
    base: str | None,
    digits: int = 1,
    note: str = "",
) -> str:
    """One protocol's table: a row per model, a cell per metric `estimate [low, high]`, and
    under it the difference from the base `Δ estimate [low, high]`, bold with `*` when the
    interval leaves out 0. `columns`: `(metric, header, scale, lower_is_better or None)`."""
    arrows = {True: " ↓", False: " ↑", None: ""}
    header = ["model"] + [f"{label}{arrows[lower]}" for _, label, _, lower in columns]
    lines = [f"### {title}", ""]
    if note:
        lines += [note, ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for model, entry in summary.items():
        cells = [model]
        for name, _, scale, _ in columns:
            metric = entry["metrics"][name]
            cell = (
                f"{_number(metric['estimate'], scale, digits)} "
                f"[{_number(metric['low'], scale, digits)}, {_number(metric['high'], scale, digits)}]"
            )
            difference = entry.get("vs_base", {}).get(name)
            if difference is not None:
                delta = (
                    f"Δ {_signed(difference['estimate'], scale, digits)} "
                    f"[{_signed(difference['low'], scale, digits)}, "
                    f"{_signed(difference['high'], scale, digits)}]"
                )
                cell += (
                    f"<br>**{delta}** \\*" if difference.get("excludes_zero") else f"<br>{delta}"
                )
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    if base is not None and len(summary) > 1:
        lines += [
            "",
            f"Estimates with 95 % bootstrap intervals over images; Δ: paired difference from "
            f"{base} on the same images, **bold \\*** where its interval leaves out 0.",
        ]
    return "\n".join(lines) + "\n"


def draw_figure(
    panels: Sequence[tuple[str, Mapping[str, Any], str, float]],
    path: str | Path,
) -> None:
    """One panel per `(title, summary, metric, scale)`: a bar per model with its interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(4, len(panels))
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(3.4 * columns, 2.8 * rows), squeeze=False)
    for axis in axes.flat[len(panels) :]:
        axis.set_visible(False)
    for axis, (title, summary, metric, scale) in zip(axes.flat, panels):
        models = list(summary)
        estimates, lows, highs = [], [], []
        for model in models:
            entry = summary[model]["metrics"][metric]
            estimate = entry["estimate"]
            estimates.append(np.nan if estimate is None else estimate * scale)
            lows.append(np.nan if entry["low"] is None else entry["low"] * scale)
            highs.append(np.nan if entry["high"] is None else entry["high"] * scale)
        values = np.asarray(estimates)
        errors = np.abs(np.vstack([values - np.asarray(lows), np.asarray(highs) - values]))
        axis.bar(range(len(models)), values, yerr=errors, capsize=3, color="#4c72b0")
        axis.set_xticks(range(len(models)), models, rotation=30, ha="right", fontsize=8)
        axis.set_title(title, fontsize=9)
    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
