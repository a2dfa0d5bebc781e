"""The samples a step asked for, counted where verl's replay buffer hands them over.

`CountedSampler` holds the replay buffer verl builds for the entropy-aware trainer and is what
that trainer samples from: each batch (training and validation) is judged by `SampleAccounting`
(`entropyrl.verl.failures.lost_samples.account`, with the failures the reward workers reported through
`entropyrl.verl.failures.reward_failures`), which prints the losses, adds `rollout/*` metrics to the
step's, or stops the run with one line. Nothing of verl's is changed: the buffer object is
verl's own, untouched, and only our trainer holds the wrapper.

Why a wrapper and not verl's extension point: `trainer.v1.sampler.custom_sampler.{path,name}`
replaces the buffer class, and `trainer_base._build_replay_buffer` then builds it with the old
constructor contract only, leaving out the sync keyword arguments (`filter_groups_metric`,
`sync_refill_failed_groups`, ...) that verl's own `ReplayBuffer` gets: a registered subclass would
silently lose DAPO filtering and the refill of failed groups.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from entropyrl.verl.failures import reward_failures
from entropyrl.verl.failures.lost_samples import (
    LostSamplesError,
    account,
    refused_token,
    sessions_received,
)

__all__ = ["NO_TRAJECTORIES", "CountedSampler", "SampleAccounting"]

# What verl 0.9.1's sync `ReplayBuffer.sample` raises when every selected group failed
# (`replay_buffer.py`); the cause (the reward workers' reports) is ours to say.
NO_TRAJECTORIES = "Sync replay buffer selected terminal groups with no materializable trajectories"


def _where(global_steps: int, partition_id: str) -> str:
    return f"validation at step {global_steps}" if partition_id == "val" else f"step {global_steps}"


class SampleAccounting:
    """Judges each batch against what was asked for: prompts x `rollout_n` samples for training
    (`val_n` for validation), the limit `max_fraction` of `algorithm.lost_samples`."""

    def __init__(self, *, rollout_n: int, val_n: int, max_fraction: float) -> None:
        self.rollout_n, self.val_n, self.max_fraction = int(rollout_n), int(val_n), max_fraction
        self._failures: list[tuple[reward_failures.Failure, int]] = []  # reported, not counted

    def reported(self) -> list[tuple[reward_failures.Failure, int]]:
        """The failures the reward workers reported since the last batch was counted."""
        self._failures.extend(reward_failures.drain())
        return self._failures

    @staticmethod
    def stop(line: str) -> NoReturn:
        """Stop the run for lost samples: the line on the driver's stderr, then the error."""
        print(f"entropyrl: {line}", file=sys.stderr, flush=True)
        raise LostSamplesError(line)

    def stop_on_refused_token(self, global_steps: int) -> None:
        """Before verl refills failed groups: a refused CHAIR token would fail every refill."""
        line = refused_token(f"step {global_steps}", self.reported())
        if line:
            self.stop(line)

    def count(
        self, keys: Sequence[str], global_steps: int, partition_id: str, batch_size: int
    ) -> dict[str, float]:
        """The step's `rollout/*` metrics for a batch of trajectory `keys` (none for validation),
        after printing its losses; stops the run with the verdict's line."""
        per_prompt = self.val_n if partition_id == "val" else self.rollout_n
        verdict = account(
            where=_where(global_steps, partition_id),
            expected=int(batch_size) * per_prompt,
            received=sessions_received(keys),
            failures=self.reported(),
            max_fraction=self.max_fraction,
        )
        self._failures = []
        if verdict.stop:
            self.stop(verdict.stop)
        if verdict.warning:
            print(f"entropyrl: warning: {verdict.warning}", file=sys.stderr, flush=True)
        return {} if partition_id == "val" else verdict.metrics


class CountedSampler:
    """verl's replay buffer, its batches counted by `accounting` (every other attribute is the
    buffer's own, read through)."""

    def __init__(self, buffer: Any, accounting: SampleAccounting) -> None:
        self.inner = buffer  # verl's own, untouched
        self._accounting = accounting

    def __getattr__(self, name: str) -> Any:
        # only names this wrapper does not define reach here: the buffer's own
        if name == "inner":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[Any, dict]:
        """verl's `ReplayBuffer.sample`, then the accounting: (the batch's `KVBatchMeta`, the
        buffer's metrics with `rollout/*` added). A batch that lost every sample stops with our
        line and its causes instead of verl's message."""
        try:
            batch, metrics = self.inner.sample(
                global_steps=global_steps, partition_id=partition_id, batch_size=batch_size
            )
        except RuntimeError as error:
            if NO_TRAJECTORIES not in str(error):
                raise
            empty: RuntimeError | None = error
        else:
            empty = None
        if empty is not None:  # outside the handler: our line, not verl's, ends the traceback
            self._accounting.count([], global_steps, partition_id, batch_size)
            raise empty  # nothing was asked for (batch_size 0): verl's error stands
        extra = self._accounting.count(batch.keys, global_steps, partition_id, batch_size)
        return batch, {**metrics, **extra}
