"""The README's quick-start figures, printed beside a run's own so a user can tell a different
machine from a broken install.

CPU kernels (BLAS blocking, vector width, thread scheduling) differ between machines, so the same
seed and settings give different numbers on another CPU; what holds is the direction and size of
the change. `REFERENCE` holds the held-out figures of the default demo as the README reports them
(`tests/local/test_reference.py` checks that the two agree), keyed by (seed, torch threads): the
quick start itself (seed 0, 2 threads) and the controlled comparison's seeds (one thread each).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["MACHINE", "REFERENCE", "SETTINGS_IGNORED", "reference_for", "reference_section"]

MACHINE = "a shared 2-core x86-64 cloud VM, torch 2.13.0 CPU"

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
# that key the reference.
SETTINGS_IGNORED = frozenset({"out", "progress", "device", "seed", "threads", "seeds"})

COLUMNS = (
    ("chair_i_pct", "CHAIR_i %"),
    ("chair_s_pct", "CHAIR_s %"),
    ("recall_pct", "recall %"),
    ("cider", "CIDEr-D"),
)


def _changed_settings(cfg: Any) -> list[str]:
    defaults = type(cfg)()
    return [
        f.name
        for f in dataclasses.fields(cfg)
        if f.name not in SETTINGS_IGNORED and getattr(cfg, f.name) != getattr(defaults, f.name)
    ]


def reference_for(cfg: Any) -> tuple[dict[str, dict[str, float]] | None, str]:
    """(the README's figures for this run, or None; a sentence saying which or why none)."""
    changed = _changed_settings(cfg)
    if changed:
        return None, (
            "No README reference for these settings (changed from the defaults: "
            + ", ".join(changed)
            + ")."
        )
    key = (cfg.seed, cfg.threads)
    if key not in REFERENCE:
        known = ", ".join(f"--seed {s} --threads {t}" for s, t in sorted(REFERENCE))
        return (
            None,
            f"No README reference for seed {cfg.seed} with {cfg.threads} threads ({known}).",
        )
    return REFERENCE[key], (
        f"README reference: the same command (seed {cfg.seed}, {cfg.threads} threads) on {MACHINE}."
    )


def _range(stage_a: str, stage_b: str, metric: str) -> tuple[float, float] | None:
    changes = [
        runs[stage_b][metric] - runs[stage_a][metric]
        for runs in REFERENCE.values()
        if metric in runs[stage_a] and metric in runs[stage_b]
    ]
    return (min(changes), max(changes)) if changes else None


def reference_section(cfg: Any, rows: list[Mapping[str, Any]]) -> str:
    """Markdown for summary.md: the run's held-out rows beside the README's, and what to expect.

    `rows` are the demo's table rows (`stage` "after warm-up" / "after RL: <variant>")."""
    figures, sentence = reference_for(cfg)
    lines = ["## Compared with the README", "", sentence]
    if figures is not None:
        header = "| stage | " + " | ".join(f"{t} (this run / README)" for _, t in COLUMNS) + " |"
        lines += ["", header, "|---" * (len(COLUMNS) + 1) + "|"]
        for row in rows:
            stage = "after warm-up" if row["stage"] == "after warm-up" else "after RL"
            if not str(row["stage"]).startswith(stage):
                continue
            cells = []
            for key, _ in COLUMNS:
                own, ref = row.get(key), figures[stage].get(key)
                own_text = "n/a" if own is None or own != own else f"{own:.2f}"
                ref_text = "-" if ref is None else f"{ref:.2f}"
                cells.append(f"{own_text} / {ref_text}")
            lines.append(f"| {row['stage']} | " + " | ".join(cells) + " |")
    chair = _range("after warm-up", "after RL", "chair_i_pct")
    cider = _range("after warm-up", "after RL", "cider")
    if chair and cider and not _changed_settings(cfg):
        lines += [
            "",
            "Another CPU gives other numbers for the same seed (its kernels round differently, "
            "and the run amplifies that). What should hold: RL lowers held-out CHAIR_i by "
            f"{-chair[1]:.1f} to {-chair[0]:.1f} points and changes CIDEr-D by {cider[0]:+.2f} to "
            f"{cider[1]:+.2f} over the README's runs ({len(REFERENCE)} seed/thread settings). A "
            "run far outside that, or one whose CHAIR_i rises, points to a problem rather than "
            "a different machine.",
        ]
    return "\n".join(lines)
