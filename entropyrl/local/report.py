"""Outputs of a local run: the curves figure and the summary table (markdown + JSON)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["markdown_table", "plot_curves", "write_summary"]

CURVES = (
    ("reward", "reward"),
    ("cider", "CIDEr-D (train)"),
    ("chair_i", "CHAIR_i per caption"),
    ("entropy", "token entropy"),
    ("clip_high", "eps_high (mean)"),
    ("response_length", "response tokens"),
)


def _smooth(values: Sequence[float], window: int = 5) -> list[float]:
    out = []
    for i in range(len(values)):
        chunk = [v for v in values[max(0, i - window + 1) : i + 1] if math.isfinite(v)]
        out.append(sum(chunk) / len(chunk) if chunk else math.nan)
    return out


def plot_curves(
    records: Sequence[dict[str, Any]], path: str | Path, *, title: str = "", curves=CURVES
) -> Path:
    """One panel per metric, one line per RL variant (5-step moving average) -> PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rl = [r for r in records if r.get("phase") == "rl"]
    variants = list(dict.fromkeys(r.get("variant", "") for r in rl))
    present = [(key, label) for key, label in curves if any(key in r for r in rl)]
    cols = 3
    rows = max(1, math.ceil(len(present) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, (key, label) in zip(axes.flat, present):
        for variant in variants:
            points = [(r["step"], r[key]) for r in rl if r.get("variant") == variant and key in r]
            if points:
                steps, values = zip(*points)
                ax.plot(steps, _smooth(values), label=variant)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(present) :]:
        ax.axis("off")
    if variants:
        axes.flat[0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"  # nothing measured (e.g. no caption scored), which 0.00 would hide
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _json_safe(value: Any) -> Any:
    """NaN and infinities as null: summary.json stays valid JSON, and n/a reads as n/a."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """`columns` = (key, header); floats with 2 decimals, n/a for NaN or None."""
    head = "| " + " | ".join(h for _, h in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(_fmt(row.get(k, "")) for k, _ in columns) + " |" for row in rows]
    return "\n".join([head, rule, *body])


def write_summary(
    out: str | Path, summary: dict[str, Any], table: str, *, heading: str = "Summary"
) -> tuple[Path, Path]:
    """`summary.json` (everything; NaN as null) and `summary.md` (the table plus settings)."""
    out = Path(out)
    json_path = out / "summary.json"
    json_path.write_text(
        json.dumps(_json_safe(summary), indent=2, allow_nan=False), encoding="utf-8"
    )
    md_path = out / "summary.md"
    settings = summary.get("settings", {})
    lines = [f"# {heading}", "", table, ""]
    if settings:
        lines += ["Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()), ""]
    md_path.write_text("\n".join(lines), encoding="utf-8")
    return json_path, md_path
