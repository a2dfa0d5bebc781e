"""The counted sampler: verl's replay buffer inside, every batch counted, and a batch that lost
every sample stopped with our line and its reported causes instead of verl's message."""

from __future__ import annotations

import pytest

from entropyrl.verl.failures import reward_failures
from entropyrl.verl.failures.lost_samples import LostSamplesError
from entropyrl.verl.failures.reward_failures import ERROR, Failure
from entropyrl.verl.failures.sampling import NO_TRAJECTORIES, CountedSampler, SampleAccounting

# verl 0.9.1's message (verl/trainer/ppo/v1/replay_buffer.py), as it raises it
VERL_MESSAGE = (
    "Sync replay buffer selected terminal groups with no materializable trajectories. "
    "Enable trainer.v1.sampler.sync_refill_failed_groups to replace failed groups."
)


class Batch:
    def __init__(self, keys):
        self.keys = keys


class RaisingBuffer:
    """Stands in for verl's buffer when every group failed (needs TransferQueue otherwise)."""

    poll_interval = 2.0

    def sample(self, global_steps, partition_id, batch_size):
        raise RuntimeError(VERL_MESSAGE)


class FullBuffer(RaisingBuffer):
    def sample(self, global_steps, partition_id, batch_size):
        keys = [f"u{p}_{s}_0" for p in range(batch_size) for s in range(2)]
        return Batch(keys), {"off_policy/x": 1.0}


def accounting():
    return SampleAccounting(rollout_n=2, val_n=1, max_fraction=0.01)


def test_verls_message_is_the_one_we_catch():
    from pathlib import Path

    import verl

    source = Path(verl.__file__).parent / "trainer" / "ppo" / "v1" / "replay_buffer.py"
    assert NO_TRAJECTORIES in source.read_text()


def test_a_batch_that_lost_everything_stops_with_its_causes(monkeypatch, capsys):
    broken = (Failure(ERROR, "ValueError: ground_truth is not JSON", "10.0.0.2"), 4)
    monkeypatch.setattr(reward_failures, "drain", lambda: [broken])
    sampler = CountedSampler(RaisingBuffer(), accounting())
    with pytest.raises(LostSamplesError) as stopped:
        sampler.sample(global_steps=3, partition_id="train", batch_size=2)
    line = str(stopped.value)
    assert line.startswith("step 3: every one of 4 samples was lost; reward calls failed: 4x ")
    assert "ground_truth is not JSON" in line and "10.0.0.2" in line
    assert stopped.value.__context__ is None  # our line ends the traceback, not verl's
    assert capsys.readouterr().err == f"entropyrl: {line}\n"


def test_other_errors_and_full_batches_pass_through(monkeypatch):
    monkeypatch.setattr(reward_failures, "drain", lambda: [])
    sampler = CountedSampler(FullBuffer(), accounting())
    batch, metrics = sampler.sample(global_steps=1, partition_id="train", batch_size=3)
    assert len(batch.keys) == 6 and metrics["off_policy/x"] == 1.0
    assert metrics["rollout/lost_samples"] == 0.0 and metrics["rollout/expected_samples"] == 6.0
    assert sampler.poll_interval == 2.0  # the buffer's own attributes, read through

    class Other(RaisingBuffer):
        def sample(self, global_steps, partition_id, batch_size):
            raise RuntimeError("something else")

    with pytest.raises(RuntimeError, match="something else"):
        CountedSampler(Other(), accounting()).sample(1, "train", 2)
