"""docs/quickstart.md's credit pilot table says what docs/study_pilot.json holds: each paired
difference and its 95 % interval, to the digits shown."""

from __future__ import annotations

import json
import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[3] / "docs"
ROWS = {
    "GRPO on CIDEr-D alone": "cider-grpo",
    "token penalty (beta 1) beside the sequence penalty": "token-penalty+seq",
    "control: warm-up continued, same CPU time": "control",
}
COLUMNS = ("eval/chair_i", "eval/recall", "eval/cider")


def _cell(stats, scale):
    low, high = stats["ci95"]
    return f"{scale * stats['mean']:+.2f} [{scale * low:+.2f}, {scale * high:+.2f}]"


def test_the_pilot_table_equals_its_summary():
    summary = json.loads((DOCS / "study_pilot.json").read_text())
    paired = summary["aggregate"]["paired"]
    text = (DOCS / "quickstart.md").read_text()
    text = text[text.index("### Where hallucination credit goes") : text.index("A second pilot")]
    seeds = sorted({r["seed"] for r in summary["runs"]})
    assert seeds == [0, 1, 2, 3] and "seeds 0-3" in text
    for label, key in ROWS.items():
        (line,) = [row for row in text.splitlines() if row.startswith(f"| {label} |")]
        cells = [c.strip() for c in line.strip("|").split("|")[1:]]
        expected = [
            _cell(paired[key][metric], 1.0 if metric == "eval/cider" else 100.0)
            for metric in COLUMNS
        ]
        assert cells == expected, label
    sd = 100 * paired["token-penalty+seq"]["eval/chair_i"]["sd"]
    assert re.search(rf"\({sd:.1f} points for the token\s+penalty", text)


SECOND = {
    "token clip (hallucinated tokens 0.2 / 0.5) beside the sequence penalty": "token-clip+seq",
    "clip-low rule (clean 0.2 / hallucinating 0.4) beside the sequence penalty": "clip-low+seq",
}


def test_the_second_pilot_table_equals_its_summary():
    summary = json.loads((DOCS / "study_pilot_b.json").read_text())
    paired = summary["aggregate"]["paired"]
    text = (DOCS / "quickstart.md").read_text()
    text = text[text.index("A second pilot") :]
    assert sorted({r["seed"] for r in summary["runs"]}) == [0, 1, 2, 3] and "seeds 0-3" in text
    rows = {**SECOND, "control: warm-up continued, same CPU time": "control"}
    for label, key in rows.items():
        line = next(row for row in text.splitlines() if row.startswith(f"| {label} |"))
        cells = [c.strip() for c in line.strip("|").split("|")[1:]]
        expected = [
            _cell(paired[key][metric], 1.0 if metric == "eval/cider" else 100.0)
            for metric in COLUMNS
        ]
        assert cells == expected, label
    variants = summary["aggregate"]["variants"]
    for key in ("grpo-low", "clip-low+seq"):
        share = variants[key]["train/clip_frac_low/hallucinated"]
        assert f"{100 * share['mean']:.2f} ± {100 * share['sd']:.2f}" in text, key
    token_clip = variants["token-clip+seq"]["train/clip_frac_low/hallucinated"]["mean"]
    assert f"leaves it at {100 * token_clip:.2f} %" in text
