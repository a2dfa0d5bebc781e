"""Samples a step asked for and did not get: counted, explained, and past a limit, a stop.

verl 0.9.1's sync replay buffer hands the trainer every group whose sessions have ended, failed
ones included (`replay_buffer.py`: "failed groups remain sampleable and missing trajectories are
padded downstream"): a session whose reward call raised, whose generation failed or whose agent
loop broke is simply absent, and `_balance_batch` pads the batch with synthetic rows (a step that
lost one of 2,560 samples is padded to the next multiple of a mini-batch). The trainer
(`entropyrl.verl.trainer`) calls `account` on every batch the replay buffer hands it, training
and validation alike, with the failures the reward workers reported
(`entropyrl.verl.failures.reward_failures`):

- a token the CHAIR service refused stops the run, whatever the count: a setup error;
- a batch that received nothing stops the run (verl would fail later, in TransferQueue, without
  the cause);
- more lost samples than `algorithm.lost_samples.max_fraction` of the batch stops the run;
- fewer are logged (`rollout/lost_samples`, `rollout/expected_samples`; a line on the console
  with their cause) and the step trains on what arrived.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from entropyrl.verl.failures.reward_failures import AUTH, Failure

__all__ = ["LostSamples", "LostSamplesError", "account", "refused_token", "sessions_received"]

SETTING = "algorithm.lost_samples.max_fraction"
# Where verl's agent loop logs a failed session (the cause of losses no reward reported).
WORKER_LOG_HINT = "the agent-loop workers' log says why (lines 'Error in _run_prompt')"


class LostSamplesError(RuntimeError):
    """The run stopped because a batch lost samples (the message says which, how many, why)."""


def sessions_received(keys: Sequence[str]) -> int:
    """How many rollout sessions `keys` hold: verl names a trajectory `{uid}_{session}_{index}`
    (a multi-turn session may leave several), a session counts once."""
    return len({key.rsplit("_", 1)[0] if key.count("_") >= 2 else key for key in keys})


@dataclass(frozen=True)
class LostSamples:
    """The verdict on one batch: its metrics, a warning line or a stop line (at most one)."""

    expected: int
    received: int
    metrics: dict[str, float] = field(default_factory=dict)
    warning: str | None = None
    stop: str | None = None

    @property
    def lost(self) -> int:
        return max(self.expected - self.received, 0)


def _causes(failures: Sequence[tuple[Failure, int]]) -> str:
    if not failures:
        return f"no reward call reported a failure; {WORKER_LOG_HINT}"
    shown = "; ".join(f"{count}x {failure.line()}" for failure, count in failures[:3])
    more = len(failures) - 3
    return "reward calls failed: " + shown + (f"; and {more} other message(s)" if more > 0 else "")


def refused_token(where: str, failures: Sequence[tuple[Failure, int]]) -> str | None:
    """The stop line when a reported failure is a refused CHAIR token (a setup error that every
    further call would repeat), else None."""
    refused = [failure for failure, _ in failures if failure.kind == AUTH]
    return f"{where}: the reward stopped the run: {refused[0].line()}" if refused else None


def account(
    *,
    where: str,
    expected: int,
    received: int,
    failures: Sequence[tuple[Failure, int]],
    max_fraction: float,
) -> LostSamples:
    """Judge one batch. `where` names it in the lines ("step 3", "validation at step 0"),
    `expected` is prompts x samples per prompt, `received` the sessions that arrived,
    `failures` what the reward workers reported since the last batch (with counts)."""
    lost = max(expected - received, 0)
    allowed = math.floor(max_fraction * expected + 1e-9)
    metrics = {
        "rollout/expected_samples": float(expected),
        "rollout/lost_samples": float(lost),
        "rollout/reward_failures": float(sum(count for _, count in failures)),
    }
    stop = refused_token(where, failures)
    if stop is None and expected > 0 and received == 0:
        stop = f"{where}: every one of {expected} samples was lost; {_causes(failures)}"
    elif stop is None and lost > allowed:
        stop = (
            f"{where}: {lost} of {expected} samples lost, more than {SETTING}={max_fraction:g} "
            f"allows ({allowed}); {_causes(failures)}. Fix the cause, or raise the limit to "
            "train on the rest"
        )
    warning = None
    if stop is None and lost:
        warning = (
            f"{where}: {lost} of {expected} samples lost, going on with the {received} that "
            f"arrived ({SETTING}={max_fraction:g} allows {allowed}); {_causes(failures)}"
        )
    return LostSamples(expected, received, metrics, warning, stop)
