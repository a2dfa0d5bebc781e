"""The README's quick-start figures and the ones summary.md prints beside a run are the same."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from entropyrl.local.config import DemoConfig
from entropyrl.local.reference import REFERENCE, reference_for, reference_section

README = Path(__file__).resolve().parents[2] / "README.md"


def _quick_start_section() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("### Quick start: `bash examples/quickstart.sh`")
    end = text.index("\n### ", start + 1)
    return text[start:end]


def _numbers(cell: str) -> list[float]:
    return [float(x) for x in re.findall(r"-?\d+\.\d+", cell)]


def test_readme_quick_start_table_is_the_reference():
    section = _quick_start_section()
    rows = {}
    for line in section.splitlines():
        match = re.match(r"\| (after warm-up|after RL[^|]*) \| (.+) \|$", line)
        if match:
            stage = "after warm-up" if match[1] == "after warm-up" else "after RL"
            rows[stage] = [float(x) for x in match[2].split(" | ")]
    assert set(rows) == {"after warm-up", "after RL"}, "the README's quick-start table moved"
    for stage, values in rows.items():
        ref = REFERENCE[(0, 2)][stage]
        expected = [ref["chair_i_pct"], ref["chair_s_pct"], ref["recall_pct"], ref["cider"]]
        assert values == pytest.approx(expected, abs=0.005), stage


def test_readme_controlled_comparison_rows_are_the_reference():
    section = _quick_start_section()
    seen = set()
    for line in section.splitlines():
        match = re.match(r"\| (\d) \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$", line)
        if not match:
            continue
        seed = int(match[1])
        warm, after = _numbers(match[2]), _numbers(match[3])
        ref = REFERENCE[(seed, 1)]
        for stage, values in (("after warm-up", warm), ("after RL", after)):
            r = ref[stage]
            assert values == pytest.approx([r["chair_i_pct"], r["recall_pct"], r["cider"]])
        seen.add(seed)
    assert seen == {s for s, threads in REFERENCE if threads == 1}


def test_defaults_get_their_reference_and_changed_settings_none():
    figures, sentence = reference_for(DemoConfig())
    assert figures is REFERENCE[(0, 2)] and "seed 0, 2 threads" in sentence
    assert reference_for(DemoConfig(seed=1, threads=1))[0] is REFERENCE[(1, 1)]
    assert reference_for(DemoConfig(out="elsewhere", progress=False))[0] is not None
    figures, sentence = reference_for(DemoConfig(steps=5, lr=1e-3))
    assert figures is None and "steps, lr" in sentence
    figures, sentence = reference_for(DemoConfig(seed=7))
    assert figures is None and "--seed 0 --threads 2" in sentence


def test_section_puts_the_run_beside_the_readme():
    rows = [
        {"stage": "after warm-up", "chair_i_pct": 22.5, "chair_s_pct": 45.0, "recall_pct": 88.0,
         "cider": 5.0},
        {"stage": "after RL: egpo+clip", "chair_i_pct": float("nan"), "chair_s_pct": 16.0,
         "recall_pct": 89.0, "cider": 6.0},
    ]  # fmt: skip
    text = reference_section(DemoConfig(), rows)
    ref = REFERENCE[(0, 2)]
    assert f"22.50 / {ref['after warm-up']['chair_i_pct']:.2f}" in text
    assert f"n/a / {ref['after RL']['chair_i_pct']:.2f}" in text  # an unscored evaluation
    assert "What should hold" in text
    other = reference_section(DemoConfig(steps=5), rows)
    assert "changed from the defaults: steps" in other and "What should hold" not in other
