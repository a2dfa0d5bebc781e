"""`trainer.v1.trainer_mode=entropyrl`: verl's sync PPO trainer plus entropy and CHAIR plumbing.

The trainer does what only a trainer does: the advantage step and the hooks verl calls. Around
verl's own `_compute_advantage` (KL-in-reward, rollout correction and the estimator call stay
verl's), each step:
- opens one step context (`entropyrl.verl.inputs.Step`): the run's parsed algorithm sections,
  what the estimator reads (the old-policy pass's per-token `entropy` and its `<think>`
  segment; the reference log-probs) and the step's clip bounds; the estimator's metrics come
  back from `with_step`;
- turns each sample's CHAIR_i (reward extra info) into its `clip_high` and `clip_low` (the two
  schedules), written beside `advantages` so every mini-batch and PPO epoch carries them;
- with the token penalty or the token clip on, maps each sample's hallucinated mentions (the
  caption reward's character spans) onto its response tokens: the penalty subtracts `beta`
  from their advantages after the estimator; the token clip writes the [B, T]
  `hallucinated_tokens` mask beside `advantages` for the loss;
- logs `egpo/*`, `chair/*`, `clip/*` and `token_credit/*` (over real rows; the estimators'
  `egpo/entropy/missing` also counts verl's padding rows).
After init the actor workers get `PerSampleClipPPOLoss`, which runs verl's `ppo_loss` and hands
the bounds to the `per_sample_clip` policy loss whenever a schedule or the token clip is on.

Its collaborators change no object of verl's: `transfer` (TransferQueue in and out), `hooks`
(the per-step adapters), `checks.nodes` (one Ray task per node before any worker starts),
`failures` (the counted sampler over verl's replay buffer, lost samples, CHAIR fallbacks),
`run_log` (`metrics.jsonl`, a resumed run's earlier rows, the settings beside each checkpoint).
Validation means of CHAIR scores are over the captions the service scored, the unscored ones
counted beside them (`val-aux/<source>/chair_unscored`), where verl's `np.mean` gave NaN.
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path
from typing import Any

import ray
import torch
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from entropyrl.core.entropy import think_tag_ids
from entropyrl.core.estimator_names import ESTIMATOR_NEEDS, VERL_ESTIMATORS
from entropyrl.core.specs import AlgorithmSpecs, algorithm_specs
from entropyrl.core.token_credit import hallucinated_token_mask
from entropyrl.verl.checks import checkpoints, nodes
from entropyrl.verl.checks.validation import schedule_bound_problem, schedule_loss_problem
from entropyrl.verl.failures import chair_fallback
from entropyrl.verl.failures.sampling import CountedSampler, SampleAccounting
from entropyrl.verl.hooks import (
    build_step,
    chair_fallback_rows,
    chair_from_extra_fields,
    chair_reporting_rows,
    chair_score_metrics,
    chair_status_metrics,
    clip_high_from_chair,
    clip_low_from_chair,
    require_token_positions,
    reward_infos,
    reward_part_metrics,
    token_credit_metrics,
    token_penalty_from_step,
    token_positions_from_spans,
)
from entropyrl.verl.inputs import with_step
from entropyrl.verl.loss import (
    CLIP_FIELD,
    CLIP_LOW_FIELD,
    HALLUCINATED_FIELD,
    LOSS_NAME,
    PerSampleClipPPOLoss,
)
from entropyrl.verl.names import VERL_TRAINER_MODE
from entropyrl.verl.recorder import recorder
from entropyrl.verl.rewards import CAPTION_REWARD_NAME
from entropyrl.verl.run_log import (
    RESOLVED_CONFIG_ENV,
    ResumedLog,
    default_metrics_path,
    empty_training_set,
    metrics_file_path,
    record_checkpoint,
    write_resolved_config,
)
from entropyrl.verl.tensors import padded
from entropyrl.verl.transfer import (
    available,
    fetch_step_fields,
    get_fields,
    put_fields,
    put_per_token,
    step_field_names,
)

__all__ = [
    "RESOLVED_CONFIG_ENV",  # where they were before run_log: kept importable from here
    "TRAINER_MODE",
    "EntropyPPOTrainer",
    "default_metrics_path",
    "empty_training_set",
    "write_resolved_config",
]

TRAINER_MODE = VERL_TRAINER_MODE
# CHAIR values a caption the service could not score carries as NaN (entropyrl.verl.rewards)
CHAIR_VALUES = ("chair_i", "chair_s", "recall", "hallucinated")


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
        if ray.is_initialized():  # before any worker opens a file on another node
            nodes.require_every_node(config)
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

    # -- samples asked for and received (entropyrl.verl.failures.sampling) ----------------------------

    def _build_replay_buffer(self) -> Any:
        rollout = self.config.actor_rollout_ref.rollout
        self._accounting = SampleAccounting(
            rollout_n=int(rollout.n),
            val_n=int(rollout.val_kwargs.n),
            max_fraction=self.specs.lost_samples.max_fraction,
        )
        return CountedSampler(super()._build_replay_buffer(), self._accounting)

    def _add_prompts_to_generate(self, num_prompts: int) -> int:
        # verl refills failed groups here when asked to (sync_refill_failed_groups): a refused
        # token would fail every refill, so it stops the run before the next one
        self._accounting.stop_on_refused_token(int(self.global_steps))
        return super()._add_prompts_to_generate(num_prompts)

    def on_init_end(self) -> None:
        super().on_init_end()
        actor = self.config.actor_rollout_ref.actor
        loss_mode = actor.policy_loss.get("loss_mode", "vanilla")
        high, low = self.specs.clip_schedule, self.specs.clip_low_schedule
        token_clip = self.specs.token_clip
        # checked before Ray by the config validation; again here for a run started another way
        problems = [
            schedule_loss_problem(high.enable, loss_mode, high.SECTION),
            schedule_loss_problem(low.enable, loss_mode, low.SECTION),
            schedule_loss_problem(token_clip.enable, loss_mode, token_clip.SECTION),
            schedule_bound_problem(high, actor.get("clip_ratio_high"), key="clip_ratio_high"),
            schedule_bound_problem(low, actor.get("clip_ratio_low"), key="clip_ratio_low"),
        ]
        problem = next((p for p in problems if p), None)
        if problem:
            raise ValueError(problem)
        if high.enable or low.enable or token_clip.enable or loss_mode == LOSS_NAME:
            from verl.trainer.distillation import is_distillation_enabled

            if is_distillation_enabled(self.config.get("distillation")):
                # The workers' distillation loss would be replaced by plain ppo_loss.
                raise ValueError(f"policy_loss.loss_mode={LOSS_NAME} does not support distillation")
            bounds = (token_clip.low, token_clip.high) if token_clip.enable else None
            self.actor_rollout_wg.set_loss_fn(
                PerSampleClipPPOLoss(per_sample_clip_actor(actor), token_clip=bounds)
            )

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        estimator = str(self.config.algorithm.adv_estimator)
        ours = estimator in VERL_ESTIMATORS
        wants_clip = self.specs.clip_schedule.enable or self.specs.clip_low_schedule.enable
        wants_tokens = self.specs.token_penalty.enable or self.specs.token_clip.enable
        trace = recorder()  # the smoke's per-sample rows, when the run asks for them
        tracing = trace is not None
        # The caption reward's parts are logged even where verl alone would do (GRPO, no schedule).
        caption = self.config.reward.custom_reward_function.get("name") == CAPTION_REWARD_NAME
        if not ours and not wants_clip and not wants_tokens and not tracing and not caption:
            return super()._compute_advantage(batch, metrics)
        names = step_field_names(self.config, bool(self.use_reference_policy))
        tensors, extra_fields = fetch_step_fields(batch, names)
        # verl's synthetic padding rows (tag is_padding) stay out of the CHAIR / clip metrics.
        valid = torch.tensor(
            [not tag.get("is_padding", False) for tag in batch.tags], dtype=torch.bool
        )
        self._judge_chair_fallbacks(extra_fields, valid)
        chair_i = chair_from_extra_fields(extra_fields, len(batch))
        clip_high, clip_metrics = clip_high_from_chair(chair_i, self.specs.clip_schedule, valid)
        clip_low, low_metrics = clip_low_from_chair(chair_i, self.specs.clip_low_schedule, valid)
        clip_metrics.update(low_metrics)
        if clip_high is None:  # the schedule logs them beside its bounds
            clip_metrics.update(
                chair_score_metrics(chair_i, self.specs.clip_schedule.threshold, valid)
            )
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
        hallucinated = None
        if wants_tokens:
            hallucinated, token_metrics = self._hallucinated_tokens(tensors, extra_fields, valid)
            metrics.update(token_metrics)
            if self.specs.token_penalty.enable:  # after the estimator: -beta on those tokens
                batch = self._penalise_tokens(
                    batch, hallucinated, tensors["response_mask"], metrics
                )
        if tracing:  # after the penalty: the advantages the loss reads
            self._trace(
                trace,
                batch,
                tensors,
                (clip_high, clip_low),
                chair_i,
                valid,
                extra_fields,
                hallucinated=hallucinated,
            )
        if hallucinated is not None and self.specs.token_clip.enable:
            batch = put_per_token(batch, {HALLUCINATED_FIELD: hallucinated})
        bounds = {
            name: value
            for name, value in ((CLIP_FIELD, clip_high), (CLIP_LOW_FIELD, clip_low))
            if value is not None
        }
        if bounds:  # beside `advantages`: every mini-batch and PPO epoch carries them
            batch = put_fields(batch, bounds)
        return batch

    def _hallucinated_tokens(
        self,
        tensors: dict[str, torch.Tensor | None],
        extra_fields: list[Any] | None,
        valid: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """This step's [B, T] hallucinated-token mask (the reward's spans on the response ids)
        and its `token_credit/*` metrics; a step where no real row reports them stops."""
        mask = tensors["response_mask"]
        positions = token_positions_from_spans(
            extra_fields, tensors["responses"], mask, self.tokenizer
        )
        hallucinated, scored = hallucinated_token_mask(positions, mask)
        section = "token_penalty" if self.specs.token_penalty.enable else "token_clip"
        require_token_positions(scored, valid, f"algorithm.{section}")
        return hallucinated, token_credit_metrics(hallucinated, mask, scored, valid)

    def _penalise_tokens(
        self, batch: Any, hallucinated: torch.Tensor, response_mask: torch.Tensor, metrics: dict
    ) -> Any:
        """verl's advantages with -beta on the hallucinated tokens, written back in place."""
        moved, penalty_metrics = token_penalty_from_step(
            padded(get_fields(batch, ["advantages"])["advantages"]),
            hallucinated,
            response_mask,
            beta=self.specs.token_penalty.beta,
        )
        metrics.update(penalty_metrics)
        return put_per_token(batch, {"advantages": moved})

    def _judge_chair_fallbacks(self, extra_fields: list[Any] | None, valid: torch.Tensor) -> None:
        """Warn about, or stop for, this step's samples without a CHAIR answer."""
        kwargs = self.config.reward.custom_reward_function.get("reward_kwargs", None)
        chair_fallback.judge(
            where=f"step {self.global_steps}",
            fallback_rows=chair_fallback_rows(extra_fields, valid),
            samples=chair_reporting_rows(extra_fields, valid),
            max_fraction=self.specs.chair_fallback.max_fraction,
            url=chair_fallback.service_url(kwargs, os.environ),
        ).apply()

    def _trace(
        self,
        trace: Any,
        batch: Any,
        tensors: dict[str, torch.Tensor | None],
        bounds: tuple[torch.Tensor | None, torch.Tensor | None],
        chair_i: torch.Tensor,
        valid: torch.Tensor,
        extra_fields: list[Any] | None,
        *,
        hallucinated: torch.Tensor | None = None,
    ) -> None:
        """Record what this step computed per sample (`entropyrl.rig.trace`)."""
        got = get_fields(batch, ["advantages", "uid", "rm_scores", *available(batch, ("index",))])
        index = got.get("index", None)
        scores = padded(got.get("rm_scores", None))
        rows = trace.driver_rows(
            tensors=tensors,
            advantages=padded(got.get("advantages", None)),
            prompt_ids=None if index is None else trace.row_values(index, len(batch)),
            clip_high=bounds[0],
            clip_low=bounds[1],
            chair_i=chair_i,
            valid=valid,
            seq_lens=[tag.get("seq_len") for tag in batch.tags],
            step=int(self.global_steps),
            scores=None if scores is None else scores.sum(dim=-1),
            groups=trace.row_values(got.get("uid", None), len(batch)),
            reward_parts=None if extra_fields is None else reward_infos(extra_fields),
            hallucinated=hallucinated,
        )
        trace.write("driver", rows)

    # -- checkpoints and validation ------------------------------------------------------------

    def _save_checkpoint(self) -> None:
        super()._save_checkpoint()
        record_checkpoint(self.config, int(self.global_steps))

    @property
    def logger(self) -> Any:
        """verl's `Tracking`, which `fit` builds and assigns here; a resumed run's earlier rows of
        the metrics file go back into it then (`entropyrl.verl.run_log.ResumedLog`)."""
        return self.__dict__.get("_tracking")

    @logger.setter
    def logger(self, tracking: Any) -> None:
        self.__dict__["_tracking"] = tracking
        resumed = self.__dict__.pop("_resumed_log", None)
        if resumed is not None:
            resumed.restore(tracking)

    def fit(self, agent_loop_manager: Any) -> None:
        metrics = default_metrics_path(self.config)
        if metrics is not None:  # read by verl's FileLogger when super().fit() builds it
            os.makedirs(os.path.dirname(metrics) or ".", exist_ok=True)
            os.environ["VERL_FILE_LOGGER_PATH"] = metrics
        if self.global_steps > 0:  # read before verl's FileLogger opens the file afresh
            trainer = self.config.trainer
            path = metrics_file_path(trainer.project_name, trainer.experiment_name, os.environ)
            self._resumed_log = ResumedLog(path, int(self.global_steps))
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
