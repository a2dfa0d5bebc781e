"""Hallucination credit on the tokens that carry it: token penalty, token clip bounds, shares.

CHAIR names the words of a caption that are hallucinated; the caption reward maps them to the
response's token positions. `hallucinated_tokens` is then a 0/1 float mask [B, T] (1 on the
response tokens of hallucinated mentions). These functions turn it into what the two token-level
mechanisms act on:

- the token penalty moves only those tokens' advantages by -beta (the sequence-level CHAIR
  penalty in the reward punishes every token of a hallucinating caption instead);
- the token clip gives those tokens their own PPO bounds (low and high), every other token the
  base bounds; `entropyrl.core.losses.ppo_clip_loss` takes the resulting [B, T] bounds.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = [
    "hallucinated_token_mask",
    "hallucinated_token_share",
    "token_clip_bounds",
    "token_penalty_advantage",
]


def _checked_mask(hallucinated_tokens: Tensor, mask: Tensor) -> Tensor:
    """The hallucination mask as 0/1 in float, 0 off the response; refuses other values there."""
    if hallucinated_tokens.dim() != 2 or hallucinated_tokens.shape != mask.shape:
        raise ValueError(
            f"hallucinated_tokens must be [B, T] like the response mask {tuple(mask.shape)}, "
            f"got {tuple(hallucinated_tokens.shape)}"
        )
    keep = mask.bool()
    h = hallucinated_tokens.to(torch.float32)
    on = h[keep]
    if not ((on == 0) | (on == 1)).all():
        # NaN or a fractional value on a response token: a bug upstream, never a silent weight.
        raise ValueError("hallucinated_tokens must be 0 or 1 on response tokens (got NaN or other)")
    return torch.where(keep, h, torch.zeros_like(h))


def hallucinated_token_mask(
    positions: Sequence[Sequence[int] | None], mask: Tensor
) -> tuple[Tensor, Tensor]:
    """The [B, T] 0/1 mask of hallucinated response tokens from each row's token positions.

    Args:
        positions: per row, the response token indices (0 = first response token) of its
            hallucinated mentions, or None where CHAIR did not score the row.
        mask: Tensor[B, T] response mask; a position off it is refused (the reward and the
            batch disagree about the response).

    Returns:
        (Tensor[B, T] float32 on ``mask``'s device, Tensor[B] bool: the row was scored).
        An unscored row has no hallucinated token; the caller counts it.
    """
    bsz, length = mask.shape
    if len(positions) != bsz:
        raise ValueError(f"positions has {len(positions)} rows, the batch has {bsz}")
    rows = [b for b, p in enumerate(positions) if p for _ in p]
    cols = [int(t) for p in positions if p for t in p]
    out = torch.zeros((bsz, length), dtype=torch.float32, device=mask.device)
    if cols:
        r = torch.tensor(rows, dtype=torch.long, device=mask.device)
        c = torch.tensor(cols, dtype=torch.long, device=mask.device)
        if bool(((c < 0) | (c >= length)).any()) or not bool(mask.bool()[r, c].all()):
            raise ValueError("a hallucinated token position lies outside its response")
        out[r, c] = 1.0
    scored = torch.tensor([p is not None for p in positions], dtype=torch.bool, device=mask.device)
    return out, scored


def token_penalty_advantage(
    advantages: Tensor, hallucinated_tokens: Tensor, mask: Tensor, *, beta: float
) -> Tensor:
    """A'[b, t] = A[b, t] - beta * hallucinated_tokens[b, t] on response tokens, else A[b, t].

    Every token that is not part of a hallucinated mention keeps its group advantage, so a
    correct word of a hallucinating caption is not punished (the sequence penalty's
    counterpart). Positions off the response keep their input value (padding may hold NaN).

    Args:
        advantages: Tensor[B] (one per sample, broadcast over its tokens) or Tensor[B, T].
        hallucinated_tokens: Tensor[B, T], 0/1 on response tokens (anything off them ignored).
        mask: Tensor[B, T] response mask (bool or 0/1).
        beta: penalty per hallucinated token, finite and >= 0.

    Returns:
        Tensor[B, T] in the advantages' dtype.
    """
    if not (isinstance(beta, int | float) and beta >= 0 and float(beta) != float("inf")):
        raise ValueError(f"beta must be a finite number >= 0, got {beta}")
    h = _checked_mask(hallucinated_tokens, mask)
    if advantages.dim() == 1 and advantages.shape[0] == mask.shape[0]:
        advantages = advantages.unsqueeze(-1).expand(mask.shape)
    elif advantages.shape != mask.shape:
        raise ValueError(f"advantages must be [B] or [B, T], got {tuple(advantages.shape)}")
    return advantages - (float(beta) * h).to(advantages.dtype)


def _per_token(bound: float | Tensor, mask: Tensor, name: str) -> Tensor:
    """A float, [B] or [B, T] bound as Tensor[B, T] float64."""
    if isinstance(bound, Tensor):
        value = bound.to(device=mask.device, dtype=torch.float64)
        if value.dim() == 1 and value.shape[0] == mask.shape[0]:
            return value.unsqueeze(-1).expand(mask.shape)
        if value.shape == mask.shape:
            return value
        raise ValueError(f"{name} must be a float, [B] or [B, T], got {tuple(value.shape)}")
    return torch.full(mask.shape, float(bound), dtype=torch.float64, device=mask.device)


def token_clip_bounds(
    hallucinated_tokens: Tensor,
    mask: Tensor,
    *,
    base_low: float | Tensor,
    base_high: float | Tensor,
    token_low: float,
    token_high: float,
) -> tuple[Tensor, Tensor]:
    """Per-token PPO bounds: (token_low, token_high) on hallucinated tokens, the base elsewhere.

    clip_low[b, t] = token_low if hallucinated_tokens[b, t] == 1 else base_low[b];
    clip_high[b, t] likewise with token_high / base_high. The ratio of token (b, t) is then
    clipped to [1 - clip_low[b, t], 1 + clip_high[b, t]] by `ppo_clip_loss`.

    Args:
        hallucinated_tokens: Tensor[B, T], 0/1 on response tokens.
        mask: Tensor[B, T] response mask.
        base_low, base_high: float or Tensor[B] (a per-sample schedule's bounds) or Tensor[B, T].
        token_low, token_high: the hallucinated tokens' bounds (finite, >= 0).

    Returns:
        (clip_low, clip_high), each Tensor[B, T] float64.
    """
    for name, value in (("token_low", token_low), ("token_high", token_high)):
        if not (isinstance(value, int | float) and 0 <= value < float("inf")):
            raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    on = _checked_mask(hallucinated_tokens, mask).bool()
    low = _per_token(base_low, mask, "base_low")
    high = _per_token(base_high, mask, "base_high")
    low = torch.where(on, torch.full_like(low, float(token_low)), low)
    high = torch.where(on, torch.full_like(high, float(token_high)), high)
    return low, high


def hallucinated_token_share(
    hallucinated_tokens: Tensor, mask: Tensor, scored: Tensor | None = None
) -> tuple[float, int]:
    """(hallucinated tokens / response tokens, response tokens) over the scored rows.

    Args:
        hallucinated_tokens, mask: Tensor[B, T]; scored: Tensor[B] bool (None: every row).

    Returns:
        The share (NaN when no scored row has a response token) and the token count it is over.
    """
    h = _checked_mask(hallucinated_tokens, mask)
    m = mask.to(torch.float64)
    if scored is not None:
        m = m * scored.to(device=m.device, dtype=torch.float64).unsqueeze(-1)
    tokens = float(m.sum())
    if tokens == 0:
        return float("nan"), 0
    return float((h.to(torch.float64) * m).sum()) / tokens, int(tokens)
