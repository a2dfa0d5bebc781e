"""PPO clipped surrogate with per-sample clip bounds, dual clip and verl's aggregation modes."""

from __future__ import annotations

import torch
from torch import Tensor

from entropyrl.specs import PpoClipSpec

__all__ = ["AGG_MODES", "aggregate", "ppo_clip_loss", "ppo_clip_masks", "ppo_clip_token_loss"]

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def _check_bound(value: float | Tensor, name: str, bsz: int) -> None:
    if isinstance(value, Tensor):
        if value.dim() != 1 or value.shape[0] != bsz:
            raise ValueError(f"{name} as a tensor must be [B] = [{bsz}], got {tuple(value.shape)}")
        if not torch.isfinite(value).all() or (value < 0).any():
            raise ValueError(f"{name} must be finite and >= 0")
    elif not (value >= 0 and value == value and value != float("inf")):
        raise ValueError(f"{name} must be a finite float >= 0, got {value}")


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
    clip_low: float = PpoClipSpec.clip_low,
    clip_high: float | Tensor = PpoClipSpec.clip_high,
    clip_c: float | None = PpoClipSpec.clip_c,
    agg: str = "token-mean",
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped policy loss of one batch, aggregated within it (see `ppo_clip_token_loss`).

    ``agg``: ``token-mean`` | ``seq-mean-token-mean`` | ``seq-mean-token-sum``, verl's
    ``agg_loss`` semantics with the normalisers taken from this batch.

    Returns:
        (scalar loss, metrics of `ppo_clip_token_loss`).
    """
    if agg not in AGG_MODES:
        raise ValueError(f"agg must be one of {AGG_MODES}, got {agg!r}")
    token_loss, metrics = ppo_clip_token_loss(
        log_prob,
        old_log_prob,
        advantages,
        mask,
        clip_low=clip_low,
        clip_high=clip_high,
        clip_c=clip_c,
    )
    return aggregate(token_loss, mask.to(token_loss.dtype), agg), metrics


def ppo_clip_token_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = PpoClipSpec.clip_low,
    clip_high: float | Tensor = PpoClipSpec.clip_high,
    clip_c: float | None = PpoClipSpec.clip_c,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped policy loss per token, as verl's ``compute_policy_loss_vanilla`` computes it.

    Per token, with rho = exp(clamp(log_prob - old_log_prob, -20, 20)) and
    eps_high = clip_high[b] (a per-sample bound broadcast over the sample's tokens):
    L = max(-A rho, -A clip(rho, 1 - clip_low, 1 + eps_high)); for A < 0 and ``clip_c`` set,
    the dual clip caps it at -clip_c * A (Ye et al. 2019, arXiv 1912.09729). With a float
    ``clip_high`` this equals verl's loss (DAPO clip-higher defaults 0.2 / 0.28).

    Args:
        log_prob, old_log_prob: Tensor[B, T] log-probs of the sampled tokens under the current
            and the rollout policy.
        advantages: Tensor[B] or Tensor[B, T].
        mask: Tensor[B, T] response mask (bool or 0/1).
        clip_low: eps_low (>= 0). clip_high: float or Tensor[B] (>= 0).
        clip_c: dual-clip constant (> 1), or None to disable the dual clip.

    Returns:
        (Tensor[B, T] per-token losses, 0 on masked positions; metrics): ``clip/frac_high`` (tokens clipped at 1 + eps_high, A > 0),
        ``clip/frac_low`` (clipped at 1 - eps_low, A < 0); their sum is verl's
        ``pg_clipfrac``), ``clip/frac_dual`` (dual clip active; verl's ``pg_clipfrac_lower``),
        ``clip/high_mean`` (mean eps_high over samples with a valid token), ``ppo_kl``.
    """
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
    if isinstance(clip_high, Tensor):
        ch = clip_high.to(device=log_prob.device, dtype=torch.float64)
        high_mean = (ch * sample_has).sum() / sample_has.sum().clamp_min(1)
    else:
        high_mean = torch.tensor(
            float(clip_high) if bool(sample_has.any()) else 0.0, dtype=torch.float64
        )
    n_tok64 = n_tok.to(torch.float64)
    stats = torch.stack(
        [
            (was_clipped & (adv > 0)).sum().to(torch.float64) / n_tok64,
            (was_clipped & (adv < 0)).sum().to(torch.float64) / n_tok64,
            dual.sum().to(torch.float64) / n_tok64,
            high_mean.to(device=n_tok64.device, dtype=torch.float64),
            ppo_kl.detach().to(torch.float64),
        ]
    ).tolist()
    names = ("clip/frac_high", "clip/frac_low", "clip/frac_dual", "clip/high_mean", "ppo_kl")
    return token_loss, dict(zip(names, stats))


def ppo_clip_masks(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = PpoClipSpec.clip_low,
    clip_high: float | Tensor = PpoClipSpec.clip_high,
) -> tuple[Tensor, Tensor]:
    """Which tokens the clipped surrogate cuts off, per token, for statistics per sample.

    The same tokens `ppo_clip_token_loss` counts in ``clip/frac_high`` (ratio above
    1 + eps_high with A > 0) and ``clip/frac_low`` (ratio below 1 - eps_low with A < 0), with
    the same arithmetic, so that a caller can split those fractions by groups of samples
    (e.g. hallucinating vs clean captions); the batch fractions are ``mask.sum() / tokens``.

    Args: as `ppo_clip_token_loss` (no gradient is needed; inputs are detached).

    Returns:
        (high BoolTensor[B, T], low BoolTensor[B, T]), False on masked positions.
    """
    advantages = _checked_advantages(log_prob, old_log_prob, advantages, mask, clip_low, clip_high)
    with torch.no_grad():
        adv = advantages.detach().to(log_prob.dtype)
        _, ratio, clipped = _ratio_and_clipped(
            log_prob.detach(), old_log_prob.detach(), clip_low, clip_high
        )
        # Clipped exactly where the loss takes the clipped branch: -A * clipped > -A * ratio.
        was_clipped = torch.gt(-adv * clipped, -adv * ratio) & mask.bool()
        return was_clipped & (adv > 0), was_clipped & (adv < 0)


def _checked_advantages(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float | Tensor,
) -> Tensor:
    """Shapes and bounds checked; advantages as [B, 1] (per sample) or [B, T]."""
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
    if isinstance(clip_low, Tensor):
        raise ValueError("clip_low must be a float (only clip_high may vary per sample)")
    _check_bound(clip_low, "clip_low", bsz)
    _check_bound(clip_high, "clip_high", bsz)
    return advantages


def _ratio_and_clipped(
    log_prob: Tensor, old_log_prob: Tensor, clip_low: float, clip_high: float | Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """(clamped log-ratio, ratio, ratio clipped to [1 - eps_low, 1 + eps_high]), all [B, T]."""
    neg_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(neg_kl)
    if isinstance(clip_high, Tensor):
        # 1 + eps in float64, then rounded once: the same bound a float clip_high gives.
        upper = (1.0 + clip_high.to(device=log_prob.device, dtype=torch.float64)).to(ratio.dtype)
        # A tensor bound needs minimum/maximum: torch.clamp cannot mix a float and a tensor.
        clipped = torch.minimum(torch.clamp(ratio, min=1.0 - clip_low), upper.unsqueeze(-1))
    else:
        clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return neg_kl, ratio, clipped
