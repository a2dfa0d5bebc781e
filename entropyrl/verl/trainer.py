"""`trainer.v1.trainer_mode=entropyrl`: verl's sync PPO trainer plus entropy and CHAIR plumbing.

Per step, around verl's own `_compute_advantage` (KL-in-reward, rollout correction and the
estimator call stay verl's):
- one step context (`entropyrl.verl.inputs.Step`) carries the run's parsed algorithm sections,
  what the estimator declares it reads (the per-token entropy of the old-policy pass, which verl
  stores as `entropy`, and its `<think>` segment; the reference log-probs) and the step's clip
  bounds into verl's estimator call; the estimator's metrics come back from `with_step`;
- each sample's CHAIR_i (reward extra info) becomes a per-sample `clip_high`, written next
  to `advantages` so every mini-batch and PPO epoch of the actor update carries it;
- `egpo/*`, `chair/*`, `clip/*` metrics are logged (`chair/*` and `clip/*` over real rows; the
  estimators' `egpo/entropy/missing` also counts verl's synthetic padding rows, which have no
  response tokens).
After init the actor workers get `PerSampleClipPPOLoss`, which hands that field to the
`per_sample_clip` policy loss and otherwise runs verl's `ppo_loss` unchanged: whenever the
schedule is on (`algorithm.clip_schedule.enable`, the one switch; `policy_loss.loss_mode` may
stay verl's default) or the config names that loss.

Around the replay buffer: every batch it hands over, training and validation, is counted against
what was asked for (`entropyrl.verl.lost_samples`): samples lost to failed sessions are logged
(`rollout/lost_samples`) with the causes the reward workers reported
(`entropyrl.verl.reward_failures`), and past `algorithm.lost_samples.max_fraction`, on a refused
CHAIR token, or when nothing arrived, the run stops with one line saying why.

Around verl's checkpoints and validation:
- every checkpoint gets the run's settings beside it (`entropyrl.verl.checks.checkpoints`), which the
  plugin compares before Ray starts so that `resume_mode: auto` continues only the same run; a
  run resumed at or past its last step says there is nothing left to do; the file logger writes
  `metrics.jsonl` in the checkpoint folder unless `VERL_FILE_LOGGER_PATH` says otherwise, and a
  resumed run's keeps the rows of the steps before its checkpoint (verl's opens the file afresh);
- validation means of CHAIR scores (`chair_i`, `chair_s`, `recall`) are over the captions the
  service scored, with the count of unscored ones beside them (`val-aux/<source>/chair_unscored`):
  verl averages with `np.mean`, where one unscored caption (NaN) made the mean NaN.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import transfer_queue as tq
from tensordict import TensorDict
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from entropyrl.core.entropy import think_tag_ids
from entropyrl.core.estimator_names import ESTIMATOR_NEEDS, VERL_ESTIMATORS, VERL_TRAINER_MODE
from entropyrl.core.specs import AlgorithmSpecs, algorithm_specs
from entropyrl.verl import reward_failures
from entropyrl.verl.checks import checkpoints
from entropyrl.verl.checks.validation import schedule_bound_problem, schedule_loss_problem
from entropyrl.verl.hooks import (
    build_step,
    chair_from_extra_fields,
    chair_status_metrics,
    clip_high_from_chair,
    reward_infos,
    reward_part_metrics,
)
from entropyrl.verl.inputs import with_step
from entropyrl.verl.loss import CLIP_FIELD, LOSS_NAME, PerSampleClipPPOLoss
from entropyrl.verl.lost_samples import (
    LostSamplesError,
    account,
    refused_token,
    sessions_received,
)
from entropyrl.verl.recorder import recorder
from entropyrl.verl.rewards import CAPTION_REWARD_NAME
from entropyrl.verl.tensors import padded

TRAINER_MODE = VERL_TRAINER_MODE
# Where to write the fully resolved config this run trains with (a reproducibility record).
RESOLVED_CONFIG_ENV = "ENTROPYRL_RESOLVED_CONFIG"
_TENSOR_FIELDS = ("entropy", "old_log_probs", "ref_log_prob", "responses", "response_mask")
# CHAIR values a caption the service could not score carries as NaN (entropyrl.verl.rewards)
CHAIR_VALUES = ("chair_i", "chair_s", "recall", "hallucinated")


def _available(batch: Any, names: tuple[str, ...]) -> list[str]:
    """Those of `names` the batch's metadata lists (fields written before the old-log-prob
    pass, such as the dataset's `index` and the reward's `extra_fields`)."""
    fields = getattr(batch, "fields", None)
    return list(names) if fields is None else [name for name in names if name in fields]


def step_field_names(config: Any, use_reference_policy: bool) -> list[str]:
    """The per-token fields verl 0.9.1 has written to TransferQueue when advantages are computed.

    From the config, not from the batch's metadata: the driver's `KVBatchMeta` is the one the
    old-log-prob pass returned, and the reference pass writes `ref_log_prob` after it without
    refreshing it, so the metadata would leave the reference out. In rollout-correction bypass
    mode the old log-probs are the rollout's and verl computes no entropy.
    """
    correction = config.algorithm.get("rollout_correction", None)
    bypass = bool(correction and correction.get("bypass_mode", False))
    names = ["responses", "response_mask", "old_log_probs"]
    if not bypass:
        names.append("entropy")
    if use_reference_policy:
        names.append("ref_log_prob")
    return names


def fetch_step_fields(
    batch: Any, names: list[str]
) -> tuple[dict[str, torch.Tensor | None], list[Any] | None]:
    """Padded [B, T] tensors of `names` (None for the others of `_TENSOR_FIELDS`) and the
    per-sample extra fields (the reward's extra info), fetched by key."""
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=names)
    tensors = {name: padded(data.get(name, None)) for name in _TENSOR_FIELDS}
    extra = None
    if _available(batch, ("extra_fields",)):
        got = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"]
        )
        if "extra_fields" in got:
            extra = list(got["extra_fields"])
    return tensors, extra


def scored_chair_values(reward_extra_infos: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """The validation extra infos with unscored CHAIR values (NaN) as None, which verl's
    `process_validation_metrics` leaves out of its means."""
    infos = dict(reward_extra_infos)
    for name in CHAIR_VALUES:
        if name in infos:
            infos[name] = [
                None if isinstance(v, float) and math.isnan(v) else v for v in infos[name]
            ]
    return infos


def write_resolved_config(config: Any, path: Path) -> None:
    """The config as the trainer sees it (interpolations resolved), as YAML, written atomically."""
    from omegaconf import OmegaConf

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(OmegaConf.to_yaml(config, resolve=True))
    os.replace(partial, path)


def default_metrics_path(config: Any, environ: Mapping[str, str] | None = None) -> str | None:
    """Where verl's file logger should write when the run does not say (`VERL_FILE_LOGGER_PATH`
    unset): `metrics.jsonl` in the checkpoint folder, the run's own folder, shared between nodes
    and kept through a crash (verl's default is `./<project>/<experiment>.jsonl` in whatever
    folder the trainer's process started in). None when the file logger is off or placed."""
    environ = os.environ if environ is None else environ  # at call time: `datasets` rebinds it
    loggers = config.trainer.get("logger") or []
    loggers = [loggers] if isinstance(loggers, str) else list(loggers)
    if "file" not in loggers or environ.get("VERL_FILE_LOGGER_PATH"):
        return None
    return os.path.join(str(config.trainer.default_local_dir), "metrics.jsonl")


def per_sample_clip_actor(actor: Any) -> Any:
    """The actor section the per-sample bound's loss runs with: the run's own, its
    `policy_loss.loss_mode` set to `per_sample_clip` when the schedule switched it on (the
    config left verl's default, `vanilla`)."""
    if actor.policy_loss.get("loss_mode", "vanilla") == LOSS_NAME:
        return actor
    from omegaconf import OmegaConf

    own = OmegaConf.create(OmegaConf.to_container(actor, resolve=True))
    own.policy_loss.loss_mode = LOSS_NAME
    return own


def empty_training_set(config: Any, rows: int) -> str:
    """Why a run has no step to train (verl would log nothing and exit 0)."""
    batch = int(config.data.train_batch_size)
    filtered = bool(config.data.get("filter_overlong_prompts", False))
    return (
        f"no training step: the training set holds {rows} row(s) after verl's dataset read "
        f"{config.data.train_files}, fewer than data.train_batch_size={batch}"
        + (
            " (data.filter_overlong_prompts=true dropped every row verl could not measure or "
            "found longer than data.max_prompt_length: for image rows, qwen_vl_utils and "
            "torchvision must import; entropyrl doctor --recipe checks)"
            if filtered
            else ""
        )
    )


def resumed_file_logger(base: type, resumed_step: int) -> type:
    """verl's `FileLogger` for a run resumed after `resumed_step`: it keeps the file's rows of
    steps up to that one (verl opens the file with "wb", which drops them) and drops later ones,
    which the resumed run logs again."""

    class ResumedFileLogger(base):  # type: ignore[misc, valid-type]
        def __init__(self, project_name: str, experiment_name: str) -> None:
            # where verl's FileLogger writes (verl/utils/tracking.py)
            path = os.getenv("VERL_FILE_LOGGER_PATH") or os.path.join(
                os.path.expanduser(os.getenv("VERL_FILE_LOGGER_ROOT", ".")),
                project_name,
                f"{experiment_name}.jsonl",
            )
            kept = []
            if os.path.isfile(path):
                for line in Path(path).read_bytes().splitlines():
                    try:
                        step = json.loads(line)["step"]
                    except (ValueError, KeyError, TypeError):
                        continue
                    if isinstance(step, int) and step <= resumed_step:
                        kept.append(line + b"\n")
            super().__init__(project_name, experiment_name)
            for line in kept:
                self.fp.write(line)

    ResumedFileLogger.__name__ = ResumedFileLogger.__qualname__ = base.__name__
    return ResumedFileLogger


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
        self._failures: list[tuple[reward_failures.Failure, int]] = []  # reported, not counted
        super().__init__(config, *args, **kwargs)
        path = os.environ.get(RESOLVED_CONFIG_ENV)
        if path:
            write_resolved_config(config, Path(path))

    @property
    def specs(self) -> AlgorithmSpecs:
        """The algorithm sections of this run's config (`entropyrl.core.specs`), parsed once."""
        specs = self.__dict__.get("_specs")
        if specs is None:
            specs = self._specs = algorithm_specs(self.config.algorithm)
        return specs

    def think_ids(self) -> tuple[list[int], list[int]]:
        if self._think_ids is None:
            self._think_ids = think_tag_ids(self.tokenizer)
        return self._think_ids

    # -- samples asked for and received -------------------------------------------------------

    def _build_replay_buffer(self) -> Any:
        buffer = super()._build_replay_buffer()
        sample = buffer.sample

        @functools.wraps(sample)
        def counted_sample(global_steps: int, partition_id: str, batch_size: int) -> tuple:
            batch, metrics = sample(
                global_steps=global_steps, partition_id=partition_id, batch_size=batch_size
            )
            extra = self._count_samples(batch, global_steps, partition_id, batch_size)
            return batch, {**metrics, **extra}

        buffer.sample = counted_sample
        return buffer

    def _reported_failures(self) -> list[tuple[reward_failures.Failure, int]]:
        """The failures the reward workers reported since the last batch was counted."""
        self._failures.extend(reward_failures.drain())
        return self._failures

    @staticmethod
    def _stop(line: str) -> None:
        """Stop the run for lost samples: the line on the driver's stderr, then the error."""
        print(f"entropyrl: {line}", file=sys.stderr, flush=True)
        raise LostSamplesError(line)

    def _count_samples(
        self, batch: Any, global_steps: int, partition_id: str, batch_size: int
    ) -> dict[str, float]:
        """Judge a batch the replay buffer handed over (`entropyrl.verl.lost_samples.account`):
        stop the run with its line, or print the losses and return the step's metrics."""
        rollout = self.config.actor_rollout_ref.rollout
        validating = partition_id == "val"
        per_prompt = int(rollout.val_kwargs.n if validating else rollout.n)
        verdict = account(
            where=f"validation at step {global_steps}" if validating else f"step {global_steps}",
            expected=int(batch_size) * per_prompt,
            received=sessions_received(batch.keys),
            failures=self._reported_failures(),
            max_fraction=self.specs.lost_samples.max_fraction,
        )
        self._failures = []
        if verdict.stop:
            self._stop(verdict.stop)
        if verdict.warning:
            print(f"entropyrl: warning: {verdict.warning}", file=sys.stderr, flush=True)
        return {} if validating else verdict.metrics

    def _add_prompts_to_generate(self, num_prompts: int) -> int:
        # verl refills failed groups here when asked to (sync_refill_failed_groups): a refused
        # token would fail every refill, so it stops the run before the next one
        stop = refused_token(f"step {self.global_steps}", self._reported_failures())
        if stop:
            self._stop(stop)
        return super()._add_prompts_to_generate(num_prompts)

    def on_init_end(self) -> None:
        super().on_init_end()
        actor = self.config.actor_rollout_ref.actor
        loss_mode = actor.policy_loss.get("loss_mode", "vanilla")
        schedule = self.specs.clip_schedule.enable
        # checked before Ray by the config validation; again here for a run started another way
        problem = schedule_loss_problem(schedule, loss_mode) or schedule_bound_problem(
            self.specs.clip_schedule, actor.get("clip_ratio_high")
        )
        if problem:
            raise ValueError(problem)
        if schedule or loss_mode == LOSS_NAME:
            from verl.trainer.distillation import is_distillation_enabled

            if is_distillation_enabled(self.config.get("distillation")):
                # The workers' distillation loss would be replaced by plain ppo_loss.
                raise ValueError(f"policy_loss.loss_mode={LOSS_NAME} does not support distillation")
            self.actor_rollout_wg.set_loss_fn(PerSampleClipPPOLoss(per_sample_clip_actor(actor)))

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        estimator = str(self.config.algorithm.adv_estimator)
        ours = estimator in VERL_ESTIMATORS
        wants_clip = self.specs.clip_schedule.enable
        trace = recorder()  # the smoke's per-sample rows, when the run asks for them
        tracing = trace is not None
        # The caption reward's parts are logged even where verl alone would do (GRPO, no schedule).
        caption = self.config.reward.custom_reward_function.get("name") == CAPTION_REWARD_NAME
        if not ours and not wants_clip and not tracing and not caption:
            return super()._compute_advantage(batch, metrics)
        names = step_field_names(self.config, bool(self.use_reference_policy))
        tensors, extra_fields = fetch_step_fields(batch, names)
        # verl's synthetic padding rows (tag is_padding) stay out of the CHAIR / clip metrics.
        valid = torch.tensor(
            [not tag.get("is_padding", False) for tag in batch.tags], dtype=torch.bool
        )
        chair_i = chair_from_extra_fields(extra_fields, len(batch))
        clip_high, clip_metrics = clip_high_from_chair(chair_i, self.specs.clip_schedule, valid)
        verl_step = functools.partial(super()._compute_advantage, batch, metrics)
        if ours:
            step, step_metrics = build_step(
                specs=self.specs,
                estimator=estimator,
                response_mask=tensors["response_mask"],
                responses=tensors["responses"],
                entropy=tensors["entropy"],
                old_log_probs=tensors["old_log_probs"],
                ref_log_prob=tensors["ref_log_prob"],
                think_ids=self.think_ids() if ESTIMATOR_NEEDS[estimator]["entropy"] else None,
                clip_high=clip_high,
            )
            batch, estimator_metrics = with_step(step, verl_step)
            metrics.update(step_metrics)
            metrics.update(estimator_metrics)
        else:
            batch = verl_step()
        metrics.update(clip_metrics)
        metrics.update(chair_status_metrics(extra_fields, valid))
        metrics.update(reward_part_metrics(extra_fields, valid))
        if tracing:
            self._trace(trace, batch, tensors, clip_high, chair_i, valid, extra_fields)
        if clip_high is not None:
            batch = tq.kv_batch_put(
                keys=batch.keys,
                partition_id=batch.partition_id,
                fields=TensorDict({CLIP_FIELD: clip_high}, batch_size=len(batch)),
            )
        return batch

    def _trace(
        self,
        trace: Any,
        batch: Any,
        tensors: dict[str, torch.Tensor | None],
        clip_high: torch.Tensor | None,
        chair_i: torch.Tensor,
        valid: torch.Tensor,
        extra_fields: list[Any] | None,
    ) -> None:
        """Record what this step computed per sample (`entropyrl.rig.trace`)."""
        names = ["advantages", "uid", "rm_scores", *_available(batch, ("index",))]
        got = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=names)
        index = got.get("index", None)
        scores = padded(got.get("rm_scores", None))
        rows = trace.driver_rows(
            tensors=tensors,
            advantages=padded(got.get("advantages", None)),
            prompt_ids=None if index is None else trace.row_values(index, len(batch)),
            clip_high=clip_high,
            chair_i=chair_i,
            valid=valid,
            seq_lens=[tag.get("seq_len") for tag in batch.tags],
            step=int(self.global_steps),
            scores=None if scores is None else scores.sum(dim=-1),
            groups=trace.row_values(got.get("uid", None), len(batch)),
            reward_parts=None if extra_fields is None else reward_infos(extra_fields),
        )
        trace.write("driver", rows)

    # -- checkpoints and validation ------------------------------------------------------------

    def _save_checkpoint(self) -> None:
        super()._save_checkpoint()
        folder = checkpoints.checkpoint_folder(self.config)
        checkpoints.write_settings(folder, self.config, int(self.global_steps))
        keep = self.config.trainer.get("max_actor_ckpt_to_keep", None)
        if keep:  # verl's workers forget the checkpoints of a run before a resume
            checkpoints.remove_older(folder, keep=int(keep))

    def fit(self, agent_loop_manager: Any) -> None:
        metrics = default_metrics_path(self.config)
        if metrics is not None:  # read by verl's FileLogger when super().fit() builds it
            os.makedirs(os.path.dirname(metrics) or ".", exist_ok=True)
            os.environ["VERL_FILE_LOGGER_PATH"] = metrics
        if self.global_steps > 0:
            from verl.utils import tracking

            tracking.FileLogger = resumed_file_logger(tracking.FileLogger, int(self.global_steps))
        if self.total_training_steps <= 0:
            raise RuntimeError(empty_training_set(self.config, len(self.train_dataset)))
        if self.global_steps >= self.total_training_steps:
            # verl would log nothing and exit 0: say it (the driver says it too when it can)
            print(
                f"entropyrl: nothing left to do: resumed at step {self.global_steps} of "
                f"{self.total_training_steps} from {checkpoints.checkpoint_folder(self.config)}",
                flush=True,
            )
            return
        return super().fit(agent_loop_manager)

    def _val_metrics_update(
        self,
        data_sources: Any,
        sample_uids: Any,
        reward_extra_infos_dict: dict[str, list[Any]],
        sample_turns: Any,
        expected_acc_counts: Any = None,
    ) -> dict[str, float]:
        infos = scored_chair_values(reward_extra_infos_dict)
        metrics = super()._val_metrics_update(
            data_sources, sample_uids, infos, sample_turns, expected_acc_counts=expected_acc_counts
        )
        if "chair_i" in reward_extra_infos_dict:
            for source in sorted(set(data_sources)):
                unscored_here = sum(
                    1
                    for s, v in zip(data_sources, infos["chair_i"], strict=True)
                    if s == source and v is None
                )
                metrics[f"val-aux/{source}/chair_unscored/count"] = float(unscored_here)
        return metrics
