"""The smoke check fed recorded bad runs: real runs recorded under tests/rig/smoke/recorded
(`python -m entropyrl.rig.smoke.record`, entropyrl/rig/smoke/record.py says which runs), read
back and changed the way a fault would change them, must fail with a line naming what is wrong,
and pass unchanged. No test here starts Ray: the runs are files.

Faults, each as its run would record it: an estimator that fell back to GRPO (on every step,
on the first step only, and where some samples lacked entropy), a constant bound, a bound from
the wrong direction or the wrong rule, a rollout that kept its initial weights (full
fine-tuning and LoRA adapters) or loaded only part of a sync, a reward that lost its CIDEr-D part
or gained a CHAIR penalty the config does not ask for, a loss that read another sample's bound,
advantages or old log-probs or never got a sample (on one rank and on two), a sample lost without
being counted, a validation row taken for a training step, a step missing from the trace, logged
step metrics that do not summarise the step's samples; and runs the check cannot judge: groups
whose rewards were all equal, CHAIR_i that never crossed the threshold. The same faults planted
in the code of a real run (through a `sitecustomize` on PYTHONPATH, so every process of the run
has them) are listed with what the check said in docs/smoke.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from entropyrl.rig.smoke.check import (
    check_metrics,
    check_sample_counts,
    clip_rule,
    grpo_reference,
)
from entropyrl.rig.smoke.record import Recording, read_recording

RECORDINGS = Path(__file__).parent / "recorded"


def one(problems: list[str], needle: str) -> str:
    found = [line for line in problems if needle in line]
    assert found, problems
    return found[0]


def set_grpo_advantages(rows: list[dict[str, Any]], config: Any, steps=None) -> None:
    """What an estimator that fell back to GRPO writes: each sample's GRPO advantage."""
    by_step: dict[Any, list[dict[str, Any]]] = {}
    for row in rows:
        if steps is None or row["step"] in steps:
            by_step.setdefault((row["step"], row["run"]), []).append(row)
    norm = bool(config.algorithm.get("norm_adv_by_std_in_grpo", True))
    for step_rows in by_step.values():
        values = grpo_reference(
            [r["score"] for r in step_rows], [r["group"] for r in step_rows], norm
        )
        for row, value in zip(step_rows, values):
            row["advantages"] = [value] * len(row["advantages"])


# -- the caption recipe (grpo, the CHAIR clip schedule) -----------------------------------------


@pytest.fixture(scope="module")
def caption() -> Recording:
    return read_recording(RECORDINGS / "caption")


def test_the_recorded_caption_run_passes(caption):
    assert check_metrics(caption.metrics, caption.config) == []
    assert caption.trace_problems() == []


def test_a_constant_bound(caption):
    bad = caption.copy()
    for row in bad.driver + bad.workers:  # the constant bound, all the way to the loss
        row["clip_high"] = 0.3
    problems = bad.trace_problems()
    one(problems, "got bound 0.3, the step rule (hallucinated_high) gives 0.5")
    assert not [p for p in problems if "reached the loss" in p]  # it reached the loss as computed


def test_a_bound_in_the_wrong_direction(caption):
    bad = caption.copy()
    reversed_spec = dict(OmegaConf.to_container(bad.config.algorithm.clip_schedule))
    reversed_spec["direction"] = "hallucinated_low"
    for row in bad.driver:
        row["clip_high"] = clip_rule(row["chair_i"], reversed_spec)
    one(bad.trace_problems(), "the step rule (hallucinated_high) gives")


def test_a_bound_from_another_rule(caption):
    bad = caption.copy()
    bad.config.algorithm.clip_schedule.rule = "sigmoid"  # the run's bounds came from `step`
    one(bad.trace_problems(), "the sigmoid rule (hallucinated_high) gives")


def test_chair_that_never_crosses_the_threshold_cannot_be_judged(caption):
    """A run whose captions were all clean: a constant low bound is then what the rule gives,
    so the check cannot tell it from a constant bound and says so."""
    bad = caption.copy()
    for row in bad.driver:
        row["chair_i"], row["clip_high"] = 0.0, 0.3
    for row in bad.workers:
        row["clip_high"] = 0.3
    one(bad.trace_problems(), "could not judge the clip schedule")


def test_without_any_chair_score_only_the_documented_fallback_passes(caption):
    bad = caption.copy()
    for row in bad.driver:
        row["chair_i"], row["clip_high"] = None, 0.3
    for row in bad.workers:  # the neutral bound reaches the loss too
        row["clip_high"] = 0.3
    one(bad.trace_problems(), "could not judge the clip schedule: no sample got a CHAIR score")
    assert not [p for p in bad.trace_problems(chair_optional=True) if "clip" in p]


def test_a_reward_without_its_cider_part(caption):
    bad = caption.copy()
    for row in bad.real():
        row["score"] -= row["reward_parts"]["cider"]
    one(bad.trace_problems(), "a part of the reward is missing or extra")
    bad = caption.copy()
    del bad.real()[0]["reward_parts"]["cider"]
    one(bad.trace_problems(), "the caption reward reported no cider")


def test_a_reward_with_a_penalty_the_config_does_not_ask_for(caption):
    bad = caption.copy()
    for row in bad.real():
        row["score"] -= row["reward_parts"]["chair_i"] or 0.0
    one(bad.trace_problems(), "chair_weight 0.0): a part of the reward is missing or extra")


def test_wrong_advantages_on_the_first_step_only(caption):
    bad = caption.copy()
    for row in bad.real():
        if row["step"] == 1:
            row["advantages"] = [0.0] * len(row["advantages"])
    problems = bad.trace_problems()
    assert one(problems, "differ from grpo's formula").startswith("step 1:")
    assert not [p for p in problems if p.startswith(("step 2", "step 3"))]


def test_groups_with_equal_rewards_cannot_be_judged(caption):
    bad = caption.copy()
    for row in bad.driver:
        row["score"], row["advantages"] = 1.0, [0.0] * len(row["advantages"])
        if row["reward_parts"]:
            row["reward_parts"].update(cider=1.0, chair_ok=False)
    one(bad.trace_problems(), "could not judge the advantages")


def test_a_rollout_that_kept_its_initial_weights(caption):
    """Every generation names the weights it started with, while the actor sent new ones."""
    bad = caption.copy()
    first = {}
    for row in bad.rollouts:
        first.setdefault(row["replica"], row)
    for row in bad.rollouts:
        row["state"] = first[row["replica"]]["state"]
        row.pop("tensors", None)
    for row in first.values():
        row["tensors"] = next(r for r in caption.rollouts if r["state"] == row["state"])["tensors"]
    line = one(bad.trace_problems(), "with weights other than the actor's last sync")
    assert "kept older weights or ignored the sync" in line


def test_a_run_without_probe_rows_cannot_be_judged(caption):
    bad = caption.copy()
    bad.rollouts = []
    one(bad.trace_problems(), "could not judge the weight sync")


def test_a_loss_that_read_another_samples_bound(caption):
    """Two micro-batch rows with different bounds swap them: each sample reached the loss, each
    with a bound the schedule can give, but not its own. (The run holds both bounds: the check
    fails a run that does not.)"""
    bad = caption.copy()
    low = next(row for row in bad.workers if row["clip_high"] == pytest.approx(0.3))
    high = next(row for row in bad.workers if row["clip_high"] == pytest.approx(0.5))
    low["clip_high"], high["clip_high"] = high["clip_high"], low["clip_high"]
    line = one(bad.trace_problems(), "reached the loss with another clip_high")
    assert line.startswith(f"step {min(low['step'], high['step'])}, rank 0:") or line.startswith(
        f"step {max(low['step'], high['step'])}, rank 0:"
    )


def test_a_loss_that_read_another_samples_advantages(caption):
    bad = caption.copy()
    step = next(  # a step whose samples' advantages differ (the check fails a run with none)
        s
        for s in sorted({r["step"] for r in bad.workers})
        if len({json.dumps(r["advantages"]) for r in bad.workers if r["step"] == s}) > 1
    )
    rows = [row for row in bad.workers if row["step"] == step]
    moved = [row["advantages"] for row in rows]
    for row, values in zip(rows, moved[1:] + moved[:1]):  # shifted by one row
        row["advantages"] = values
    one(bad.trace_problems(), "reached the loss with another advantages")


def test_a_loss_that_read_another_samples_old_log_probs(caption):
    """The old log-probs of the step's rows shifted by one: each row keeps its own bound and
    advantages, so the old log-probs are what the check must name."""
    bad = caption.copy()
    rows = [row for row in bad.workers if row["step"] == 1]
    moved = [row["old_log_probs"] for row in rows]
    for row, values in zip(rows, moved[1:] + moved[:1]):
        row["old_log_probs"] = values
    line = one(bad.trace_problems(), "reached the loss with another old_log_probs")
    assert line.startswith("step 1, rank 0:")


def test_a_sync_the_rollout_loaded_in_part(caption):
    """After the first update the rollout generates with the sent weights minus three tensors it
    never loaded (a partial sync): those are absent from what it generated with."""
    bad = caption.copy()
    first = bad.rollouts[0]["state"]
    later = {row["state"] for row in bad.rollouts if row["state"] != first}
    assert later  # the actor's weights changed and the rollout generated after that
    for row in bad.rollouts:
        if row["state"] in later and "tensors" in row:
            for name in sorted(row["tensors"])[:3]:
                del row["tensors"][name]
    line = one(bad.trace_problems(), "with weights other than the actor's last sync")
    assert "tensors differ (3 absent)" in line


def test_a_sample_that_never_reached_the_loss(caption):
    bad = caption.copy()
    lost = bad.workers[0]["step"], bad.workers[0]["key"]
    bad.workers = [row for row in bad.workers if (row["step"], row["key"]) != lost]
    one(bad.trace_problems(), f"step {lost[0]}: 1 of 20 samples never reached the actor's loss")
    bad.workers = []
    one(bad.trace_problems(), "could not judge what reached the loss")


def test_a_sample_lost_in_silence(caption):
    """A session verl dropped (its reward raised) while the step's count says nothing was lost;
    and the other way round, a count of losses where every sample arrived; and no count."""
    assert check_sample_counts(caption.metrics, caption.driver, caption.config) == []
    bad = caption.copy()
    gone = next(row for row in bad.driver if row["step"] == 1 and not row["padding"])
    bad.driver.remove(gone)
    one(
        check_sample_counts(bad.metrics, bad.driver, bad.config),
        "step 1: 19 samples reached the advantages and 0 were counted lost, of 20 asked for: "
        "1 lost in silence",
    )
    bad = caption.copy()
    row = next(r for r in bad.metrics if r["step"] == 2 and "rollout/lost_samples" in r["data"])
    row["data"]["rollout/lost_samples"] = 1
    one(
        check_sample_counts(bad.metrics, bad.driver, bad.config),
        "step 2: 20 samples reached the advantages and 1 were counted lost, of 20 asked for: "
        "samples counted lost arrived",
    )
    del row["data"]["rollout/lost_samples"]
    one(check_sample_counts(bad.metrics, bad.driver, bad.config), "step 2: no count of its samples")


def test_a_validation_row_taken_for_a_training_step(caption):
    bad = caption.copy()
    step = bad.metrics[2]
    step["data"] = {k: v for k, v in step["data"].items() if k.startswith("val-")}
    problems = check_metrics(bad.metrics, bad.config)
    one(problems, "step 2: only validation metrics, no training metrics")
    one(problems, "expected one training row per step 1..3, got steps [1, 3]")


def test_a_step_missing_from_the_trace(caption):
    bad = caption.copy()
    bad.driver = [row for row in bad.driver if row["step"] != 2]
    one(bad.trace_problems(), "the trace holds training steps [1, 3], expected 1..3")


def test_a_missing_reward_part_in_the_metrics(caption):
    bad = caption.copy()
    for row in bad.metrics:
        row["data"].pop("reward/cider/mean", None)
    one(check_metrics(bad.metrics, bad.config), "reward/cider/mean is None, expected a number")


# -- the EGPO function-calling recipe -------------------------------------------------------------


@pytest.fixture(scope="module")
def fc() -> Recording:
    return read_recording(RECORDINGS / "egpo")


def test_the_recorded_egpo_run_passes(fc):
    assert check_metrics(fc.metrics, fc.config) == []
    assert fc.trace_problems() == []


def test_an_estimator_that_fell_back_to_grpo(fc):
    bad = fc.copy()
    set_grpo_advantages(bad.real(), bad.config)
    line = one(bad.trace_problems(), "differ from egpo's formula")
    assert line.endswith("they are plain GRPO's, the estimator's own term was not applied")


def test_an_estimator_that_fell_back_on_the_first_step_only(fc):
    bad = fc.copy()
    set_grpo_advantages(bad.real(), bad.config, steps={1})
    problems = bad.trace_problems()
    assert one(problems, "plain GRPO's").startswith("step 1:")
    assert not [p for p in problems if p.startswith("step 2")]


def test_a_fall_back_where_some_samples_lacked_entropy(fc):
    """Two samples without entropy: they keep GRPO's advantage, the others must not; the
    samples without entropy are named whatever the advantages say."""
    bad = fc.copy()
    rows = bad.real()
    for row in rows[:2]:
        row["entropy"] = None
    one(bad.trace_problems(), "2 of 16 samples reached the estimator without entropy")
    set_grpo_advantages(rows, bad.config)  # and the trainer gave every sample GRPO's advantage
    one(bad.trace_problems(), "plain GRPO's")


def test_a_fall_back_where_no_sample_had_entropy(fc):
    bad = fc.copy()
    for row in bad.real():
        row["entropy"] = None
    set_grpo_advantages(bad.real(), bad.config)
    problems = bad.trace_problems()
    one(problems, "16 of 16 samples reached the estimator without entropy")
    one(problems, "could not judge the advantages: no step's egpo advantages differed")
    for row in bad.metrics:
        if "egpo/entropy/missing" in row["data"]:
            row["data"]["egpo/entropy/missing"] = 16.0
    one(check_metrics(bad.metrics, bad.config), "16 samples reached the estimator without entropy")


# -- LoRA adapters and token-level shaping -------------------------------------------------------


@pytest.fixture(scope="module")
def lora() -> Recording:
    return read_recording(RECORDINGS / "lora")


def test_the_recorded_lora_entropy_adv_run_passes(lora):
    assert lora.trace_problems() == []


def test_a_rollout_that_kept_its_initial_adapters(lora):
    """The adapters of the first sync (LoRA's B at zero) stay in the rollout."""
    bad = lora.copy()
    states = {row["state"]: row["tensors"] for row in lora.rollouts if "tensors" in row}
    first = bad.rollouts[0]["state"]
    for row in bad.rollouts:
        row["state"] = first
        row.pop("tensors", None)
    bad.rollouts[0]["tensors"] = states[first]
    line = one(bad.trace_problems(), "with weights other than the actor's last sync")
    assert "lora_" in line


def test_token_shaping_that_fell_back_to_grpo(lora):
    bad = lora.copy()
    set_grpo_advantages(bad.real(), bad.config)
    one(bad.trace_problems(), "differ from entropy_adv's formula")
