"""The recorded runs (tests/rig/smoke/recorded) still look like a live run of today's code.

The smoke check's tests read recordings, not live runs; when the trace or verl's logger changes
what a run writes, a recording goes stale and those tests would keep passing on an old format.
The session's live runs are compared with the recordings of the same commands, field by field:
a difference means `python -m entropyrl.rig.smoke.record NAME`, and the diff reviewed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from entropyrl.rig.smoke.check import is_training_row
from entropyrl.rig.smoke.record import RECORDED, Recording, read_recording

RECORDINGS = Path(__file__).parent / "recorded"
# the live smoke run of tests/conftest.py made by the same command as each recording
LIVE = {"egpo": "fc", "lora": "lora_caption_entropy_adv"}


def fields(run: Recording) -> dict[str, set[str]]:
    """The field names each kind of row carries, and the training rows' metric names."""
    kinds = {
        "driver": run.driver,
        "worker": run.workers,
        "sync": run.syncs,
        "rollout": run.rollouts,
    }
    out = {kind: {key for row in rows for key in row} for kind, rows in kinds.items()}
    out["metrics"] = {key for row in run.metrics if is_training_row(row) for key in row["data"]}
    return out


def test_every_recorded_run_has_its_command_and_its_files():
    assert sorted(path.name for path in RECORDINGS.iterdir() if path.is_dir()) == sorted(RECORDED)
    for name in RECORDED:
        run = read_recording(RECORDINGS / name)
        assert run.driver and run.metrics, name
        assert "<run>" in (RECORDINGS / name / "config.yaml").read_text()  # no machine paths


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=pytest.mark.xdist_group(LIVE[name])) for name in LIVE]
)
def test_a_recording_has_the_fields_of_a_live_run(name, smoke_runs):
    recorded = fields(read_recording(RECORDINGS / name))
    live = fields(read_recording(smoke_runs(LIVE[name]).out))
    for kind in live:
        stale = live[kind] ^ recorded[kind]
        assert not stale, (
            f"the {name} recording's {kind} rows differ from a live run's by {sorted(stale)}: "
            f"record it again (python -m entropyrl.rig.smoke.record {name})"
        )
