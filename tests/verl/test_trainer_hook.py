"""The entropy-aware trainer's advantage/clip hook on hand-built batches.

The pure functions are tested directly; `EntropyPPOTrainer._compute_advantage` itself runs on an
in-memory stand-in for verl's TransferQueue (verl's parent method included), with entropy
present, entropy missing and CHAIR missing.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from tensordict import NonTensorData, NonTensorStack, TensorDict
from transfer_queue import KVBatchMeta

import entropyrl.verl.plugin  # noqa: F401
from entropyrl.core import advantages as core
from entropyrl.core.clip_schedules import clip_high_bounds
from entropyrl.core.entropy import think_tag_ids
from entropyrl.core.specs import AlgorithmSpecs, ClipScheduleSpec, EntropySpec, algorithm_specs
from entropyrl.verl import trainer as trainer_module
from entropyrl.verl.hooks import (
    build_step,
    chair_from_extra_fields,
    clip_high_from_chair,
)
from entropyrl.verl.loss import CLIP_FIELD


@pytest.fixture(scope="module")
def tokenizer():
    tokenizers = pytest.importorskip("entropyrl.rig.tokenizer")
    return tokenizers.build_qwen_tokenizer(num_ranks=8192)


class FakeTransferQueue:
    """Per-sample key/value store with TransferQueue's kv_batch_get / kv_batch_put surface."""

    def __init__(self) -> None:
        self.rows: dict[str, dict] = {}

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        names = select_fields or sorted({f for k in keys for f in self.rows[k]})
        out = {}
        for name in names:
            if not all(name in self.rows[k] for k in keys):
                continue  # absent fields are skipped, as verl expects for optional ones
            values = [self.rows[k][name] for k in keys]
            if isinstance(values[0], torch.Tensor) and values[0].dim() == 1:
                out[name] = torch.nested.as_nested_tensor(values, layout=torch.jagged)
            elif isinstance(values[0], torch.Tensor):
                out[name] = torch.stack(values)
            else:
                out[name] = NonTensorStack(*[NonTensorData(v) for v in values])
        return TensorDict(out, batch_size=len(keys))

    def kv_batch_put(self, keys, partition_id, fields):
        for name in fields.keys():  # noqa: SIM118 (iterating a TensorDict yields rows)
            value = fields[name]
            rows = value.unbind(0) if isinstance(value, torch.Tensor) else list(value)
            for key, row in zip(keys, rows):
                self.rows.setdefault(key, {})[name] = row
        return self.meta(keys, partition_id)

    def meta(self, keys, partition_id="train"):
        names = sorted({f for k in keys for f in self.rows[k]})
        return KVBatchMeta(
            keys=list(keys), tags=[{} for _ in keys], partition_id=partition_id, fields=names
        )


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


RESPONSES = [
    "<think>a cat</think> two dogs",
    "<think>hmm</think> a dog",
    "no tags at all here",
    "<think>x</think> a cat and a dog",
    "<think>one</think> bird",
    "<think>two</think> a bird on a tree",
]
SCORES = [1.0, 0.0, 0.5, 1.0, 0.0, 0.5]
UIDS = ["p1", "p1", "p1", "p2", "p2", "p2"]
CHAIR = [0.0, 0.4, None, 0.25, 0.0, float("nan")]


def fill_store(store: FakeTransferQueue, tokenizer, *, entropy: bool, chair: bool):
    keys = []
    for i, text in enumerate(RESPONSES):
        ids = torch.tensor(encode(tokenizer, text))
        n = ids.shape[0]
        key = f"{UIDS[i]}_{i}_0"
        keys.append(key)
        rm = torch.zeros(n)
        rm[-1] = SCORES[i]
        info = {"score": SCORES[i]}
        if chair and CHAIR[i] is not None:
            info.update({"chair_i": CHAIR[i], "chair_fallback": math.isnan(CHAIR[i])})
        row = {
            "uid": UIDS[i],
            "responses": ids,
            "response_mask": torch.ones(n, dtype=torch.int64),
            "rm_scores": rm,
            "old_log_probs": -torch.linspace(0.1, 1.0, n),
            "extra_fields": {"reward_extra_info": info},
        }
        if entropy:
            row["entropy"] = torch.linspace(0.5, 2.0, n) + i / 10
        store.rows[key] = row
    return store.meta(keys)


def make_trainer(monkeypatch, compose, tokenizer, store, overrides):
    from verl.trainer.ppo.utils import need_reference_policy
    from verl.trainer.ppo.v1 import trainer_base

    from entropyrl.verl import transfer

    monkeypatch.setattr(trainer_base, "tq", store)
    monkeypatch.setattr(transfer, "tq", store)
    trainer = trainer_module.EntropyPPOTrainer.__new__(trainer_module.EntropyPPOTrainer)
    if not any("chair_fallback" in o for o in overrides):
        # the fixture's batch has one caption the service did not answer of five that report
        # CHAIR: past the recipe's limit, whose own tests (test_chair_fallback.py) set it
        overrides = [*overrides, "algorithm.chair_fallback.max_fraction=0.5"]
    trainer.config = compose("chair_mscoco", overrides)
    trainer.tokenizer = tokenizer
    # what verl's trainer __init__ sets, by verl's own rule
    trainer.use_reference_policy = need_reference_policy(trainer.config)
    trainer.global_steps = 1
    return trainer


def padded(store, meta, name):
    return store.kv_batch_get(meta.keys, meta.partition_id, [name])[name].to_padded_tensor(0.0)


def expected_answer_entropy(tokenizer, store, meta):
    """H_i over the tokens after `</think>` (whole response when the tag is missing)."""
    close = encode(tokenizer, "</think>")
    values = []
    for key in meta.keys:
        ids = store.rows[key]["responses"].tolist()
        ent = store.rows[key]["entropy"]
        start = 0
        for t in range(len(ids) - len(close) + 1):
            if ids[t : t + len(close)] == close:
                start = t + len(close)
        values.append(float(ent[start:].mean()))
    return torch.tensor(values)


def test_hook_with_entropy_and_chair(monkeypatch, compose, tokenizer):
    store = FakeTransferQueue()
    meta = fill_store(store, tokenizer, entropy=True, chair=True)
    trainer = make_trainer(
        monkeypatch,
        compose,
        tokenizer,
        store,
        ["algorithm.adv_estimator=egpo", "algorithm.entropy.mode=answer"],
    )
    metrics: dict = {}
    out = trainer._compute_advantage(meta, metrics)
    assert CLIP_FIELD in out.fields and "advantages" in out.fields

    adv = padded(store, out, "advantages")
    mask = padded(store, out, "response_mask")
    entropy = expected_answer_entropy(tokenizer, store, meta)
    expected, _ = core.egpo_bonus_advantage(
        torch.tensor(SCORES), entropy, torch.tensor([0, 0, 0, 1, 1, 1]), lam=0.4, alpha=2.0
    )
    torch.testing.assert_close(adv, expected.unsqueeze(-1) * mask)

    clip = torch.stack([store.rows[k][CLIP_FIELD] for k in meta.keys])
    chair = torch.tensor([float("nan") if c is None else c for c in CHAIR])
    torch.testing.assert_close(clip, clip_high_bounds(chair, ClipScheduleSpec(low=0.3, high=0.5)))
    assert clip.tolist() == pytest.approx([0.3, 0.5, 0.3, 0.5, 0.3, 0.3])
    assert metrics["chair/unavailable"] == 2
    assert metrics["egpo/segment/fallback"] == 1  # the response without tags
    assert metrics["egpo/entropy/missing"] == 0
    assert "clip/bound_mean" in metrics and "clip/high_mean" not in metrics


def test_hook_without_entropy_falls_back_to_grpo(monkeypatch, compose, tokenizer):
    store = FakeTransferQueue()
    meta = fill_store(store, tokenizer, entropy=False, chair=True)
    trainer = make_trainer(
        monkeypatch, compose, tokenizer, store, ["algorithm.adv_estimator=egpo_ratio"]
    )
    metrics: dict = {}
    out = trainer._compute_advantage(meta, metrics)
    adv = padded(store, out, "advantages")
    mask = padded(store, out, "response_mask")
    grpo = core.grpo_advantage(torch.tensor(SCORES), torch.tensor([0, 0, 0, 1, 1, 1]))
    torch.testing.assert_close(adv, grpo.unsqueeze(-1) * mask)
    assert metrics["egpo/entropy/missing"] == len(RESPONSES)


def test_hook_without_chair_uses_neutral_bound(monkeypatch, compose, tokenizer):
    store = FakeTransferQueue()
    meta = fill_store(store, tokenizer, entropy=True, chair=False)
    trainer = make_trainer(monkeypatch, compose, tokenizer, store, [])  # grpo + clip schedule
    metrics: dict = {}
    out = trainer._compute_advantage(meta, metrics)
    clip = torch.stack([store.rows[k][CLIP_FIELD] for k in out.keys])
    assert clip.tolist() == pytest.approx([0.3] * len(RESPONSES))
    assert metrics["chair/unavailable"] == len(RESPONSES)
    assert metrics["chair/unavailable_frac"] == 1.0
    assert not any(key.startswith("egpo/") for key in metrics)


def test_hook_is_verl_when_nothing_is_ours(monkeypatch, compose, tokenizer):
    store = FakeTransferQueue()
    meta = fill_store(store, tokenizer, entropy=True, chair=True)
    overrides = [
        "algorithm.clip_schedule.enable=false",
        "reward.custom_reward_function.name=compute_score",  # not the caption reward
    ]
    trainer = make_trainer(monkeypatch, compose, tokenizer, store, overrides)
    metrics: dict = {}
    out = trainer._compute_advantage(meta, metrics)
    assert CLIP_FIELD not in out.fields
    assert metrics == {}


def test_build_inputs_segments_and_sources():
    responses = torch.tensor([[7, 1, 2, 8, 3, 0], [1, 2, 3, 4, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]])
    old = -torch.arange(12, dtype=torch.float32).reshape(2, 6) / 10
    specs = AlgorithmSpecs(entropy=EntropySpec(mode="thinking", source="nll"))
    step, metrics = build_step(
        specs=specs,
        estimator="egpo",
        response_mask=mask,
        responses=responses,
        entropy=None,
        old_log_probs=old,
        ref_log_prob=-old,
        think_ids=([7], [8]),
    )
    torch.testing.assert_close(step.token_entropy, -old)
    assert step.segment_mask[0].tolist() == [False, True, True, False, False, False]
    assert step.segment_mask[1].tolist() == [True, True, True, True, False, False]  # fallback
    assert metrics == {"egpo/segment/fallback": 1}
    assert step.specs is specs and step.ref_log_prob is None  # egpo does not read the reference
    # What goes in follows the estimator's declaration: maxent_grpo reads the reference only.
    step, metrics = build_step(
        specs=specs,
        estimator="maxent_grpo",
        response_mask=mask,
        responses=responses,
        entropy=None,
        old_log_probs=old,
        ref_log_prob=-old,
        think_ids=None,
    )
    assert step.token_entropy is None and metrics == {}
    torch.testing.assert_close(step.ref_log_prob, -old)
    with pytest.raises(ValueError, match=r"entropy\.source"):
        algorithm_specs({"entropy": {"source": "logprob"}})


def test_chair_from_extra_fields_shapes():
    rows = [
        NonTensorData({"reward_extra_info": {"chair_i": 0.2, "chair_fallback": False}}),
        {"reward_extra_info": {"chair_i": float("nan"), "chair_fallback": True}},
        {"reward_extra_info": {"chair_i": "bad"}},
        {},
        None,
        {"reward_extra_info": {"chair_i": np.float32(0.0)}},
    ]
    values = chair_from_extra_fields(rows, len(rows))
    assert values[0].item() == pytest.approx(0.2)
    assert torch.isnan(values[1:5]).all()
    assert values[5].item() == 0.0
    assert torch.isnan(chair_from_extra_fields(None, 3)).all()
    with pytest.raises(ValueError, match="extra_fields"):
        chair_from_extra_fields(rows, 2)


def test_clip_schedule_disabled_and_configured():
    off = ClipScheduleSpec(enable=False)
    assert clip_high_from_chair(torch.tensor([0.0]), off) == (None, {})
    flipped = ClipScheduleSpec.from_mapping(
        OmegaConf.create({"enable": True, "direction": "hallucinated_low", "low": 0.2, "high": 0.4})
    )
    clip, metrics = clip_high_from_chair(torch.tensor([0.0, 0.5, float("nan")]), flipped)
    expected = clip_high_bounds(
        torch.tensor([0.0, 0.5, float("nan")]),
        ClipScheduleSpec(low=0.2, high=0.4, direction="hallucinated_low"),
    )
    torch.testing.assert_close(clip, expected)
    assert metrics["chair/unavailable"] == 1
    assert metrics["chair/chair_i_mean"] == pytest.approx(0.25)


def test_think_tag_ids(tokenizer):
    open_ids, close_ids = think_tag_ids(tokenizer)
    assert tokenizer.decode(open_ids) == "<think>"
    assert tokenizer.decode(close_ids) == "</think>"


def test_padding_rows_are_left_out_of_the_metrics(monkeypatch, compose, tokenizer):
    store = FakeTransferQueue()
    meta = fill_store(store, tokenizer, entropy=True, chair=False)
    meta = KVBatchMeta(
        keys=meta.keys,
        tags=[{"is_padding": i == len(meta.keys) - 1} for i in range(len(meta.keys))],
        partition_id=meta.partition_id,
        fields=meta.fields,
    )
    trainer = make_trainer(monkeypatch, compose, tokenizer, store, [])
    metrics: dict = {}
    trainer._compute_advantage(meta, metrics)
    assert metrics["chair/unavailable"] == len(RESPONSES) - 1


class Recorder:
    def __init__(self) -> None:
        self.calls: list = []

    def update_weights(self, step):
        self.calls.append(("update_weights", step))

    def set_loss_fn(self, fn):
        self.calls.append(("set_loss_fn", fn))


@pytest.mark.parametrize(
    ("overrides", "installs"),
    [
        ([], True),
        (["algorithm.clip_schedule.enable=false"], True),
        # the schedule is the one switch: verl's default loss_mode runs the per-sample loss
        (["actor_rollout_ref.actor.policy_loss.loss_mode=vanilla"], True),
        (
            [
                "algorithm.clip_schedule.enable=false",
                "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla",
            ],
            False,
        ),
    ],
)
def test_init_end_installs_the_loss_on_the_workers(compose, overrides, installs):
    from entropyrl.verl.loss import PerSampleClipPPOLoss

    trainer = trainer_module.EntropyPPOTrainer.__new__(trainer_module.EntropyPPOTrainer)
    if not any("chair_fallback" in o for o in overrides):
        # the fixture's batch has one caption the service did not answer of five that report
        # CHAIR: past the recipe's limit, whose own tests (test_chair_fallback.py) set it
        overrides = [*overrides, "algorithm.chair_fallback.max_fraction=0.5"]
    trainer.config = compose("chair_mscoco", overrides)
    trainer.global_steps = 0
    trainer.checkpoint_manager = Recorder()
    trainer.actor_rollout_wg = Recorder()
    trainer.on_init_end()
    assert trainer.checkpoint_manager.calls == [("update_weights", 0)]  # verl's sync behaviour kept
    installed = [fn for name, fn in trainer.actor_rollout_wg.calls if name == "set_loss_fn"]
    assert len(installed) == int(installs)
    if installs:
        assert isinstance(installed[0], PerSampleClipPPOLoss)
        actor = installed[0].actor_config
        assert actor.policy_loss.loss_mode == "per_sample_clip"
        assert actor.clip_ratio_high == trainer.config.algorithm.clip_schedule.low  # resolved
        assert installed[0].config().policy_loss.loss_mode == "per_sample_clip"  # as the worker


def test_init_end_rejects_a_loss_that_contradicts_the_schedule(compose):
    trainer = trainer_module.EntropyPPOTrainer.__new__(trainer_module.EntropyPPOTrainer)
    trainer.config = compose("chair_mscoco", ["actor_rollout_ref.actor.policy_loss.loss_mode=gspo"])
    trainer.global_steps = 0
    trainer.checkpoint_manager = Recorder()
    trainer.actor_rollout_wg = Recorder()
    with pytest.raises(ValueError, match="loss_mode=gspo contradicts;") as error:
        trainer.on_init_end()
    assert "\n" not in str(error.value)  # one line
    assert trainer.actor_rollout_wg.calls == []


def test_the_config_check_refuses_a_loss_that_contradicts_the_schedule(compose):
    from entropyrl.verl.checks.validation import clip_schedule_problems

    overrides = ["actor_rollout_ref.actor.policy_loss.loss_mode=gspo"]
    problems = clip_schedule_problems(compose("chair_mscoco", overrides))
    assert len(problems) == 1 and "loss_mode=gspo contradicts;" in problems[0]
    off = compose("chair_mscoco", [*overrides, "algorithm.clip_schedule.enable=false"])
    assert clip_schedule_problems(off) == []
    assert clip_schedule_problems(compose("chair_mscoco")) == []


def test_a_constant_bound_the_schedule_would_not_read_is_refused(compose):
    """With the schedule on, actor.clip_ratio_high other than the schedule's low (the recipe's
    interpolation) or verl's default is a bound the user expects to act: one line."""
    from entropyrl.verl.checks.validation import (
        clip_schedule_problems,
        verl_clip_ratio_high_default,
    )

    overrides = ["actor_rollout_ref.actor.clip_ratio_high=0.4"]
    problems = clip_schedule_problems(compose("chair_mscoco", overrides))
    assert problems == [
        "actor_rollout_ref.actor.clip_ratio_high=0.4 is not read with "
        "algorithm.clip_schedule.enable=true: each sample's bound comes from the schedule "
        "(algorithm.clip_schedule.low=0.3 for a clean caption, high=0.5 for a hallucinating "
        "one); set those, or drop the clip_ratio_high override"
    ]
    # the schedule off reads it; verl's own default and the schedule's low are what a config
    # holds without the user naming a bound
    assert (
        clip_schedule_problems(
            compose("chair_mscoco", [*overrides, "algorithm.clip_schedule.enable=false"])
        )
        == []
    )
    import dataclasses

    from verl.workers.config.actor import ActorConfig

    default = verl_clip_ratio_high_default()  # read from verl's YAML, equal to its dataclass's
    assert default == next(
        f.default for f in dataclasses.fields(ActorConfig) if f.name == "clip_ratio_high"
    )
    assert (
        clip_schedule_problems(
            compose("chair_mscoco", [f"actor_rollout_ref.actor.clip_ratio_high={default}"])
        )
        == []
    )
    moved = ["algorithm.clip_schedule.low=0.25"]  # the interpolation follows the schedule
    assert clip_schedule_problems(compose("chair_mscoco", moved)) == []
    # the trainer refuses it too (a run started without Hydra's command line)
    trainer = trainer_module.EntropyPPOTrainer.__new__(trainer_module.EntropyPPOTrainer)
    if not any("chair_fallback" in o for o in overrides):
        # the fixture's batch has one caption the service did not answer of five that report
        # CHAIR: past the recipe's limit, whose own tests (test_chair_fallback.py) set it
        overrides = [*overrides, "algorithm.chair_fallback.max_fraction=0.5"]
    trainer.config = compose("chair_mscoco", overrides)
    trainer.global_steps = 0
    trainer.checkpoint_manager = Recorder()
    trainer.actor_rollout_wg = Recorder()
    with pytest.raises(ValueError, match=r"clip_ratio_high=0\.4 is not read"):
        trainer.on_init_end()
    assert trainer.actor_rollout_wg.calls == []


def test_verls_own_trainer_refuses_the_schedule_it_would_ignore(compose):
    """A run of verl's trainer that switches our schedule on uses a part of the plugin (the key
    is ours): refused in one line. With the schedule off it is verl's run alone."""
    from entropyrl.verl.checks.validation import config_problems, uses_entropyrl

    plain = ["trainer.v1.trainer_mode=sync", "algorithm.adv_estimator=grpo",
             "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla"]  # fmt: skip
    config = compose("chair_mscoco", plain)
    assert uses_entropyrl(config)
    problems = config_problems(config, use_reference_policy=True)
    assert [p for p in problems if "clip_schedule" in p] == [
        "algorithm.clip_schedule.enable=true needs the entropy-aware trainer "
        "(trainer.v1.trainer_mode=entropyrl): verl's own trainer never computes the per-sample "
        "bounds; set it, or algorithm.clip_schedule.enable=false"
    ]
    off = compose("chair_mscoco", [*plain, "algorithm.clip_schedule.enable=false"])
    assert not uses_entropyrl(off)


def test_reward_parts_are_means_over_the_rows_that_report_them():
    from entropyrl.verl.hooks import reward_part_metrics

    def row(**info):
        return {"reward_extra_info": info}

    fields = [
        row(cider=1.0, chair_s=1.0, recall=0.5),
        row(cider=0.5, chair_s=float("nan"), recall=float("nan")),  # CHAIR did not score it
        row(cider=3.0, chair_s=0.0, recall=1.0),
        row(cider=9.0, chair_s=1.0, recall=0.0),  # a padding row
        row(score=1.0),  # another reward's row: no parts
    ]
    valid = torch.tensor([True, True, True, False, True])
    metrics = reward_part_metrics(fields, valid)
    assert metrics == pytest.approx(
        {"reward/cider/mean": 1.5, "reward/chair_s/mean": 0.5, "reward/recall/mean": 0.75}
    )
    assert reward_part_metrics([row(score=1.0)] * 3) == {}
    assert reward_part_metrics(None) == {}
    # numpy scalars (a reward computing with numpy) count like floats
    numpy_rows = [row(cider=np.float64(2.0)), row(cider=np.float32(4.0))]
    assert reward_part_metrics(numpy_rows) == {"reward/cider/mean": 3.0}


def test_caption_reward_parts_are_logged_under_plain_grpo(monkeypatch, compose, tokenizer):
    """GRPO without the schedule (the baseline run) still logs the caption reward's parts."""
    store = FakeTransferQueue()
    meta = fill_store(store, tokenizer, entropy=False, chair=True)
    for i, key in enumerate(meta.keys):
        store.rows[key]["extra_fields"]["reward_extra_info"]["cider"] = float(i)
    trainer = make_trainer(
        monkeypatch, compose, tokenizer, store, ["algorithm.clip_schedule.enable=false"]
    )
    metrics: dict = {}
    out = trainer._compute_advantage(meta, metrics)
    assert metrics["reward/cider/mean"] == pytest.approx(2.5)
    assert CLIP_FIELD not in out.fields
    assert all("advantages" in store.rows[key] for key in meta.keys)
