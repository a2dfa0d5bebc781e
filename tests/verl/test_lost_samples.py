"""Samples a batch lost: the verdict (entropyrl.verl.failures.lost_samples) against its rules written out,
and the reward entry points that report their failures (entropyrl.verl.failures.reward_failures)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from entropyrl.core.specs import LostSamplesSpec, SpecError, algorithm_specs
from entropyrl.rewards.chair_client import ChairAuthError
from entropyrl.verl import rewards
from entropyrl.verl.failures import reward_failures
from entropyrl.verl.failures.lost_samples import SETTING, account, sessions_received
from entropyrl.verl.failures.reward_failures import AUTH, ERROR, Failure

BROKEN_ROW = (Failure(ERROR, "ValueError: ground_truth is not JSON", "10.0.0.2"), 1)
REFUSED = (
    Failure(AUTH, "ChairAuthError: the CHAIR service at http://h:1 refused this client's token"),
    3,
)


def test_a_session_counts_once_whatever_its_outputs() -> None:
    keys = ["a1b2-c3_0_0", "a1b2-c3_0_1", "a1b2-c3_1_0", "d4e5_0_0"]  # {uid}_{session}_{index}
    assert sessions_received(keys) == 3
    assert sessions_received([]) == 0


def test_a_full_batch_says_nothing() -> None:
    verdict = account(where="step 1", expected=20, received=20, failures=[], max_fraction=0.01)
    assert (verdict.stop, verdict.warning) == (None, None)
    assert verdict.metrics == {
        "rollout/expected_samples": 20.0,
        "rollout/lost_samples": 0.0,
        "rollout/reward_failures": 0.0,
    }


def test_a_loss_within_the_limit_is_counted_and_said_with_its_cause() -> None:
    verdict = account(
        where="step 7", expected=2560, received=2559, failures=[BROKEN_ROW], max_fraction=0.01
    )
    assert verdict.stop is None
    assert verdict.warning.startswith("step 7: 1 of 2560 samples lost, going on with the 2559")
    assert "allows 25" in verdict.warning
    assert "1x ValueError: ground_truth is not JSON (node 10.0.0.2)" in verdict.warning
    assert verdict.metrics["rollout/lost_samples"] == 1.0
    assert verdict.metrics["rollout/reward_failures"] == 1.0


def test_a_loss_past_the_limit_stops_the_run_naming_the_setting() -> None:
    verdict = account(where="step 2", expected=20, received=19, failures=[], max_fraction=0.01)
    assert verdict.warning is None
    assert verdict.stop.startswith("step 2: 1 of 20 samples lost, more than")
    assert f"{SETTING}=0.01 allows (0)" in verdict.stop
    assert "no reward call reported a failure" in verdict.stop  # then the workers' log says why


def test_a_refused_token_stops_the_run_whatever_the_count() -> None:
    verdict = account(
        where="validation at step 0", expected=4, received=4, failures=[REFUSED], max_fraction=1.0
    )
    assert verdict.stop == (
        "validation at step 0: the reward stopped the run: ChairAuthError: the CHAIR service at "
        "http://h:1 refused this client's token"
    )


def test_a_batch_that_received_nothing_stops_the_run_even_without_a_limit() -> None:
    verdict = account(where="step 1", expected=8, received=0, failures=[], max_fraction=1.0)
    assert verdict.stop.startswith("step 1: every one of 8 samples was lost")


@given(
    expected=st.integers(1, 5000),
    lost_share=st.floats(0, 1),
    max_fraction=st.floats(0, 1),
)
def test_the_verdict_follows_its_rule(expected: int, lost_share: float, max_fraction: float):
    lost = round(lost_share * expected)
    verdict = account(
        where="step 1",
        expected=expected,
        received=expected - lost,
        failures=[],
        max_fraction=max_fraction,
    )
    # the rule written out: stop when nothing arrived, or when lost / expected > max_fraction
    # (up to float rounding of max_fraction x expected)
    allowed = math.floor(max_fraction * expected + 1e-9)
    assert (verdict.stop is not None) == (lost == expected or lost > allowed)
    assert (verdict.warning is not None) == (verdict.stop is None and lost > 0)
    assert verdict.lost == lost


def test_the_limit_is_a_spec_section_checked_at_start() -> None:
    assert algorithm_specs({}).lost_samples == LostSamplesSpec(max_fraction=0.01)
    assert algorithm_specs({"lost_samples": {"max_fraction": 0.2}}).lost_samples.max_fraction == 0.2
    with pytest.raises(SpecError, match=r"algorithm\.lost_samples\.max_fraction: must be in"):
        algorithm_specs({"lost_samples": {"max_fraction": 1.5}})
    with pytest.raises(SpecError, match=r"unknown key 'max_lost'; accepted: max_fraction"):
        algorithm_specs({"lost_samples": {"max_lost": 3}})


def test_the_reward_entry_points_stay_what_verl_loads() -> None:
    # verl awaits a coroutine function and runs a plain one in an executor: each keeps its kind
    assert inspect.iscoroutinefunction(rewards.caption_score)
    assert not inspect.iscoroutinefunction(rewards.function_calling_score)
    assert rewards.caption_score.__name__ == "caption_score"


def test_a_failing_reward_call_raises_its_own_error_after_reporting_it(caplog, monkeypatch) -> None:
    # a process logs each failure message once: start from none seen, as a fresh worker does
    monkeypatch.setattr(reward_failures, "_logged", set())
    caplog.set_level(logging.ERROR, logger="entropyrl.verl.failures.reward_failures")
    call = rewards.caption_score("coco", "a dog", "{not json", {}, cider_df="unused.json.gz")
    with pytest.raises(ValueError, match="ground_truth is not JSON"):
        asyncio.run(call)
    with pytest.raises(ValueError, match="ground_truth must be a list of calls"):
        rewards.function_calling_score("fc", "<tool_call>", object(), {})
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith("reward call failed: ValueError: ground_truth is not JSON")
    assert messages[1].startswith("reward call failed: ValueError: ground_truth must be a list")
    # outside Ray there is no book to write to and nothing to drain
    assert reward_failures.drain() == []


def test_a_refused_token_is_its_own_kind() -> None:
    assert reward_failures.kind_of(ChairAuthError("refused")) == AUTH
    assert reward_failures.kind_of(ValueError("broken row")) == ERROR
    assert reward_failures.describe(ValueError("first\nsecond")) == "ValueError: first"
    assert reward_failures.describe(KeyError()) == "KeyError"


def test_the_book_counts_repeats_and_keeps_few_examples() -> None:
    book = reward_failures._Book()
    for _ in range(3):
        book.record(AUTH, "refused", "n1")
    for i in range(30):
        book.record(ERROR, f"broken row {i}", "n1")
    entries = book.drain()
    assert entries[0] == (AUTH, "refused", "n1", 3)
    errors = [e for e in entries if e[0] == ERROR]
    assert len(errors) == reward_failures._EXAMPLES_KEPT + 1
    assert errors[-1] == (ERROR, reward_failures.OTHER_MESSAGES, "", 10)  # counted, not kept
    assert book.drain() == []


def test_the_smoke_shows_the_stop_line_last_without_rays_prefix() -> None:
    from entropyrl.rig.smoke.run import stop_lines

    log = [
        "\x1b[36m(TaskRunnerV1 pid=25763)\x1b[0m entropyrl: warning: step 1: 1 of 20 samples lost",
        "\x1b[36m(TaskRunnerV1 pid=25763)\x1b[0m entropyrl: step 2: 3 of 20 samples lost, more",
        "\x1b[36m(AgentLoopWorkerTQ pid=26063)\x1b[0m Traceback (most recent call last):",
        "entropyrl.verl.failures.lost_samples.LostSamplesError: step 2: 3 of 20 samples lost, more",
    ]
    assert stop_lines(log) == ["entropyrl: step 2: 3 of 20 samples lost, more"]
