"""The smoke check judges the clip-low schedule's bounds (`EXPERIMENT=clip_low`) as it judges the
clip schedule's: each sample's clip_low against the rule for its CHAIR_i, and what reached the
loss against what the driver computed. Read from the recorded caption run with the schedule
switched on and its bounds written in, then planted faults; no Ray."""

from __future__ import annotations

from pathlib import Path

import pytest

from entropyrl.core.specs import ClipLowScheduleSpec
from entropyrl.rig.smoke.check import check_bounds, check_loss_inputs, clip_rule
from entropyrl.rig.smoke.record import Recording, read_recording

RECORDINGS = Path(__file__).parent / "recorded"


@pytest.fixture(scope="module")
def recorded() -> Recording:
    return read_recording(RECORDINGS / "caption")


@pytest.fixture
def clip_low(recorded) -> Recording:
    """The caption run as the clip-low schedule would have recorded its bounds."""
    run = recorded.copy()
    run.config.algorithm.clip_low_schedule.enable = True
    spec = ClipLowScheduleSpec(enable=True)
    by_key = {}
    for row in run.driver:
        row["clip_low"] = clip_rule(row["chair_i"], spec)
        by_key[(row["step"], row["key"])] = row["clip_low"]
    for row in run.workers:
        row["clip_low"] = by_key[(row["step"], row["key"])]
    return run


def test_the_schedules_bounds_pass(clip_low):
    assert check_bounds(clip_low.driver, clip_low.config) == []
    assert check_loss_inputs(clip_low.driver, clip_low.workers) == []
    assert {row["clip_low"] for row in clip_low.driver} == {0.2, 0.4}  # both sides seen


def test_a_constant_clip_low_fails(clip_low):
    for row in clip_low.driver + clip_low.workers:
        row["clip_low"] = 0.2
    problems = check_bounds(clip_low.driver, clip_low.config)
    assert any(
        "got clip_low bound 0.2, the step rule (hallucinated_high) gives 0.4" in p for p in problems
    ), problems


def test_a_missing_clip_low_fails(clip_low):
    clip_low.driver[0]["clip_low"] = None
    problems = check_bounds(clip_low.driver, clip_low.config)
    assert any("a sample reached the loss without a clip_low bound" in p for p in problems), (
        problems
    )


def test_a_loss_that_read_another_clip_low_fails(clip_low):
    row = next(r for r in clip_low.workers if r["clip_low"] == 0.2)
    row["clip_low"] = 0.4
    problems = check_loss_inputs(clip_low.driver, clip_low.workers)
    assert any("clip_low" in p for p in problems), problems


def test_the_step_metrics_of_the_clip_low_schedule_are_recomputed(clip_low):
    from entropyrl.rig.smoke.step_metrics import driver_metrics

    clip_low.config.algorithm.clip_schedule.enable = False  # EXPERIMENT=clip_low
    threshold = clip_low.config.algorithm.clip_schedule.threshold
    step = clip_low.real()[0]["step"]
    rows = [r for r in clip_low.real() if r["step"] == step]
    got = driver_metrics(rows, clip_low.config, padded=False)
    lows = [r["clip_low"] for r in rows]
    scored = [r["chair_i"] for r in rows if r["chair_i"] is not None]
    assert got["clip/low_bound_mean"] == pytest.approx(sum(lows) / len(lows))
    assert (got["clip/low_bound_min"], got["clip/low_bound_max"]) == (min(lows), max(lows))
    # CHAIR's figures are logged without the clip schedule too; its bounds are not
    assert got["chair/chair_i_mean"] == pytest.approx(sum(scored) / len(scored))
    assert got["chair/hallucinated_frac"] == pytest.approx(
        sum(c >= threshold for c in scored) / len(scored)
    )
    assert "clip/bound_mean" not in got
