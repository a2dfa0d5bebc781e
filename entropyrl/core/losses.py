"""PPO clipped surrogate with per-sample or per-token clip bounds, dual clip and verl's aggregation modes."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from entropyrl.core.specs import PpoClipSpec

__all__ = ["AGG_MODES", "ClipMasks", "aggregate", "ppo_clip_loss"]

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


class ClipMasks(NamedTuple):
    """Which tokens the clipped surrogate cut off, per token (False on masked positions).

    ``high``: BoolTensor[B, T], ratio above 1 + clip_high with A > 0 (``clip/frac_high``);
    ``low``: ratio below 1 - clip_low with A < 0 (``clip/frac_low``). A caller splits those
    fractions by groups of samples with them (e.g. hallucinating vs clean captions); the batch
    fractions are ``mask.sum() / tokens``.
    """

    high: Tensor
    low: Tensor


def aggregate(loss_mat: Tensor, mask: Tensor, agg: str) -> Tensor:
    """verl's ``agg_loss`` for one micro-batch (dp_size 1, normalisers taken from this batch).

    Fully masked sequences are left out of the sequence means; an empty mask gives a zero that
    is still connected to the graph, so ``backward`` works.
    """
    if agg == "token-mean":
        return (loss_mat * mask).sum() / mask.sum().clamp_min(1.0)
    tokens = mask.sum(dim=-1)
    seq = (loss_mat * mask).sum(dim=-1)
    if agg == "seq-mean-token-mean":
        seq = seq / (tokens + 1e-8)  # verl's normaliser, kept for parity
    has_tokens = (tokens > 0).to(loss_mat.dtype)
    return (seq * has_tokens).sum() / has_tokens.sum().clamp_min(1.0)


def ppo_clip_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float | Tensor = PpoClipSpec.clip_low,
    clip_high: float | Tensor = PpoClipSpec.clip_high,
    clip_c: float | None = PpoClipSpec.clip_c,
    agg: str | None = "token-mean",
) -> tuple[Tensor, dict[str, float], ClipMasks]:
    """PPO clipped policy loss, as verl's ``compute_policy_loss_vanilla`` computes it.

    Per token t of sample b, with rho = exp(clamp(log_prob - old_log_prob, -20, 20)) and the
    token's bounds clip_low[b, t], clip_high[b, t] (a float bound is every token's, a [B] bound
    every token of its sample's; `entropyrl.core.token_credit.token_clip_bounds` builds [B, T]):
    L = max(-A rho, -A clip(rho, 1 - clip_low[b, t], 1 + clip_high[b, t])); for A < 0 and ``clip_c`` set,
    the dual clip caps it at -clip_c * A (Ye et al. 2019, arXiv 1912.09729). With a float
    ``clip_high`` this equals verl's loss (DAPO clip-higher defaults 0.2 / 0.28).

    Args:
        log_prob, old_log_prob: Tensor[B, T] log-probs of the sampled tokens under the current
            and the rollout policy.
        advantages: Tensor[B] or Tensor[B, T].
        mask: Tensor[B, T] response mask (bool or 0/1).
        clip_low, clip_high: the bounds' epsilons, each a float, Tensor[B] or Tensor[B, T] (>= 0;
            a float clip_low is checked here, tensor bounds where their specs are built).
        clip_c: dual-clip constant (> 1), or None to disable the dual clip.
        agg: ``token-mean`` | ``seq-mean-token-mean`` | ``seq-mean-token-sum``, verl's
            ``agg_loss`` semantics with the normalisers taken from this batch; None: no
            aggregation (the caller aggregates, e.g. with verl's own ``agg_loss``).

    Returns:
        (loss: a scalar, or with ``agg=None`` Tensor[B, T] per-token losses, 0 on masked
        positions; metrics; `ClipMasks`). Metrics: ``clip/frac_high`` (tokens clipped at
        1 + clip_high, A > 0), ``clip/frac_low`` (clipped at 1 - clip_low, A < 0; their sum is
        verl's ``pg_clipfrac``), ``clip/frac_dual`` (dual clip active; verl's
        ``pg_clipfrac_lower``), ``clip/high_mean`` (mean clip_high over samples with a valid
        token; over response tokens for a [B, T] bound), ``ppo_kl``.
    """
    if agg is not None and agg not in AGG_MODES:
        raise ValueError(f"agg must be one of {AGG_MODES} or None, got {agg!r}")
    advantages = _checked_advantages(log_prob, old_log_prob, advantages, mask, clip_low, clip_high)
    if clip_c is not None and not clip_c > 1.0:
        raise ValueError(f"clip_c must be > 1 for dual-clip PPO (or None), got {clip_c}")

    dtype = log_prob.dtype
    m = mask.to(dtype)
    keep = mask.bool()
    n_tok = m.sum().clamp_min(1.0)
    adv = advantages.to(dtype)

    neg_kl, ratio, clipped = _ratio_and_clipped(log_prob, old_log_prob, clip_low, clip_high)
    ppo_kl = torch.where(keep, -neg_kl, 0.0).sum() / n_tok
    pg1 = -adv * ratio
    pg2 = -adv * clipped
    loss1 = torch.maximum(pg1, pg2)
    was_clipped = torch.gt(pg2, pg1) & keep
    if clip_c is not None:
        pg3 = -adv * clip_c
        dual = torch.gt(loss1, pg3) & (adv < 0) & keep
        pg_losses = torch.where(adv < 0, torch.min(pg3, loss1), loss1)
    else:
        dual = torch.zeros_like(keep)
        pg_losses = loss1
    # where, not a product with the mask: padding may hold NaN log-probs or advantages.
    token_loss = torch.where(keep, pg_losses, 0.0)

    sample_has = keep.any(dim=-1)
    if isinstance(clip_high, Tensor) and clip_high.dim() == 2:
        ch = clip_high.to(device=log_prob.device, dtype=torch.float64)
        high_mean = torch.where(keep, ch, 0.0).sum() / keep.sum().clamp_min(1)
    elif isinstance(clip_high, Tensor):
        ch = clip_high.to(device=log_prob.device, dtype=torch.float64)
        high_mean = (ch * sample_has).sum() / sample_has.sum().clamp_min(1)
    else:
        high_mean = torch.tensor(
            float(clip_high) if bool(sample_has.any()) else 0.0, dtype=torch.float64
        )
    n_tok64 = n_tok.to(torch.float64)
    clipped_high, clipped_low = was_clipped & (adv > 0), was_clipped & (adv < 0)
    stats = torch.stack(
        [
            clipped_high.sum().to(torch.float64) / n_tok64,
            clipped_low.sum().to(torch.float64) / n_tok64,
            dual.sum().to(torch.float64) / n_tok64,
            high_mean.to(device=n_tok64.device, dtype=torch.float64),
            ppo_kl.detach().to(torch.float64),
        ]
    ).tolist()
    names = ("clip/frac_high", "clip/frac_low", "clip/frac_dual", "clip/high_mean", "ppo_kl")
    loss = token_loss if agg is None else aggregate(token_loss, mask.to(token_loss.dtype), agg)
    return loss, dict(zip(names, stats)), ClipMasks(clipped_high, clipped_low)


def _checked_advantages(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float | Tensor,
    clip_high: float | Tensor,
) -> Tensor:
    """Shapes checked (the values of the bounds are the specs'); advantages as [B, 1] or [B, T]."""
    if log_prob.dim() != 2:
        raise ValueError(f"log_prob must be [B, T], got shape {tuple(log_prob.shape)}")
    for name, t in (("old_log_prob", old_log_prob), ("mask", mask)):
        if t.shape != log_prob.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != log_prob {tuple(log_prob.shape)}")
    bsz = log_prob.shape[0]
    if advantages.dim() == 1 and advantages.shape[0] == bsz:
        advantages = advantages.unsqueeze(-1)
    elif advantages.shape != log_prob.shape:
        raise ValueError(f"advantages must be [B] or [B, T], got shape {tuple(advantages.shape)}")
    if not isinstance(clip_low, Tensor) and not (clip_low >= 0 and math.isfinite(clip_low)):
        # verl's actor.clip_ratio_low reaches the loss without a spec of ours.
        raise ValueError(f"clip_low must be a finite float >= 0, got {clip_low}")
    for name, bound in (("clip_low", clip_low), ("clip_high", clip_high)):
        if isinstance(bound, Tensor) and not (
            (bound.dim() == 1 and bound.shape[0] == bsz) or bound.shape == log_prob.shape
        ):
            raise ValueError(
                f"{name} as a tensor must be [B] = [{bsz}] (one bound per row) or [B, T] = "
                f"{list(log_prob.shape)} (one per token), got {tuple(bound.shape)}"
            )
    return advantages


def _edge(bound: Tensor, sign: float, like: Tensor) -> Tensor:
    """1 + sign * bound as [B, 1] or [B, T]: computed in float64, then rounded once, so a
    tensor bound gives the same edge a float bound gives."""
    edge = (1.0 + sign * bound.to(device=like.device, dtype=torch.float64)).to(like.dtype)
    return edge.unsqueeze(-1) if edge.dim() == 1 else edge


def _ratio_and_clipped(
    log_prob: Tensor, old_log_prob: Tensor, clip_low: float | Tensor, clip_high: float | Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """(clamped log-ratio, ratio, ratio clipped to [1 - clip_low, 1 + clip_high]), all [B, T]."""
    neg_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(neg_kl)
    if not isinstance(clip_low, Tensor) and not isinstance(clip_high, Tensor):
        return neg_kl, ratio, torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    # A tensor bound needs minimum/maximum: torch.clamp cannot mix a float and a tensor.
    if isinstance(clip_low, Tensor):
        clipped = torch.maximum(ratio, _edge(clip_low, -1.0, ratio))
    else:
        clipped = torch.clamp(ratio, min=1.0 - clip_low)
    if isinstance(clip_high, Tensor):
        clipped = torch.minimum(clipped, _edge(clip_high, 1.0, ratio))
    else:
        clipped = torch.clamp(clipped, max=1.0 + clip_high)
    return neg_kl, ratio, clipped
