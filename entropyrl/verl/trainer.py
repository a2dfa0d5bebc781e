"""`trainer.v1.trainer_mode=entropyrl`: verl's sync PPO trainer plus entropy and CHAIR plumbing.

Per step, around verl's own `_compute_advantage` (KL-in-reward, rollout correction and the
estimator call stay verl's):
- the per-token entropy of the old-policy pass (verl stores it as `entropy`) and its `<think>`
  segment reach our estimators through `entropyrl.verl.inputs.advantage_inputs`;
- each sample's CHAIR_i (reward extra info) becomes a per-sample `clip_ratio_high`, written next
  to `advantages` so every mini-batch and PPO epoch of the actor update carries it;
- `egpo/*`, `chair/*`, `clip/*` metrics are logged (`chair/*` and `clip/*` over real rows; the
  estimators' `egpo/entropy/missing` also counts verl's synthetic padding rows, which have no
  response tokens).
After init the actor workers get `PerSampleClipPPOLoss`, which hands that field to the
`per_sample_clip` policy loss and otherwise runs verl's `ppo_loss` unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import transfer_queue as tq
from tensordict import TensorDict
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from entropyrl.entropy import think_tag_ids
from entropyrl.specs import AlgorithmSpecs, algorithm_specs
from entropyrl.verl import trace
from entropyrl.verl.estimators import ESTIMATORS
from entropyrl.verl.hooks import (
    build_advantage_inputs,
    chair_from_extra_fields,
    chair_status_metrics,
    clip_ratio_high_from_chair,
)
from entropyrl.verl.inputs import advantage_inputs
from entropyrl.verl.loss import CLIP_FIELD, LOSS_NAME, PerSampleClipPPOLoss

TRAINER_MODE = "entropyrl"
# Where to write the fully resolved config this run trains with (a reproducibility record).
RESOLVED_CONFIG_ENV = "ENTROPYRL_RESOLVED_CONFIG"
_TENSOR_FIELDS = ("entropy", "old_log_probs", "ref_log_prob", "responses", "response_mask")


def _available(batch: Any, names: tuple[str, ...]) -> list[str]:
    fields = getattr(batch, "fields", None)
    return list(names) if fields is None else [name for name in names if name in fields]


def _padded(data: TensorDict, name: str) -> torch.Tensor | None:
    if name not in data:
        return None
    value = data[name]
    if getattr(value, "is_nested", False):
        value = value.to_padded_tensor(0)
    return value


def fetch_step_fields(batch: Any) -> tuple[dict[str, torch.Tensor | None], list[Any] | None]:
    """Padded [B, T] tensors (entropy, log-probs, responses, mask) and per-sample extra fields."""
    names = _available(batch, _TENSOR_FIELDS)
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=names)
    tensors = {name: _padded(data, name) for name in _TENSOR_FIELDS}
    extra = None
    if _available(batch, ("extra_fields",)):
        got = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"]
        )
        if "extra_fields" in got:
            extra = list(got["extra_fields"])
    return tensors, extra


def write_resolved_config(config: Any, path: Path) -> None:
    """The config as the trainer sees it (interpolations resolved), as YAML, written atomically."""
    from omegaconf import OmegaConf

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(OmegaConf.to_yaml(config, resolve=True))
    os.replace(partial, path)


@register_trainer(TRAINER_MODE)
class EntropyPPOTrainer(PPOTrainerSync):
    """verl's synchronous PPO trainer with entropy-aware advantages and per-sample clip-high."""

    _think_ids: tuple[list[int], list[int]] | None = None

    # verl keys its synchronous behaviour on the literal mode name "sync" (replay buffer, prompt
    # refill, TransferQueue checkpoints, `trainer.v1.<mode>.*` settings); any other name gets the
    # asynchronous ones. This trainer is the sync trainer plus a hook, so it reports "sync".
    @property
    def trainer_mode(self) -> str:
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:
        # verl's __init__ assigns the configured name (`entropyrl`); the behaviour stays sync.
        del value

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        # Misspelt or out-of-range algorithm settings stop the run here, before any worker.
        self._specs = algorithm_specs(config.algorithm)
        super().__init__(config, *args, **kwargs)
        path = os.environ.get(RESOLVED_CONFIG_ENV)
        if path:
            write_resolved_config(config, Path(path))

    @property
    def specs(self) -> AlgorithmSpecs:
        """The algorithm sections of this run's config (`entropyrl.specs`), parsed once."""
        specs = self.__dict__.get("_specs")
        if specs is None:
            specs = self._specs = algorithm_specs(self.config.algorithm)
        return specs

    def think_ids(self) -> tuple[list[int], list[int]]:
        if self._think_ids is None:
            self._think_ids = think_tag_ids(self.tokenizer)
        return self._think_ids

    def on_init_end(self) -> None:
        super().on_init_end()
        actor = self.config.actor_rollout_ref.actor
        loss_mode = actor.policy_loss.get("loss_mode", "vanilla")
        if self.specs.clip_schedule.enable and loss_mode != LOSS_NAME:
            raise ValueError(
                "algorithm.clip_schedule.enable=true needs "
                f"actor_rollout_ref.actor.policy_loss.loss_mode={LOSS_NAME} (got {loss_mode!r})"
            )
        if loss_mode == LOSS_NAME:
            from verl.trainer.distillation import is_distillation_enabled

            if is_distillation_enabled(self.config.get("distillation")):
                # The workers' distillation loss would be replaced by plain ppo_loss.
                raise ValueError(f"policy_loss.loss_mode={LOSS_NAME} does not support distillation")
            self.actor_rollout_wg.set_loss_fn(PerSampleClipPPOLoss(actor))

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        algorithm = self.config.algorithm
        wants_entropy = algorithm.adv_estimator in ESTIMATORS
        wants_clip = self.specs.clip_schedule.enable
        if not wants_entropy and not wants_clip:
            return super()._compute_advantage(batch, metrics)
        tensors, extra_fields = fetch_step_fields(batch)
        # verl's synthetic padding rows (tag is_padding) stay out of the CHAIR / clip metrics.
        valid = torch.tensor(
            [not tag.get("is_padding", False) for tag in batch.tags], dtype=torch.bool
        )
        if wants_entropy:
            inputs = build_advantage_inputs(
                response_mask=tensors["response_mask"],
                responses=tensors["responses"],
                entropy=tensors["entropy"],
                old_log_probs=tensors["old_log_probs"],
                ref_log_prob=tensors["ref_log_prob"],
                spec=self.specs.entropy,
                think_ids=self.think_ids(),
            )
            with advantage_inputs(inputs):
                batch = super()._compute_advantage(batch, metrics)
            metrics.update(inputs.metrics)
        else:
            batch = super()._compute_advantage(batch, metrics)
        chair_i = chair_from_extra_fields(extra_fields, len(batch))
        clip_high, clip_metrics = clip_ratio_high_from_chair(
            chair_i, self.specs.clip_schedule, valid
        )
        metrics.update(clip_metrics)
        metrics.update(chair_status_metrics(extra_fields, valid))
        if trace.trace_dir() is not None:
            self._trace(batch, tensors, clip_high, chair_i, valid)
        if clip_high is not None:
            batch = tq.kv_batch_put(
                keys=batch.keys,
                partition_id=batch.partition_id,
                fields=TensorDict({CLIP_FIELD: clip_high}, batch_size=len(batch)),
            )
        return batch

    def _trace(
        self,
        batch: Any,
        tensors: dict[str, torch.Tensor | None],
        clip_high: torch.Tensor | None,
        chair_i: torch.Tensor,
        valid: torch.Tensor,
    ) -> None:
        """Record what this step computed per sample (`entropyrl.verl.trace`)."""
        names = ["advantages", *_available(batch, ("index",))]
        got = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=names)
        index = got.get("index", None)
        rows = trace.driver_rows(
            tensors=tensors,
            advantages=_padded(got, "advantages"),
            prompt_ids=None if index is None else trace.row_values(index, len(batch)),
            clip_high=clip_high,
            chair_i=chair_i,
            valid=valid,
            seq_lens=[tag.get("seq_len") for tag in batch.tags],
            step=int(self.global_steps),
        )
        trace.write("driver", rows)
