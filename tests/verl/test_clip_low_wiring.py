"""The clip-low schedule under verl: each sample's clip_low from its CHAIR_i reaches the actor's
loss beside `advantages`, the loss is installed for it, and a setting it would leave unread or
a trainer that would ignore it is refused in one line (`EXPERIMENT=clip_low`)."""

from __future__ import annotations

import pytest
import torch

import entropyrl.verl.plugin  # noqa: F401
from entropyrl.commands.launch.recipes import EXPERIMENTS
from entropyrl.core.clip_schedules import clip_low_bounds
from entropyrl.core.specs import ClipLowScheduleSpec
from entropyrl.verl import trainer as trainer_module
from entropyrl.verl.checks.validation import clip_schedule_problems, config_problems
from entropyrl.verl.loss import CLIP_FIELD, CLIP_LOW_FIELD, PerSampleClipPPOLoss

from .test_trainer_hook import CHAIR, FakeTransferQueue, Recorder, fill_store, make_trainer

CLIP_LOW = list(EXPERIMENTS["clip_low"])


@pytest.fixture(scope="module")
def tokenizer():
    from entropyrl.rig.tokenizer import build_qwen_tokenizer

    return build_qwen_tokenizer(num_ranks=8192)


def test_each_samples_clip_low_reaches_the_batch(monkeypatch, compose, tokenizer):
    store = FakeTransferQueue()
    meta = fill_store(store, tokenizer, entropy=False, chair=True)
    trainer = make_trainer(monkeypatch, compose, tokenizer, store, CLIP_LOW)
    metrics: dict = {}
    out = trainer._compute_advantage(meta, metrics)
    assert CLIP_LOW_FIELD in out.fields and CLIP_FIELD not in out.fields
    got = torch.stack([store.rows[k][CLIP_LOW_FIELD] for k in meta.keys])
    chair = torch.tensor([float("nan") if c is None else c for c in CHAIR])
    want = clip_low_bounds(chair, ClipLowScheduleSpec(enable=True, low=0.2, high=0.4))
    torch.testing.assert_close(got, want)
    assert got.tolist() == pytest.approx([0.2, 0.4, 0.2, 0.4, 0.2, 0.2])  # unscored: neutral
    assert metrics["clip/low_bound_mean"] == pytest.approx(float(want.mean()))
    assert metrics["clip/low_bound_max"] == pytest.approx(0.4)
    assert metrics["clip/low_bound_min"] == pytest.approx(0.2)
    # CHAIR's figures are logged with the clip schedule off too; its bounds are not
    assert metrics["chair/chair_i_mean"] == pytest.approx((0.0 + 0.4 + 0.25 + 0.0) / 4)
    assert metrics["chair/hallucinated_frac"] == pytest.approx(0.5)
    assert "clip/bound_mean" not in metrics


def test_both_schedules_write_both_bounds(monkeypatch, compose, tokenizer):
    store = FakeTransferQueue()
    meta = fill_store(store, tokenizer, entropy=False, chair=True)
    trainer = make_trainer(
        monkeypatch, compose, tokenizer, store, ["algorithm.clip_low_schedule.enable=true"]
    )
    out = trainer._compute_advantage(meta, {})
    assert {CLIP_FIELD, CLIP_LOW_FIELD} <= set(out.fields)


def test_the_loss_is_installed_for_the_clip_low_schedule_alone(compose):
    trainer = trainer_module.EntropyPPOTrainer.__new__(trainer_module.EntropyPPOTrainer)
    trainer.config = compose(
        "chair_mscoco", [*CLIP_LOW, "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla"]
    )
    trainer.global_steps = 0
    trainer.checkpoint_manager = Recorder()
    trainer.actor_rollout_wg = Recorder()
    trainer.on_init_end()
    installed = [fn for name, fn in trainer.actor_rollout_wg.calls if name == "set_loss_fn"]
    assert len(installed) == 1 and isinstance(installed[0], PerSampleClipPPOLoss)
    assert installed[0].actor_config.policy_loss.loss_mode == "per_sample_clip"


def test_a_loss_or_constant_the_clip_low_schedule_contradicts_is_refused(compose):
    gspo = compose(
        "chair_mscoco", [*CLIP_LOW, "actor_rollout_ref.actor.policy_loss.loss_mode=gspo"]
    )
    assert clip_schedule_problems(gspo) == [
        "algorithm.clip_low_schedule.enable=true trains with the per_sample_clip loss, which "
        "actor_rollout_ref.actor.policy_loss.loss_mode=gspo contradicts; drop the loss_mode "
        "override, or set algorithm.clip_low_schedule.enable=false"
    ]
    constant = compose("chair_mscoco", [*CLIP_LOW, "actor_rollout_ref.actor.clip_ratio_low=0.3"])
    assert clip_schedule_problems(constant) == [
        "actor_rollout_ref.actor.clip_ratio_low=0.3 is not read with "
        "algorithm.clip_low_schedule.enable=true: each sample's bound comes from the schedule "
        "(algorithm.clip_low_schedule.low=0.2 for a clean caption, high=0.4 for a hallucinating "
        "one); set those, or drop the clip_ratio_low override"
    ]
    # off, the constant is every sample's bound and is read
    assert (
        clip_schedule_problems(
            compose("chair_mscoco", ["actor_rollout_ref.actor.clip_ratio_low=0.3"])
        )
        == []
    )
    assert clip_schedule_problems(compose("chair_mscoco", CLIP_LOW)) == []
    trainer = trainer_module.EntropyPPOTrainer.__new__(trainer_module.EntropyPPOTrainer)
    trainer.config = constant
    trainer.global_steps = 0
    trainer.checkpoint_manager = Recorder()
    trainer.actor_rollout_wg = Recorder()
    with pytest.raises(
        ValueError, match=r"^actor_rollout_ref\.actor\.clip_ratio_low=0\.3 is not read"
    ):
        trainer.on_init_end()
    assert trainer.actor_rollout_wg.calls == []


def test_verls_own_trainer_refuses_the_clip_low_schedule(compose):
    plain = [
        "trainer.v1.trainer_mode=sync",
        "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla",
    ]
    config = compose("chair_mscoco", [*plain, *CLIP_LOW])
    problems = config_problems(config, use_reference_policy=True)
    assert [p for p in problems if "clip_low_schedule" in p] == [
        "algorithm.clip_low_schedule.enable=true needs the entropy-aware trainer "
        "(trainer.v1.trainer_mode=entropyrl): verl's own trainer never computes the per-sample "
        "bounds; set it, or algorithm.clip_low_schedule.enable=false"
    ]
