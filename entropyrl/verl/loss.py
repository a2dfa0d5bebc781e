"""Per-sample and per-token clip bounds for verl: a registered policy loss and the actor loss callable.

`per_sample_clip` (select with `actor_rollout_ref.actor.policy_loss.loss_mode=per_sample_clip`) is
exactly verl's `vanilla` unless the step context (`entropyrl.verl.inputs.with_step`) carries a
per-sample clip-high bound; then the per-token surrogate comes from
`entropyrl.core.losses.ppo_clip_loss` (unaggregated) with that [B] tensor and verl's own `agg_loss`
aggregates it (global normalisation, every aggregation mode). verl's `ppo_loss` drops unknown batch
fields, so `PerSampleClipPPOLoss` (installed on the actor workers with `set_loss_fn`) reads the
`clip_high` field of each micro-batch, opens the context and delegates to verl's own `ppo_loss`: KL,
entropy bonus and metrics stay verl's.

The same path carries the clip-low schedule (a `clip_low` field [B]) and the token clip: a
`hallucinated_tokens` field [B, T] (1 on the response tokens of hallucinated mentions) and the
token bounds the callable was built with give each token its own bounds
(`entropyrl.core.token_credit.token_clip_bounds`; every other token keeps the sample's bounds).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from verl.trainer.ppo.core_algos import (
    agg_loss,
    compute_policy_loss_vanilla,
    register_policy_loss,
)

from entropyrl.core.losses import ppo_clip_loss
from entropyrl.core.specs import PpoClipSpec
from entropyrl.core.token_credit import token_clip_bounds
from entropyrl.verl.inputs import Step, current_step, with_step
from entropyrl.verl.names import PER_SAMPLE_CLIP_LOSS
from entropyrl.verl.rank_metrics import global_batch_metrics
from entropyrl.verl.recorder import recorder
from entropyrl.verl.tensors import padded

LOSS_NAME = PER_SAMPLE_CLIP_LOSS
CLIP_FIELD = "clip_high"  # the bound's one name: schedule, batch field, loss argument
CLIP_LOW_FIELD = "clip_low"  # the clip-low schedule's per-sample bound [B]
HALLUCINATED_FIELD = "hallucinated_tokens"  # [B, T] 0/1, the token clip's input


def _float(config: Any, name: str, default: float) -> float:
    value = getattr(config, name, None) if config is not None else None
    return default if value is None else float(value)


@register_policy_loss(LOSS_NAME)
def compute_policy_loss_per_sample_clip(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's policy-loss signature over `per_sample_clip_loss` with the open step's bounds."""
    return per_sample_clip_loss(
        current_step(),
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        config=config,
        rollout_is_weights=rollout_is_weights,
    )


def per_sample_clip_loss(
    step: Step | None,
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """PPO clipped surrogate with per-sample ([B]) or per-token ([B, T]) bounds (tokens [B, T]).

    Without any bound in `step` this is verl's `vanilla` (same function, same metrics). A bound
    the step does not carry comes from the actor config (`clip_ratio_low`, `clip_ratio_high`), as
    does the dual-clip constant; with the token clip, hallucinated tokens get its (low, high).
    """
    if step is None or (
        step.clip_high is None and step.clip_low is None and step.token_clip is None
    ):
        return compute_policy_loss_vanilla(
            old_log_prob=old_log_prob,
            log_prob=log_prob,
            advantages=advantages,
            response_mask=response_mask,
            loss_agg_mode=loss_agg_mode,
            config=config,
            rollout_is_weights=rollout_is_weights,
        )
    clip_ratio = _float(config, "clip_ratio", PpoClipSpec.clip_low)
    clip_low: float | torch.Tensor = _float(config, "clip_ratio_low", clip_ratio)
    clip_high: float | torch.Tensor = _float(config, "clip_ratio_high", clip_ratio)
    # One bound per row; `ppo_clip_loss` refuses a count that is not the micro-batch's.
    if step.clip_high is not None:
        clip_high = step.clip_high.to(device=log_prob.device, dtype=torch.float32).reshape(-1)
    if step.clip_low is not None:
        clip_low = step.clip_low.to(device=log_prob.device, dtype=torch.float32).reshape(-1)
    if step.token_clip is not None:
        hallucinated = step.hallucinated_tokens
        if hallucinated is None or hallucinated.shape != response_mask.shape:
            raise ValueError(
                f"the token clip needs the micro-batch's {HALLUCINATED_FIELD!r} [B, T] = "
                f"{list(response_mask.shape)}, got "
                f"{None if hallucinated is None else list(hallucinated.shape)}"
            )
        clip_low, clip_high = token_clip_bounds(
            hallucinated.to(log_prob.device),
            response_mask,
            base_low=clip_low,
            base_high=clip_high,
            token_low=step.token_clip[0],
            token_high=step.token_clip[1],
        )
    token_loss, core_metrics, _ = ppo_clip_loss(
        log_prob,
        old_log_prob,
        advantages,
        response_mask,
        clip_low=clip_low,
        clip_high=clip_high,
        clip_c=_float(config, "clip_ratio_c", PpoClipSpec.clip_c),
        agg=None,  # verl's own agg_loss below
    )
    if rollout_is_weights is not None:
        token_loss = token_loss * rollout_is_weights  # as verl's vanilla loss applies them
    # verl's own aggregation: global token / sequence counts and dp scaling, any agg mode.
    loss = agg_loss(
        loss_mat=token_loss,
        loss_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        **dict(getattr(config, "global_batch_info", None) or {}),
    )
    metrics = {
        # verl's names, so dashboards compare runs with and without the per-sample bound.
        "actor/pg_clipfrac": core_metrics["clip/frac_high"] + core_metrics["clip/frac_low"],
        "actor/ppo_kl": core_metrics["ppo_kl"],
        "actor/pg_clipfrac_lower": core_metrics["clip/frac_dual"],
    }
    metrics.update({key: value for key, value in core_metrics.items() if key.startswith("clip/")})
    return loss, metrics


def clip_high_field(data: Any, field: str = CLIP_FIELD) -> torch.Tensor | None:
    """The per-sample clip_high [B] carried by a verl micro-batch TensorDict, or None."""
    if field not in data:
        return None
    value = padded(data[field])
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"batch field {field!r} must be a tensor, got {type(value).__name__}")
    # A per-token copy ([B, T]) carries the same value on every token: keep the first.
    return value.reshape(value.shape[0], -1)[:, 0].to(torch.float32)


def hallucinated_tokens_field(data: Any) -> torch.Tensor | None:
    """The micro-batch's [B, T] hallucinated-token mask (padded like `response_mask`), or None."""
    if HALLUCINATED_FIELD not in data:
        return None
    value = padded(data[HALLUCINATED_FIELD])
    if not isinstance(value, torch.Tensor) or value.dim() != 2:
        raise TypeError(f"batch field {HALLUCINATED_FIELD!r} must be a [B, T] tensor")
    return value.to(torch.float32)


class PerSampleClipPPOLoss:
    """verl actor loss callable: verl's `ppo_loss` with the micro-batch's bounds.

    Built on the driver from the actor's OmegaConf section (picklable) and sent to every actor
    worker with `set_loss_fn`; the strict `ActorConfig` is built once, in the worker.
    `token_clip`: the (low, high) bounds of hallucinated tokens (`algorithm.token_clip`), or
    None; with it every micro-batch must carry `hallucinated_tokens`, without it none may.
    """

    def __init__(
        self,
        actor_config: Any,
        field: str = CLIP_FIELD,
        token_clip: tuple[float, float] | None = None,
    ) -> None:
        self.actor_config = actor_config
        self.field = field
        self.token_clip = (
            None if token_clip is None else (float(token_clip[0]), float(token_clip[1]))
        )
        self._config: Any = None

    def config(self) -> Any:
        if self._config is None:
            from omegaconf import DictConfig
            from verl.utils.config import omega_conf_to_dataclass

            config = self.actor_config
            self._config = (
                omega_conf_to_dataclass(config) if isinstance(config, DictConfig | dict) else config
            )
        return self._config

    def __getstate__(self) -> dict[str, Any]:
        return {
            "actor_config": self.actor_config,
            "field": self.field,
            "token_clip": self.token_clip,
            "_config": None,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({"token_clip": None, **state})

    def __call__(
        self, model_output: Any, data: Any, dp_group: Any = None
    ) -> tuple[torch.Tensor, dict]:
        from verl.workers.utils.losses import ppo_loss

        config = self.config()
        loss_mode = config.policy_loss.get("loss_mode", "vanilla")
        clip_high = clip_high_field(data, self.field)
        clip_low = clip_high_field(data, CLIP_LOW_FIELD)
        hallucinated = hallucinated_tokens_field(data)
        carried = [
            name
            for name, value in ((self.field, clip_high), (CLIP_LOW_FIELD, clip_low))
            if value is not None
        ]
        if carried and loss_mode != LOSS_NAME:
            raise ValueError(
                f"the batch carries a per-sample {carried[0]!r} but "
                f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode!r}; set it to {LOSS_NAME!r}"
            )
        if (hallucinated is None) != (self.token_clip is None):
            raise ValueError(
                f"algorithm.token_clip is {'on' if self.token_clip else 'off'} but the batch "
                f"{'lacks' if hallucinated is None else 'carries'} {HALLUCINATED_FIELD!r}"
            )
        trace = recorder()
        if trace is not None:
            self._trace(trace, data, clip_high, clip_low, model_output)
        step = Step(
            clip_high=clip_high,
            clip_low=clip_low,
            hallucinated_tokens=hallucinated,
            token_clip=self.token_clip,
        )
        (loss, metrics), _ = with_step(step, lambda: ppo_loss(config, model_output, data, dp_group))
        # Clip fractions as shares of the whole mini-batch, not means of the ranks' means.
        return loss, global_batch_metrics(metrics, data)

    def _trace(
        self,
        trace: Any,
        data: Any,
        clip_high: torch.Tensor | None,
        clip_low: torch.Tensor | None,
        model_output: Any,
    ) -> None:
        """Record what this micro-batch's loss sees per sample (see `entropyrl.rig.trace`)."""
        from verl.workers.utils.padding import no_padding_2_padding

        log_probs = no_padding_2_padding(model_output["log_probs"], data)
        rows = trace.worker_rows(data, clip_high, log_probs, clip_low)
        rank = rows[0]["rank"] if rows else 0
        trace.write(f"worker-{rank}-{os.getpid()}", rows)
