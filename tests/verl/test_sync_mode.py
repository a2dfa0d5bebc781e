"""`trainer.v1.trainer_mode=entropyrl` behaves exactly as verl's own sync trainer.

verl keys its synchronous behaviour on the literal mode name "sync": the replay buffer class,
`trainer.v1.<mode>.*` settings, prompt refill and TransferQueue checkpoints. Both trainers are
built here from the same composed config (their constructors need no Ray) and compared.
"""

from __future__ import annotations

import pytest


def build(compose, cls, mode: str):
    config = compose(
        "chair_mscoco",
        [
            f"trainer.v1.trainer_mode={mode}",
            "+trainer.v1.sync.parameter_sync_step=3",
            # Where verl's async path would look for our mode's settings: must be ignored.
            f"+trainer.v1.{mode}.parameter_sync_step=7" if mode != "sync" else "+trainer.x=1",
        ],
    )
    return cls(config)


@pytest.fixture(scope="module")
def trainers(compose):
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from entropyrl.verl.trainer import TRAINER_MODE, EntropyPPOTrainer

    return build(compose, PPOTrainerSync, "sync"), build(compose, EntropyPPOTrainer, TRAINER_MODE)


def test_mode_and_settings_are_the_sync_trainers(trainers):
    sync, ours = trainers
    assert ours.trainer_mode == sync.trainer_mode == "sync"
    assert ours.parameter_sync_step == sync.parameter_sync_step == 3


def test_replay_buffer_is_the_sync_one(trainers):
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

    from entropyrl.verl.failures.sampling import CountedSampler

    sync, ours = trainers
    assert isinstance(ours.replay_buffer, CountedSampler)  # ours counts; verl's buffer inside
    inner = ours.replay_buffer.inner
    assert type(inner) is type(sync.replay_buffer) is ReplayBuffer
    assert not isinstance(inner, ReplayBufferAsync)
    assert vars(inner)["trainer_mode"] == "sync"
    assert vars(inner)["trainer_config"] == vars(sync.replay_buffer)["trainer_config"]
    # the sync keyword arguments verl gives its own buffer reach it (custom_sampler's would not)
    assert (
        ours.replay_buffer.sync_refill_failed_groups == sync.replay_buffer.sync_refill_failed_groups
    )
    assert "sample" not in vars(inner)  # verl's method, not replaced on the instance


def test_sync_keyed_paths_take_the_sync_branch(trainers):
    """Paths verl guards with `trainer_mode != "sync"` return early as for the sync trainer."""
    sync, ours = trainers
    assert ours._reissue_inflight_prompts() == sync._reissue_inflight_prompts() == 0


def test_assignment_cannot_switch_the_mode(trainers):
    _, ours = trainers
    ours.trainer_mode = "colocate_async"
    assert ours.trainer_mode == "sync"
