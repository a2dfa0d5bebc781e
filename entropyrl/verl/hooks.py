"""The entropy-aware trainer's step logic as pure functions on padded tensors.

`EntropyPPOTrainer._compute_advantage` only fetches fields from verl's TransferQueue, calls
these, and writes the results back; tests call them on hand-built batches.

Config (all under `algorithm`, a free-form section in verl):
- `egpo.entropy_mode`: answer | thinking | full (segment of H_i; default answer),
  `egpo.entropy_source`: logits (verl's per-token entropy) | nll (-old_log_probs).
- `clip_schedule.{enable, rule, low, high, threshold, direction, neutral, saturation,
  temperature}`: per-sample
  epsilon_high from each sample's CHAIR_i (`entropyrl.clip_schedules`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from entropyrl.clip_schedules import clip_high_from_hallucination
from entropyrl.entropy import segment_mask
from entropyrl.verl.estimators import config_value
from entropyrl.verl.inputs import AdvantageInputs

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ENTROPY_SOURCES = ("logits", "nll")


def think_tag_ids(tokenizer: Any) -> tuple[list[int], list[int]]:
    """Token ids of `<think>` and `</think>` (one special token or several ordinary ones)."""
    open_ids = list(tokenizer.encode(THINK_OPEN, add_special_tokens=False))
    close_ids = list(tokenizer.encode(THINK_CLOSE, add_special_tokens=False))
    if not close_ids:
        raise ValueError(f"the tokenizer encodes {THINK_CLOSE!r} to no tokens")
    return open_ids, close_ids


def build_advantage_inputs(
    *,
    response_mask: torch.Tensor,
    responses: torch.Tensor | None,
    entropy: torch.Tensor | None,
    old_log_probs: torch.Tensor | None,
    ref_log_prob: torch.Tensor | None,
    algorithm: Any,
    think_ids: tuple[Sequence[int], Sequence[int]] | None,
) -> AdvantageInputs:
    """Per-token entropy and its segment mask for the registered estimators (tensors [B, T]).

    Missing entropy (verl's bypass mode, or a worker that did not compute it) leaves
    `token_entropy` None: the estimators then fall back to GRPO and count it.
    """
    source = str(config_value(algorithm, "egpo.entropy_source", "logits"))
    if source not in ENTROPY_SOURCES:
        raise ValueError(
            f"algorithm.egpo.entropy_source must be one of {ENTROPY_SOURCES}, got {source!r}"
        )
    mode = str(config_value(algorithm, "egpo.entropy_mode", "answer"))
    token_entropy = None
    if source == "logits" and entropy is not None:
        token_entropy = entropy.to(torch.float32)
    elif source == "nll" and old_log_probs is not None:
        token_entropy = -old_log_probs.to(torch.float32)
    inputs = AdvantageInputs(token_entropy=token_entropy, ref_log_prob=ref_log_prob)
    if mode == "full" or token_entropy is None:
        return inputs
    if responses is None or think_ids is None:
        raise ValueError(
            f"algorithm.egpo.entropy_mode={mode!r} needs the response token ids and the think tags"
        )
    mask, found = segment_mask(responses, response_mask, think_ids[0], think_ids[1], mode)
    inputs.segment_mask = mask
    rows = response_mask.bool().any(dim=-1)
    inputs.metrics["egpo/segment/fallback"] = float((rows & ~found).sum().item())
    return inputs


def _unwrap(value: Any) -> Any:
    # TransferQueue hands non-tensor fields back as NonTensorData wrappers or plain objects.
    return getattr(value, "data", value)


def _reward_info(fields: Any) -> Mapping[str, Any] | None:
    fields = _unwrap(fields)
    info = fields.get("reward_extra_info", {}) if isinstance(fields, Mapping) else {}
    info = _unwrap(info) if info is not None else {}
    return info if isinstance(info, Mapping) else None


def chair_from_extra_fields(extra_fields: Sequence[Any] | None, batch_size: int) -> torch.Tensor:
    """CHAIR_i per sample [B] from verl's per-sample `extra_fields["reward_extra_info"]`.

    NaN where the reward did not report it (`chair_ok` false, CHAIR service down, or a reward
    without CHAIR).
    """
    values = torch.full((batch_size,), float("nan"), dtype=torch.float32)
    if extra_fields is None:
        return values
    extra_fields = list(extra_fields)
    if len(extra_fields) != batch_size:
        raise ValueError(f"extra_fields has {len(extra_fields)} rows, the batch has {batch_size}")
    for i, fields in enumerate(extra_fields):
        info = _reward_info(fields)
        if info is None or info.get("chair_ok", True) is False:
            continue
        value = info.get("chair_i")
        try:
            value = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(value):
            values[i] = value
    return values


def chair_status_metrics(
    extra_fields: Sequence[Any] | None, valid: torch.Tensor | None = None
) -> dict[str, float]:
    """How this step's samples fared with the CHAIR service (counts over real rows).

    `chair/scored_samples`: CHAIR answered; `chair/fallback_samples`: the service gave no answer
    (unreachable, the documented fallback); `chair/error_samples`: it answered with an error for
    that caption (e.g. an unknown image id). Empty when the reward reports no CHAIR at all.
    """
    if extra_fields is None:
        return {}
    infos = [_reward_info(fields) for fields in extra_fields]
    if valid is not None:
        infos = [info for info, keep in zip(infos, valid.tolist()) if keep]
    infos = [info for info in infos if info is not None and "chair_ok" in info]
    if not infos:
        return {}
    scored = sum(1 for info in infos if bool(_unwrap(info["chair_ok"])))
    fallback = sum(
        1
        for info in infos
        if not bool(_unwrap(info["chair_ok"])) and bool(_unwrap(info.get("chair_fallback", False)))
    )
    return {
        "chair/scored_samples": float(scored),
        "chair/fallback_samples": float(fallback),
        "chair/error_samples": float(len(infos) - scored - fallback),
    }


def clip_schedule_enabled(algorithm: Any) -> bool:
    return bool(config_value(algorithm, "clip_schedule.enable", False))


def clip_ratio_high_from_chair(
    chair_i: torch.Tensor, algorithm: Any, valid: torch.Tensor | None = None
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """Per-sample epsilon_high [B] from CHAIR_i [B] (NaN = unavailable), or None when disabled.

    Samples without CHAIR get the schedule's neutral value and are counted in
    `chair/unavailable`. `valid` [B] (bool) leaves rows out of the metrics: verl's synthetic
    padding rows copy a real row's reward info and carry no loss.
    """
    if not clip_schedule_enabled(algorithm):
        return None, {}
    kwargs: dict[str, Any] = {
        "rule": str(config_value(algorithm, "clip_schedule.rule", "step")),
        "low": float(config_value(algorithm, "clip_schedule.low", 0.3)),
        "high": float(config_value(algorithm, "clip_schedule.high", 0.5)),
        "threshold": float(config_value(algorithm, "clip_schedule.threshold", 1e-4)),
        "direction": str(config_value(algorithm, "clip_schedule.direction", "hallucinated_high")),
    }
    for name in ("neutral", "saturation", "temperature"):
        value = config_value(algorithm, f"clip_schedule.{name}", None)
        if value is not None:
            kwargs[name] = float(value)
    clip_high = clip_high_from_hallucination(chair_i, **kwargs).to(torch.float32).reshape(-1)
    if valid is None:
        valid = torch.ones_like(clip_high, dtype=torch.bool)
    chair_valid, clip_valid = chair_i[valid], clip_high[valid]
    available = torch.isfinite(chair_valid)
    metrics = {"chair/unavailable": float((~available).sum().item())}
    if clip_valid.numel():
        metrics.update(
            {
                "chair/unavailable_frac": float((~available).float().mean().item()),
                # `clip/bound_*`: the bounds the schedule gave this step's samples. The actor's
                # loss reports its own `clip/high_mean` (the bound over the tokens it saw).
                "clip/bound_mean": float(clip_valid.mean().item()),
                "clip/bound_min": float(clip_valid.min().item()),
                "clip/bound_max": float(clip_valid.max().item()),
            }
        )
    if available.any():
        scored = chair_valid[available]
        metrics["chair/chair_i_mean"] = float(scored.mean().item())
        metrics["chair/hallucinated_frac"] = float(
            (scored >= kwargs["threshold"]).float().mean().item()
        )
    return clip_high, metrics
