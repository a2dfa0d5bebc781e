"""Example runs of the quick start, printed beside a run's own, and the checks a run must pass.

CPU kernels (BLAS blocking, vector width, thread scheduling) differ between machines, so the same
seed and settings give different numbers on another CPU: a run is not expected to land near the
examples. What a working install does on any machine is checked instead (`quick_start_checks`):
held-out CHAIR_i falls from the warm-up to the end of RL by more than `CHAIR_I_MARGIN` points,
and CIDEr-D falls by no more than `CIDER_MARGIN`; summary.md prints PASS or FAIL for each, and
summary.json the values (`checks`).

`REFERENCE` holds the held-out figures of the default demo as the documentation reports them
(docs/quickstart.md; `tests/rig/local/test_reference.py` checks that the two agree), keyed by (seed,
torch threads): the controlled comparison's seeds (one thread each, the quick start's default) and
the quick start with two threads (seed 0). They are examples from one machine, `MACHINE`, not a range.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "CHAIR_I_MARGIN",
    "CIDER_MARGIN",
    "MACHINE",
    "REFERENCE",
    "SETTINGS_IGNORED",
    "quick_start_checks",
    "quick_start_verdict",
    "reference_for",
    "reference_section",
]

MACHINE = "a 2-core x86-64 VM with torch 2.13.0 (CPU)"

# (seed, threads) -> stage -> metric -> value (percent for CHAIR and recall, as printed).
REFERENCE: dict[tuple[int, int], dict[str, dict[str, float]]] = {
    (0, 2): {
        "after warm-up": {"chair_i_pct": 27.66, "chair_s_pct": 63.00, "recall_pct": 90.37, "cider": 4.17},
        "after RL": {"chair_i_pct": 3.05, "chair_s_pct": 5.00, "recall_pct": 85.03, "cider": 5.32},
    },
    (0, 1): {
        "after warm-up": {"chair_i_pct": 31.56, "recall_pct": 89.30, "cider": 4.06},
        "after RL": {"chair_i_pct": 5.75, "recall_pct": 87.70, "cider": 5.67},
    },
    (1, 1): {
        "after warm-up": {"chair_i_pct": 23.53, "recall_pct": 91.35, "cider": 4.82},
        "after RL": {"chair_i_pct": 8.29, "recall_pct": 89.73, "cider": 5.43},
    },
    (2, 1): {
        "after warm-up": {"chair_i_pct": 34.98, "recall_pct": 88.14, "cider": 3.52},
        "after RL": {"chair_i_pct": 4.05, "recall_pct": 85.57, "cider": 5.53},
    },
}  # fmt: skip

# Options that do not change a run's numbers (where it writes, how it reports), plus the two
# that key the examples.
SETTINGS_IGNORED = frozenset(
    {"out", "overwrite", "progress", "device", "seed", "threads", "seeds", "warmup_cache"}
)

COLUMNS = (
    ("chair_i_pct", "CHAIR_i %"),
    ("chair_s_pct", "CHAIR_s %"),
    ("recall_pct", "recall %"),
    ("cider", "CIDEr-D"),
)

# The checks' margins. CHAIR_i must fall by more than 1 point: with the defaults (100 held-out
# images, about 190 objects) one hallucinated mention among the ~200 that the held-out captions
# make moves CHAIR_i by about half a point, so a run must drop at least two such mentions, and
# a flat or rising CHAIR_i fails. CIDEr-D may fall by up to 0.1 (2-3 % of its value after the
# warm-up in the example runs, 3.5 to 4.8): RL gives up some recall for fewer hallucinations,
# which can cost a little CIDEr-D without anything being wrong. Both margins are far inside the
# smallest change among the example runs (CHAIR_i -15.2 points, CIDEr-D +0.61; a run on another
# 2-core x86-64 VM: CHAIR_i -14.6 points), so a working install passes on any CPU.
CHAIR_I_MARGIN = 1.0  # percentage points
CIDER_MARGIN = 0.1


def _changed_settings(cfg: Any) -> list[str]:
    defaults = type(cfg)()
    return [
        f.name
        for f in dataclasses.fields(cfg)
        if f.name not in SETTINGS_IGNORED and getattr(cfg, f.name) != getattr(defaults, f.name)
    ]


def reference_for(cfg: Any) -> tuple[dict[str, dict[str, float]] | None, str]:
    """(the example run's figures for this run's settings, or None; a sentence saying which run
    or why none)."""
    changed = _changed_settings(cfg)
    if changed:
        return None, (
            "No example run for these settings (changed from the defaults: "
            + ", ".join(changed)
            + ")."
        )
    key = (cfg.seed, cfg.threads)
    if key not in REFERENCE:
        known = ", ".join(f"--seed {s} --threads {t}" for s, t in sorted(REFERENCE))
        return (
            None,
            f"No example run for seed {cfg.seed} with {_threads(cfg.threads)} ({known}).",
        )
    return REFERENCE[key], (
        f"Example run: the same command (seed {cfg.seed}, {_threads(cfg.threads)}) on {MACHINE}. "
        "Another CPU gives other numbers for the same seed (its kernels round differently, and "
        "the run amplifies that): these figures are an example, not a target."
    )


def _threads(count: int) -> str:
    return "one thread" if count == 1 else f"{count} threads"


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else math.nan


def quick_start_checks(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """For each RL row of the demo's table (`stage` "after RL: <variant>"), against the
    "after warm-up" row: held-out CHAIR_i falls by more than `CHAIR_I_MARGIN` points, and
    CIDEr-D falls by no more than `CIDER_MARGIN`. A value not measured (NaN, e.g. the CHAIR
    service scored no caption) fails its check: nothing shows that it holds.

    Returns one dict per check: `stage`, `metric`, `check` (the sentence), `after_warmup`,
    `after_rl`, `change` (after RL minus after warm-up), `margin` and `passed`."""
    warm = next((row for row in rows if row.get("stage") == "after warm-up"), None)
    if warm is None:
        return []
    checks = []
    for row in rows:
        if not str(row.get("stage", "")).startswith("after RL"):
            continue
        for metric, check, margin in (
            (
                "chair_i_pct",
                f"held-out CHAIR_i falls by more than {CHAIR_I_MARGIN:.1f} point",
                CHAIR_I_MARGIN,
            ),
            (
                "cider",
                f"held-out CIDEr-D falls by no more than {CIDER_MARGIN:.2f}",
                CIDER_MARGIN,
            ),
        ):
            before, after = _number(warm.get(metric)), _number(row.get(metric))
            change = round(after - before, 9)  # a fall of exactly the margin is within it
            passed = change < -margin if metric == "chair_i_pct" else change >= -margin
            checks.append(
                {
                    "stage": row["stage"],
                    "metric": metric,
                    "check": check,
                    "after_warmup": before,
                    "after_rl": after,
                    "change": change,
                    "margin": margin,
                    "passed": bool(passed),
                }
            )
    return checks


def quick_start_verdict(
    rows: Sequence[Mapping[str, Any]], checks: Sequence[Mapping[str, Any]], out: str
) -> tuple[bool, str]:
    """(whether every check held, the run's one-line verdict): PASS or FAIL, each RL row's
    held-out CHAIR_i and CIDEr-D before and after, the checks that failed, where the outputs
    are."""
    warm = next((row for row in rows if row.get("stage") == "after warm-up"), {})
    figures = []
    for row in rows:
        stage = str(row.get("stage", ""))
        if not stage.startswith("after RL"):
            continue
        name = stage.removeprefix("after RL: ")
        figures.append(
            f"{name}: held-out CHAIR_i {_number(warm.get('chair_i_pct')):.1f} % -> "
            f"{_number(row.get('chair_i_pct')):.1f} %, CIDEr-D {_number(warm.get('cider')):.2f} "
            f"-> {_number(row.get('cider')):.2f}"
        )
    failed = [check for check in checks if not check["passed"]]
    if not figures:
        return True, f"done (no RL step, nothing to check); outputs in {out}"
    line = "; ".join(figures)
    if failed:
        line += "; failed: " + "; ".join(
            f"{check['stage'].removeprefix('after RL: ')}: {check['check']}" for check in failed
        )
    return not failed, f"{'FAIL' if failed else 'PASS'}: {line}; outputs in {out}"


def _cell(value: float, sign: bool = False) -> str:
    if not math.isfinite(value):
        return "n/a"
    return f"{value:+.2f}" if sign else f"{value:.2f}"


def _examples(cfg: Any, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    figures, sentence = reference_for(cfg)
    lines = ["## Example runs", "", sentence]
    if figures is None:
        return lines
    header = "| stage | " + " | ".join(f"{t} (this run / example)" for _, t in COLUMNS) + " |"
    lines += ["", header, "|---" * (len(COLUMNS) + 1) + "|"]
    for row in rows:
        stage = "after warm-up" if row["stage"] == "after warm-up" else "after RL"
        if not str(row["stage"]).startswith(stage):
            continue
        cells = []
        for key, _ in COLUMNS:
            own, ref = _number(row.get(key)), figures[stage].get(key)
            cells.append(f"{_cell(own)} / {'-' if ref is None else f'{ref:.2f}'}")
        lines.append(f"| {row['stage']} | " + " | ".join(cells) + " |")
    return lines


def _checks(cfg: Any, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    checks = quick_start_checks(rows)
    lines = ["## Did it work?", ""]
    if not checks:
        return [*lines, "No check: the table has no warm-up row or no RL row."]
    lines += [
        "| check | after warm-up | after RL | change | result |",
        "|---|---|---|---|---|",
    ]
    for c in checks:
        variant = c["stage"].removeprefix("after RL").lstrip(": ") or "RL"
        lines.append(
            f"| {variant}: {c['check']} | {_cell(c['after_warmup'])} | {_cell(c['after_rl'])} "
            f"| {_cell(c['change'], sign=True)} | {'PASS' if c['passed'] else 'FAIL'} |"
        )
    lines += [
        "",
        f"Margins: CHAIR_i must fall by more than {CHAIR_I_MARGIN:.1f} point (about two "
        "hallucinated object mentions in the default 100 held-out captions), so a flat CHAIR_i "
        f"fails; CIDEr-D may fall by up to {CIDER_MARGIN:.2f}, a little of what RL can give up "
        "with the recall it trades for fewer hallucinations. A value n/a (not measured) fails.",
        "",
    ]
    changed = _changed_settings(cfg)
    if changed:
        lines.append(
            "The margins are set for the default settings; with these (changed from the "
            f"defaults: {', '.join(changed)}) a FAIL can come from the settings themselves."
        )
    else:
        lines.append(
            "With the default settings a working install passes both on any CPU: the margins "
            "are small beside the changes RL makes in the example runs. A FAIL points to a "
            "problem rather than to a different machine."
        )
    return lines


def reference_section(cfg: Any, rows: list[Mapping[str, Any]]) -> str:
    """Markdown for summary.md: the run's held-out rows beside the example run's (when there is
    one for these settings), then the checks, PASS or FAIL each.

    `rows` are the demo's table rows (`stage` "after warm-up" / "after RL: <variant>")."""
    return "\n".join([*_examples(cfg, rows), "", *_checks(cfg, rows)])
