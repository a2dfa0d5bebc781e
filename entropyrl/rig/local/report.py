"""Outputs of a local run: the curves figure and the summary table (markdown + JSON)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from entropyrl.core.files import atomic_path, write_json

__all__ = [
    "CAPTION_HELD_OUT",
    "CURVES",
    "EVAL_COLUMNS",
    "SMOOTHING",
    "Curve",
    "HeldOut",
    "curves_figure",
    "eval_columns",
    "eval_row",
    "markdown_table",
    "plot_curves",
    "write_summary",
]

SMOOTHING = 5  # steps in the moving average of every training curve


@dataclass(frozen=True)
class Curve:
    """One panel: a line per variant for each of `keys` (line styles `-`, `--`, ... in that
    order), values times `scale`, a title and a y-axis label with the unit."""

    keys: tuple[str, ...]
    title: str
    ylabel: str
    scale: float = 1.0


@dataclass(frozen=True)
class HeldOut:
    """A held-out metric of the `eval` records: drawn as markers on the panel whose first key
    is `key` (after warm-up at its step 0, after RL at the last step) and in the table box."""

    key: str
    label: str
    scale: float = 1.0
    unit: str = ""


CURVES = (
    Curve(("reward",), "reward (train samples)", "reward"),
    Curve(("cider",), "CIDEr-D (train samples)", "CIDEr-D"),
    Curve(("chair_i",), "CHAIR_i (train samples)", "CHAIR_i (%)", 100.0),
    Curve(("entropy",), "token entropy (sampling temperature)", "entropy (nats per token)"),
    Curve(
        ("clip_frac_high", "clip_frac_low"),
        "tokens clipped: high (solid), low (dashed)",
        "clipped tokens (%)",
        100.0,
    ),
    Curve(("clip_high",), "per-sample clip_high (batch mean)", "clip_high"),
    Curve(("response_length",), "response length", "tokens"),
)
CAPTION_HELD_OUT = (
    HeldOut("chair_i", "CHAIR_i", 100.0, " %"),
    HeldOut("cider", "CIDEr-D"),
)
_STYLES = ("-", "--", ":", "-.")


def _smooth(values: Sequence[float], window: int = SMOOTHING) -> list[float]:
    out = []
    for i in range(len(values)):
        chunk = [v for v in values[max(0, i - window + 1) : i + 1] if math.isfinite(v)]
        out.append(sum(chunk) / len(chunk) if chunk else math.nan)
    return out


def _as_curve(curve: Curve | tuple[str, str]) -> Curve:
    if isinstance(curve, Curve):
        return curve
    key, label = curve
    return Curve((key,), label, label)


def _held_out_points(
    records: Sequence[dict[str, Any]], variants: Sequence[str]
) -> list[tuple[str, dict[str, Any]]]:
    """`(stage, eval record)`: after warm-up, then after each RL variant (other eval records,
    e.g. the acceptance study's per-seed ones, are not this figure's)."""
    points = []
    for record in records:
        if record.get("phase") != "eval":
            continue
        variant = record.get("variant")
        if variant == "warm-up":
            points.append(("after warm-up", record))
        elif variant in variants:
            points.append((f"after RL: {variant}", record))
    return points


def _held_out_text(points, held_out: Sequence[HeldOut]) -> str:
    head = ["held-out (greedy)", *(h.label for h in held_out)]
    rows = [head]
    for stage, record in points:
        cells = [stage]
        for h in held_out:
            value = record.get(h.key)
            if isinstance(value, int | float) and math.isfinite(value):
                cells.append(f"{h.scale * value:.2f}{h.unit}")
            else:
                cells.append("n/a")
        rows.append(cells)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def curves_figure(
    records: Sequence[dict[str, Any]],
    *,
    title: str = "",
    curves: Sequence[Curve | tuple[str, str]] = CURVES,
    held_out: Sequence[HeldOut] = CAPTION_HELD_OUT,
) -> Any:
    """The figure of `plot_curves` (a matplotlib Figure; the caller closes it).

    One panel per curve present in the RL records, one colour per variant, every line a
    `SMOOTHING`-step moving average (said in the title). Held-out values of the `eval` records
    are markers on their panels and a table in a text box.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rl = [r for r in records if r.get("phase") == "rl"]
    variants = list(dict.fromkeys(r.get("variant", "") for r in rl))
    colours = {variant: f"C{i}" for i, variant in enumerate(variants)}
    present = [c for c in map(_as_curve, curves) if any(key in r for key in c.keys for r in rl)]
    points = _held_out_points(records, variants)
    box = bool(points and held_out)
    cols = 3
    rows = max(1, math.ceil((len(present) + box) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.4 * cols, 3.2 * rows), squeeze=False)
    marked = {h.key: h for h in held_out}
    for ax, curve in zip(axes.flat, present):
        for variant in variants:
            for key, style in zip(curve.keys, _STYLES):
                series = [
                    (r["step"], curve.scale * r[key])
                    for r in rl
                    if r.get("variant") == variant and key in r
                ]
                if series:
                    steps, values = zip(*series)
                    label = variant if key == curve.keys[0] else f"{variant} ({key})"
                    ax.plot(steps, _smooth(values), style, color=colours[variant], label=label)
        mark = marked.get(curve.keys[0])
        if mark is not None:
            for stage, record in points:
                value = record.get(mark.key)
                if not isinstance(value, int | float) or not math.isfinite(value):
                    continue
                warm = stage == "after warm-up"
                ax.plot(
                    [record["step"]],
                    [curve.scale * value],
                    "D" if warm else "*",
                    color="black" if warm else colours[record["variant"]],
                    markersize=7 if warm else 11,
                    label=f"held-out {stage}",
                    linestyle="none",
                )
            ax.legend(fontsize=7)
        ax.set_title(curve.title, fontsize=10)
        ax.set_xlabel("RL step")
        ax.set_ylabel(curve.ylabel)
        ax.grid(alpha=0.3)
    spare = list(axes.flat)[len(present) :]
    for ax in spare:
        ax.axis("off")
    if box:
        spare[0].text(
            0.0,
            1.0,
            _held_out_text(points, held_out),
            transform=spare[0].transAxes,
            va="top",
            ha="left",
            family="monospace",
            fontsize=8,
            bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "0.6"},
        )
    if variants and present and marked.get(present[0].keys[0]) is None:
        axes.flat[0].legend(fontsize=8)
    smoothing = f"training curves: {SMOOTHING}-step moving average"
    if box:
        smoothing += "; markers: held-out (greedy) after warm-up (diamond) and after RL (star)"
    fig.suptitle(f"{title}\n{smoothing}" if title else smoothing, fontsize=10)
    fig.tight_layout()
    return fig


def plot_curves(
    records: Sequence[dict[str, Any]],
    path: str | Path,
    *,
    title: str = "",
    curves: Sequence[Curve | tuple[str, str]] = CURVES,
    held_out: Sequence[HeldOut] = CAPTION_HELD_OUT,
) -> Path:
    """`curves_figure(...)` saved as a PNG at `path`."""
    import matplotlib.pyplot as plt

    fig = curves_figure(records, title=title, curves=curves, held_out=held_out)
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


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """`columns` = (key, header); floats with 2 decimals, n/a for NaN or None."""
    head = "| " + " | ".join(h for _, h in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(_fmt(row.get(k, "")) for k, _ in columns) + " |" for row in rows]
    return "\n".join([head, rule, *body])


def write_summary(
    out: str | Path, summary: dict[str, Any], table: str, *, heading: str = "Summary"
) -> tuple[Path, Path]:
    """`summary.json` (everything; NaN and infinities as null) and `summary.md` (the table plus
    settings), each written atomically."""
    out = Path(out)
    json_path = out / "summary.json"
    write_json(summary, json_path, indent=2)
    md_path = out / "summary.md"
    settings = summary.get("settings", {})
    lines = [f"# {heading}", "", table, ""]
    lines += caption_lines(summary.get("samples", {}))
    if settings:
        lines += ["## Settings", "", "| setting | value |", "|---|---|"]
        lines += [f"| {key} | {value!s} |" for key, value in _flat(settings).items()]
        lines.append("")
    with atomic_path(md_path) as tmp:
        tmp.write_text("\n".join(lines), encoding="utf-8")
    return json_path, md_path


def _flat(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as dotted keys (`algorithm.clip_schedule.low`)."""
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _marked(record: dict[str, Any]) -> str:
    """A caption with each word CHAIR found hallucinated in bold and struck through."""
    words = set(record.get("hallucinated") or [])
    text = " ".join(
        f"**~~{w}~~**" if w.strip(".,;:!?").lower() in words else w
        for w in record["caption"].split()
    )
    return text if record.get("hallucinated") is not None else f"{text} (not scored)"


def caption_lines(samples: dict[str, list[dict[str, Any]]], count: int = 4) -> list[str]:
    """The first held-out images' captions after the warm-up and after each RL variant, the
    hallucinated words marked: what the table's CHAIR_i means on real captions."""
    first = (samples.get("warm-up") or [{}])[0]
    if len(samples) < 2 or not {"image_id", "caption"} <= set(first):  # captions only
        return []
    stages = list(samples)
    lines = ["## Held-out captions (hallucinated words **~~marked~~**)", ""]
    for i, record in enumerate(samples["warm-up"][:count]):
        lines.append(f"- image {record['image_id']}:")
        for stage in stages:
            if i < len(samples[stage]):
                lines.append(f"  - {stage}: {_marked(samples[stage][i])}")
    return [*lines, ""]


EVAL_COLUMNS = (
    ("stage", "held-out (greedy)"),
    ("chair_i_pct", "CHAIR_i %"),
    ("chair_s_pct", "CHAIR_s %"),
    ("recall_pct", "recall %"),
    ("cider", "CIDEr-D"),
    ("length", "words"),
    ("train_seconds", "train s"),
)


def eval_row(stage: str, metrics: dict[str, float], seconds: float) -> dict[str, Any]:
    """A summary-table row: CHAIR and recall in percent, as papers print them (NaN, shown as
    n/a, when the CHAIR service scored none of the captions), and the unscored count."""
    return {
        "stage": stage,
        "chair_i_pct": 100.0 * metrics["chair_i"],
        "chair_s_pct": 100.0 * metrics["chair_s"],
        "recall_pct": 100.0 * metrics["recall"],
        "cider": metrics["cider"],
        "length": metrics["length"],
        "train_seconds": seconds,
        "chair_unscored": int(metrics.get("chair_unscored", 0)),
    }


def eval_columns(rows: list[dict[str, Any]]) -> tuple[tuple[str, str], ...]:
    """EVAL_COLUMNS, plus the unscored count when CHAIR left held-out captions unscored."""
    if any(row.get("chair_unscored") for row in rows):
        return (*EVAL_COLUMNS, ("chair_unscored", "CHAIR unscored"))
    return EVAL_COLUMNS
