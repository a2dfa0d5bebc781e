"""Per-sample clip-high for verl: a registered policy loss and the actor loss callable that feeds it.

`per_sample_clip` (select with `actor_rollout_ref.actor.policy_loss.loss_mode=per_sample_clip`)
is exactly verl's `vanilla` unless a per-sample epsilon_high is visible through
`entropyrl.verl.inputs.per_sample_clip_high`; then the surrogate comes from
`entropyrl.losses.ppo_clip_loss` with that [B] tensor, aggregated with verl's global
normalisation. verl's `ppo_loss` drops unknown batch fields, so `PerSampleClipPPOLoss` (installed
on the actor workers with `set_loss_fn`) reads the `clip_ratio_high` field of each micro-batch,
opens the context and delegates to verl's own `ppo_loss`: KL, entropy bonus and metrics stay
verl's.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla, register_policy_loss

from entropyrl.losses import ppo_clip_loss
from entropyrl.verl import trace
from entropyrl.verl.inputs import current_clip_high, per_sample_clip_high
from entropyrl.verl.rank_metrics import global_batch_metrics

LOSS_NAME = "per_sample_clip"
CLIP_FIELD = "clip_ratio_high"


def verl_normalisation(
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    *,
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Factor turning a micro-batch-local aggregate into verl's `agg_loss` value (scalar).

    Our core aggregates over the micro-batch it is given (token-mean: / local tokens,
    seq-mean-*: / local sequences; token-sum is taken as token-mean * local tokens); verl
    divides by the global mini-batch's tokens or sequences and multiplies by dp_size so
    gradients do not depend on how the mini-batch is split. Both are linear in the per-token
    losses, so a scalar factor maps one to the other.
    """
    mask = response_mask.bool()
    if loss_agg_mode == "token-mean":
        local = mask.sum()
        denominator = local if batch_num_tokens is None else batch_num_tokens
        return local.to(torch.float32) / torch.as_tensor(denominator, dtype=torch.float32) * dp_size
    if loss_agg_mode == "token-sum":
        return mask.sum().to(torch.float32) * dp_size
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"):
        local = mask.any(dim=-1).sum()
        denominator = local if global_batch_size is None else global_batch_size
        factor = (
            local.to(torch.float32) / torch.as_tensor(denominator, dtype=torch.float32) * dp_size
        )
        if loss_agg_mode == "seq-mean-token-sum-norm":
            scale = mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
            factor = factor / scale
        return factor
    raise ValueError(f"loss_agg_mode {loss_agg_mode!r} is not supported by {LOSS_NAME}")


_CORE_AGG = {
    "token-mean": "token-mean",
    "token-sum": "token-mean",
    "seq-mean-token-sum": "seq-mean-token-sum",
    "seq-mean-token-sum-norm": "seq-mean-token-sum",
    "seq-mean-token-mean": "seq-mean-token-mean",
}


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
    """PPO clipped surrogate with a per-sample epsilon_high [B] (tokens [B, T]).

    Without a per-sample field this is verl's `vanilla` (same function, same metrics). With
    one, epsilon_low and the dual-clip constant still come from the actor config.
    """
    clip_high = current_clip_high()
    if clip_high is None:
        return compute_policy_loss_vanilla(
            old_log_prob=old_log_prob,
            log_prob=log_prob,
            advantages=advantages,
            response_mask=response_mask,
            loss_agg_mode=loss_agg_mode,
            config=config,
            rollout_is_weights=rollout_is_weights,
        )
    batch_size = log_prob.shape[0]
    clip_high = clip_high.to(device=log_prob.device, dtype=torch.float32).reshape(-1)
    if clip_high.shape[0] != batch_size:
        raise ValueError(
            f"{CLIP_FIELD} has {clip_high.shape[0]} rows but the micro-batch has {batch_size}"
        )
    clip_ratio = _float(config, "clip_ratio", 0.2)
    clip_low = _float(config, "clip_ratio_low", clip_ratio)
    clip_c = _float(config, "clip_ratio_c", 3.0)
    # verl clamps the log-ratio to [-20, 20] before exponentiating; keep that for parity.
    log_prob = old_log_prob + torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    if rollout_is_weights is not None:
        # The surrogate is positively homogeneous in A per token, so w * loss(A) = loss(w * A)
        # for IS weights w >= 0.
        advantages = advantages * rollout_is_weights
    if loss_agg_mode not in _CORE_AGG:
        raise ValueError(f"loss_agg_mode {loss_agg_mode!r} is not supported by {LOSS_NAME}")
    loss, core_metrics = ppo_clip_loss(
        log_prob,
        old_log_prob,
        advantages,
        response_mask,
        clip_low=clip_low,
        clip_high=clip_high,
        clip_c=clip_c,
        agg=_CORE_AGG[loss_agg_mode],
    )
    batch_info = dict(getattr(config, "global_batch_info", None) or {})
    loss = loss * verl_normalisation(
        response_mask,
        loss_agg_mode,
        dp_size=int(batch_info.get("dp_size", 1) or 1),
        batch_num_tokens=batch_info.get("batch_num_tokens"),
        global_batch_size=batch_info.get("global_batch_size"),
        loss_scale_factor=batch_info.get("loss_scale_factor"),
    ).to(loss.device)
    metrics = {
        # verl's names, so dashboards compare runs with and without the per-sample bound.
        "actor/pg_clipfrac": core_metrics["clip/frac_high"] + core_metrics["clip/frac_low"],
        "actor/ppo_kl": core_metrics["ppo_kl"],
        "actor/pg_clipfrac_lower": core_metrics["clip/frac_dual"],
    }
    metrics.update({key: value for key, value in core_metrics.items() if key.startswith("clip/")})
    return loss, metrics


def clip_high_field(data: Any, field: str = CLIP_FIELD) -> torch.Tensor | None:
    """The per-sample epsilon_high [B] carried by a verl micro-batch TensorDict, or None."""
    if field not in data:
        return None
    value = data[field]
    if getattr(value, "is_nested", False):
        value = value.to_padded_tensor(0.0)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"batch field {field!r} must be a tensor, got {type(value).__name__}")
    # A per-token copy ([B, T]) carries the same value on every token: keep the first.
    return value.reshape(value.shape[0], -1)[:, 0].to(torch.float32)


class PerSampleClipPPOLoss:
    """verl actor loss callable: verl's `ppo_loss` with the micro-batch's `clip_ratio_high`.

    Built on the driver from the actor's OmegaConf section (picklable) and sent to every actor
    worker with `set_loss_fn`; the strict `ActorConfig` is built once, in the worker.
    """

    def __init__(self, actor_config: Any, field: str = CLIP_FIELD) -> None:
        self.actor_config = actor_config
        self.field = field
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
        return {"actor_config": self.actor_config, "field": self.field, "_config": None}

    def __call__(
        self, model_output: Any, data: Any, dp_group: Any = None
    ) -> tuple[torch.Tensor, dict]:
        from verl.workers.utils.losses import ppo_loss

        config = self.config()
        loss_mode = config.policy_loss.get("loss_mode", "vanilla")
        clip_high = clip_high_field(data, self.field)
        if clip_high is not None and loss_mode != LOSS_NAME:
            raise ValueError(
                f"the batch carries a per-sample {self.field!r} but "
                f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode!r}; set it to {LOSS_NAME!r}"
            )
        if trace.trace_dir() is not None:
            self._trace(data, clip_high)
        with per_sample_clip_high(clip_high):
            loss, metrics = ppo_loss(config, model_output, data, dp_group)
        # Clip fractions as shares of the whole mini-batch, not means of the ranks' means.
        return loss, global_batch_metrics(metrics, data)

    def _trace(self, data: Any, clip_high: torch.Tensor | None) -> None:
        """Record what this micro-batch's loss sees per sample (see `entropyrl.verl.trace`)."""
        rows = trace.worker_rows(data, clip_high)
        rank = rows[0]["rank"] if rows else 0
        trace.write(f"worker-{rank}-{os.getpid()}", rows)


def _dense(value: Any) -> torch.Tensor:
    return value.to_padded_tensor(0) if getattr(value, "is_nested", False) else value
