"""The quick-start figures in docs/quickstart.md equal the ones summary.md prints beside a run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from entropyrl.rig.local.config import DemoConfig
from entropyrl.rig.local.reference import (
    CHAIR_I_MARGIN,
    CIDER_MARGIN,
    MACHINE,
    REFERENCE,
    quick_start_checks,
    reference_for,
    reference_section,
)

README = Path(__file__).resolve().parents[3] / "docs" / "quickstart.md"


def _quick_start_section() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("### Quick start: `bash examples/quickstart.sh`")
    end = text.index("\n### ", start + 1)
    return text[start:end]


def _numbers(cell: str) -> list[float]:
    return [float(x) for x in re.findall(r"-?\d+\.\d+", cell)]


def test_readme_quick_start_table_is_the_reference():
    """The defaults' example (seed 0, one thread) as a table, the two-thread one in the text."""
    section = _quick_start_section()
    rows = {}
    for line in section.splitlines():
        match = re.match(r"\| (after warm-up|after RL[^|]*) \| (.+) \|$", line)
        if match:
            stage = "after warm-up" if match[1] == "after warm-up" else "after RL"
            rows[stage] = [float(x) for x in match[2].split(" | ")]
    assert set(rows) == {"after warm-up", "after RL"}, "the quick-start table moved"
    for stage, values in rows.items():
        ref = REFERENCE[(0, 1)][stage]
        assert values == pytest.approx([ref["chair_i_pct"], ref["recall_pct"], ref["cider"]]), stage
    prose = " ".join(section.split())
    sentence = prose[prose.index("With two threads (`--threads 2`, seed 0)") :].split(";")[0]
    stated = [float(x) for x in re.findall(r"\d+\.\d+", sentence)]
    two = REFERENCE[(0, 2)]
    keys = ("chair_i_pct", "chair_s_pct", "recall_pct", "cider")
    assert stated == [two[stage][k] for stage in ("after warm-up", "after RL") for k in keys]


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


def test_the_stated_changes_of_the_example_runs_are_theirs():
    """Where the page sums the example runs up (CHAIR_i lowered by X to Y points, CIDEr-D
    raised by A to B), the numbers are those of `REFERENCE`."""
    section = " ".join(_quick_start_section().split())
    match = re.search(
        r"CHAIR_i by (\d+\.\d+) to (\d+\.\d+) points and raised CIDEr-D by "
        r"(\d+\.\d+) to (\d+\.\d+)",
        section,
    )
    assert match, "docs/quickstart.md no longer sums up the example runs' changes"
    chair = [
        r["after warm-up"]["chair_i_pct"] - r["after RL"]["chair_i_pct"] for r in REFERENCE.values()
    ]
    cider = [r["after RL"]["cider"] - r["after warm-up"]["cider"] for r in REFERENCE.values()]
    stated = [float(x) for x in match.groups()]
    assert stated[:2] == pytest.approx([min(chair), max(chair)], abs=0.05)
    assert stated[2:] == pytest.approx([min(cider), max(cider)], abs=0.005)


def test_defaults_get_their_reference_and_changed_settings_none():
    figures, sentence = reference_for(DemoConfig())
    assert figures is REFERENCE[(0, 1)] and "seed 0, one thread" in sentence
    assert reference_for(DemoConfig(threads=2))[0] is REFERENCE[(0, 2)]
    assert MACHINE in sentence
    assert reference_for(DemoConfig(seed=1, threads=1))[0] is REFERENCE[(1, 1)]
    assert reference_for(DemoConfig(out="elsewhere", progress=False))[0] is not None
    figures, sentence = reference_for(DemoConfig(steps=5, lr=1e-3))
    assert figures is None and "steps, lr" in sentence
    figures, sentence = reference_for(DemoConfig(seed=7))
    assert figures is None and "--seed 0 --threads 2" in sentence


def _rows(warm: dict, after: dict, variant: str = "egpo+clip") -> list[dict]:
    return [{"stage": "after warm-up", **warm}, {"stage": f"after RL: {variant}", **after}]


def test_section_puts_the_run_beside_the_example_and_ends_with_the_checks():
    rows = [
        {"stage": "after warm-up", "chair_i_pct": 22.5, "chair_s_pct": 45.0, "recall_pct": 88.0,
         "cider": 5.0},
        {"stage": "after RL: egpo+clip", "chair_i_pct": float("nan"), "chair_s_pct": 16.0,
         "recall_pct": 89.0, "cider": 6.0},
    ]  # fmt: skip
    text = reference_section(DemoConfig(), rows)
    ref = REFERENCE[(0, 1)]
    assert f"22.50 / {ref['after warm-up']['chair_i_pct']:.2f}" in text
    assert f"n/a / {ref['after RL']['chair_i_pct']:.2f}" in text  # an unscored evaluation
    assert MACHINE in text and "an example, not a target" in text
    checks = text[text.index("## Did it work?") :]
    assert (
        "| egpo+clip: held-out CHAIR_i falls by more than 1.0 point | 22.50 | n/a | n/a | FAIL |"
        in checks
    )
    assert (
        "| egpo+clip: held-out CIDEr-D falls by no more than 0.10 | 5.00 | 6.00 | +1.00 | PASS |"
        in checks
    )
    assert "A FAIL points to a problem" in checks
    other = reference_section(DemoConfig(steps=5), rows)
    assert "changed from the defaults: steps" in other
    assert "| FAIL |" in other and "a FAIL can come from the settings themselves" in other
    assert "A FAIL points to a problem" not in other


def test_every_example_run_passes_the_checks():
    for key, runs in REFERENCE.items():
        checks = quick_start_checks(_rows(runs["after warm-up"], runs["after RL"]))
        assert [c["metric"] for c in checks] == ["chair_i_pct", "cider"], key
        assert all(c["passed"] for c in checks), (key, checks)
    # a valid run on another 2-core x86-64 VM: CHAIR_i 14.6 points lower, outside the examples
    checks = quick_start_checks(_rows({"chair_i_pct": 30.0, "cider": 4.0},
                                      {"chair_i_pct": 15.4, "cider": 4.5}))  # fmt: skip
    assert [c["passed"] for c in checks] == [True, True]
    assert checks[0]["change"] == pytest.approx(-14.6)


@pytest.mark.parametrize(
    ("after", "passed"),
    [
        ({"chair_i_pct": 20.0 - CHAIR_I_MARGIN - 0.01, "cider": 4.0}, [True, True]),
        ({"chair_i_pct": 20.0 - CHAIR_I_MARGIN + 0.01, "cider": 4.0}, [False, True]),  # flat
        ({"chair_i_pct": 25.0, "cider": 6.0}, [False, True]),  # CHAIR_i rises
        ({"chair_i_pct": 5.0, "cider": 4.0 - CIDER_MARGIN}, [True, True]),  # at the margin
        ({"chair_i_pct": 5.0, "cider": 4.0 - CIDER_MARGIN - 0.01}, [True, False]),  # falls
        ({"chair_i_pct": float("nan"), "cider": float("nan")}, [False, False]),  # not measured
    ],
)
def test_checks_have_the_stated_margins(after, passed):
    checks = quick_start_checks(_rows({"chair_i_pct": 20.0, "cider": 4.0}, after))
    assert [c["passed"] for c in checks] == passed
    assert [c["margin"] for c in checks] == [CHAIR_I_MARGIN, CIDER_MARGIN]
    assert all(c["stage"] == "after RL: egpo+clip" for c in checks)


def test_each_compared_variant_is_checked_against_the_one_warm_up():
    rows = [
        {"stage": "after warm-up", "chair_i_pct": 20.0, "cider": 4.0},
        {"stage": "after RL: grpo", "chair_i_pct": 10.0, "cider": 4.5},
        {"stage": "after RL: egpo+clip", "chair_i_pct": 21.0, "cider": 4.5},
    ]
    checks = quick_start_checks(rows)
    assert [(c["stage"], c["passed"]) for c in checks] == [
        ("after RL: grpo", True),
        ("after RL: grpo", True),
        ("after RL: egpo+clip", False),
        ("after RL: egpo+clip", True),
    ]


def test_the_local_runner_describes_its_machine_plainly():
    """summary.md names the example runs' machine as it is, not relative to the reader's."""
    assert MACHINE.startswith("a 2-core x86-64 VM")
    banned = ("this machine", "busy machine", "previous release", "earlier measurement")
    for path in sorted(
        (Path(__file__).resolve().parents[3] / "entropyrl" / "rig" / "local").glob("*.py")
    ):
        text = path.read_text(encoding="utf-8").lower()
        assert not [phrase for phrase in banned if phrase in text], path.name
