"""Token entropy from logits, response segments (<think>...</think>) and per-sample means."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "SEGMENT_MODES",
    "THINK_CLOSE",
    "THINK_OPEN",
    "masked_mean",
    "segment_mask",
    "sequence_entropy",
    "think_tag_ids",
    "token_entropy",
]

SEGMENT_MODES = ("answer", "thinking", "full")


def _rows_entropy(x: Tensor, buffers: tuple[Tensor, Tensor] | None) -> Tensor:
    """Entropy of each row of a [N, V] float32 block: logsumexp(x) - sum softmax(x) * x.

    ``buffers`` (two [>= N, V] float32 tensors) means "no autograd": temporaries are written
    into them in place, so chunks reuse the same memory instead of faulting in fresh pages.
    """
    top = x.amax(dim=-1, keepdim=True)
    # A row maximum of -inf (all logits masked) would give NaN in x - top; shift by 0 instead.
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    if buffers is None:
        z = x - top
        # -inf logits (masked vocabulary) have p = 0; clamping z keeps p * z (and its
        # gradient) at 0 instead of NaN.
        z = z.clamp(min=torch.finfo(z.dtype).min)
        p = torch.exp(z)
        total = p.sum(dim=-1)
        weighted = (p * z).sum(dim=-1)
    else:
        n = x.shape[0]
        z = torch.sub(x, top, out=buffers[0][:n])
        p = torch.exp(z, out=buffers[1][:n])
        total = p.sum(dim=-1)
        # p * z is NaN only where p = 0 and z = -inf (masked vocabulary): those terms are 0.
        # A NaN logit still yields NaN, through the row maximum and `total`.
        weighted = torch.nansum(p.mul_(z), dim=-1)
    # Rounding can leave -1e-7 for a one-hot row; entropy is >= 0.
    return (torch.log(total) - weighted / total).clamp_min(0.0)


def token_entropy(logits: Tensor, chunk_size: int | None = None) -> Tensor:
    """Entropy -sum_v p_v log p_v over the last dim of ``logits``, accumulated in float32.

    Sampling temperature is the caller's business: divide the logits by it first (the entropy
    of the distribution actually sampled from is that of ``logits / temperature``).

    Args:
        logits: Tensor[..., V] (float32, bf16 or fp16; any leading shape).
        chunk_size: process at most this many rows (flattened leading positions) at a time, so
            the float32 temporaries take ``2 * chunk_size * V * 4`` bytes (3x for bf16/fp16
            input) instead of two (three) copies of the whole input. ``None``: all rows at
            once. Rows are independent: on the CPU the result is the same bit for bit either
            way; on CUDA the reduction kernels pick their order by the block's shape, so it
            can differ in float32's last digits (seen on an H200: docs/cuda.md).

    Returns:
        Tensor[...] float32 (differentiable when ``logits`` requires grad).
    """
    if not isinstance(logits, Tensor) or logits.dim() < 1:
        raise ValueError("logits must be a tensor with a vocabulary dimension [..., V]")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
    vocab = logits.shape[-1]
    if vocab == 0:
        raise ValueError("logits has an empty vocabulary dimension")
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size <= 0):
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    lead = logits.shape[:-1]
    rows = logits.reshape(-1, vocab)
    n = rows.shape[0]
    step = max(n, 1) if chunk_size is None else min(chunk_size, max(n, 1))
    buffers = None
    if not (torch.is_grad_enabled() and logits.requires_grad):
        # Without autograd, two float32 blocks of `step` rows hold every temporary, reused
        # from chunk to chunk (a bf16/fp16 input adds its float32 copy of one block).
        buffers = tuple(torch.empty(step, vocab, device=logits.device) for _ in range(2))
    outs = [_rows_entropy(rows[s : s + step].float(), buffers) for s in range(0, max(n, 1), step)]
    out = torch.cat(outs) if len(outs) > 1 else outs[0]
    return out.reshape(lead)


def masked_mean(values: Tensor, mask: Tensor, dim: int | tuple[int, ...] | None = -1) -> Tensor:
    """Mean of ``values`` over positions where ``mask`` is nonzero; 0 where the mask is empty.

    Positions outside the mask are ignored even when they hold NaN/inf. ``dim=None`` reduces
    over every element.
    """
    if values.shape != mask.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} != values shape {tuple(values.shape)}")
    keep = mask.bool()
    picked = torch.where(keep, values, torch.zeros_like(values))
    if dim is None:
        return picked.sum() / keep.sum().clamp_min(1)
    return picked.sum(dim=dim) / keep.sum(dim=dim).clamp_min(1)


def sequence_entropy(token_entropy: Tensor, mask: Tensor) -> Tensor:
    """Tensor[B] mean token entropy over each sample's mask; NaN where the mask is empty.

    NaN (not 0) for an empty segment so the EGPO estimators treat it as "entropy unavailable"
    instead of "maximally confident". Input Tensor[B, T] token entropies and Tensor[B, T] mask.
    """
    if token_entropy.dim() != 2:
        raise ValueError(f"token_entropy must be [B, T], got shape {tuple(token_entropy.shape)}")
    mean = masked_mean(token_entropy.float(), mask, dim=-1)
    return torch.where(mask.bool().any(dim=-1), mean, torch.full_like(mean, float("nan")))


def _tag_starts(ids: Tensor, valid: Tensor, tag: Sequence[int]) -> Tensor:
    """BoolTensor[B, T]: True at t where ``tag`` occurs at t..t+L-1 on valid tokens."""
    length = len(tag)
    bsz, seq = ids.shape
    hit = torch.zeros(bsz, seq, dtype=torch.bool, device=ids.device)
    if length == 0 or length > seq:
        return hit
    span = seq - length + 1
    window = torch.ones(bsz, span, dtype=torch.bool, device=ids.device)
    for k, tok in enumerate(tag):  # loop over the tag's length only, not the batch
        window &= (ids[:, k : k + span] == int(tok)) & valid[:, k : k + span]
    hit[:, :span] = window
    return hit


def segment_mask(
    response_ids: Tensor,
    response_mask: Tensor,
    open_ids: Sequence[int],
    close_ids: Sequence[int],
    mode: str,
) -> tuple[Tensor, Tensor]:
    """Mask of the response tokens whose entropy defines H_i, located on token ids.

    Modes:
        ``answer``: tokens after the LAST closing tag. Parsers of reasoning models keep what
            follows the final ``</think>`` (``text.split("</think>")[-1]``); a model that
            closes, reopens and closes again has its answer after the last one. Only the
            closing tag is needed, since chat templates often put ``<think>`` in the prompt.
        ``thinking``: tokens strictly between the opening tag and the last closing tag; the
            opening tag is the first one before that closing tag, or, when there is none, the
            region starts at the first response token (opening tag in the prompt).
            ``thinking``, the tags and ``answer`` therefore partition the response.
        ``full``: the whole response.

    Args:
        response_ids: LongTensor[B, T]. response_mask: Tensor[B, T] (bool or 0/1); tags are
            matched on valid tokens only.
        open_ids, close_ids: the tags as token-id sequences (one special token, or several
            ordinary tokens).

    Returns:
        (mask BoolTensor[B, T], found BoolTensor[B]). ``found[b]`` is True when the needed tag
        was present AND the segment is non-empty. Otherwise (missing tag, or a tag at the very
        end leaving an empty answer) the mask falls back to ``response_mask``: an empty segment
        has no entropy, and 0 would read as "maximally confident" to the ratio estimator.
        Callers count ``~found`` as the fallback metric.
    """
    if mode not in SEGMENT_MODES:
        raise ValueError(f"mode must be one of {SEGMENT_MODES}, got {mode!r}")
    if response_ids.dim() != 2:
        raise ValueError(f"response_ids must be [B, T], got shape {tuple(response_ids.shape)}")
    if response_mask.shape != response_ids.shape:
        raise ValueError(
            f"response_mask shape {tuple(response_mask.shape)} != response_ids shape "
            f"{tuple(response_ids.shape)}"
        )
    valid = response_mask.bool()
    if mode == "full":
        return valid.clone(), valid.any(dim=-1)
    if len(close_ids) == 0:
        raise ValueError("close_ids must name at least one token id")
    if mode == "thinking" and len(open_ids) == 0:
        raise ValueError("open_ids must name at least one token id")
    bsz, seq = response_ids.shape
    pos = torch.arange(seq, device=response_ids.device).expand(bsz, seq)
    close_at = _tag_starts(response_ids, valid, close_ids)
    if seq == 0:
        return valid.clone(), torch.zeros(bsz, dtype=torch.bool, device=valid.device)
    last_close = torch.where(close_at, pos, torch.full_like(pos, -1)).amax(dim=-1)
    has_close = last_close >= 0
    if mode == "answer":
        seg = valid & (pos >= (last_close + len(close_ids)).unsqueeze(-1))
    else:
        open_at = _tag_starts(response_ids, valid, open_ids)
        # Only an opening tag that ends before the last closing tag starts the thinking span.
        before = open_at & (pos + len(open_ids) <= last_close.unsqueeze(-1))
        first_open = torch.where(before, pos, torch.full_like(pos, seq)).amin(dim=-1)
        start = torch.where(first_open < seq, first_open + len(open_ids), 0)
        seg = valid & (pos >= start.unsqueeze(-1)) & (pos < last_close.unsqueeze(-1))
    seg = seg & has_close.unsqueeze(-1)
    found = seg.any(dim=-1)
    return torch.where(found.unsqueeze(-1), seg, valid), found


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def think_tag_ids(tokenizer: Any) -> tuple[list[int], list[int]]:
    """Token ids of `<think>` and `</think>` (one special token or several ordinary ones)."""
    open_ids = list(tokenizer.encode(THINK_OPEN, add_special_tokens=False))
    close_ids = list(tokenizer.encode(THINK_CLOSE, add_special_tokens=False))
    if not close_ids:
        raise ValueError(f"the tokenizer encodes {THINK_CLOSE!r} to no tokens")
    return open_ids, close_ids
