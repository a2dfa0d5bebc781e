"""The entropy-aware trainer's step logic as pure functions on padded tensors.

`EntropyPPOTrainer._compute_advantage` only fetches fields from verl's TransferQueue, calls
these, and writes the results back; tests call them on hand-built batches. Settings come from
the algorithm sections (`entropyrl.core.specs`): `algorithm.entropy.{mode, source}` shape the
estimators' entropy input, `algorithm.clip_schedule.*` turns each sample's CHAIR_i into its
clip_high bound, `algorithm.clip_low_schedule.*` into its clip_low bound; the token mechanisms
(`algorithm.token_penalty`, `algorithm.token_clip`) read the response token positions of each
sample's hallucinated mentions from the reward's extra info.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from entropyrl.core.algorithms import entropy_inputs
from entropyrl.core.clip_schedules import clip_high_bounds, clip_low_bounds
from entropyrl.core.estimator_names import ESTIMATOR_NEEDS
from entropyrl.core.specs import AlgorithmSpecs, ClipScheduleSpec
from entropyrl.core.token_credit import (
    hallucinated_token_share,
    token_penalty_advantage,
)

# The caption reward's extra-info keys: response token indices of the hallucinated mentions
# (a reward that knows them), and their character spans in the decoded response as a JSON
# string (the caption reward under verl).
from entropyrl.rewards.caption import SPANS_KEY, TOKEN_POSITIONS_KEY
from entropyrl.verl.inputs import Step


def build_step(
    *,
    specs: AlgorithmSpecs,
    estimator: str,
    response_mask: torch.Tensor,
    responses: torch.Tensor | None,
    entropy: torch.Tensor | None,
    old_log_probs: torch.Tensor | None,
    ref_log_prob: torch.Tensor | None,
    think_ids: tuple[Sequence[int], Sequence[int]] | None,
    clip_high: torch.Tensor | None = None,
) -> tuple[Step, dict[str, float]]:
    """The step context for `estimator` (tensors [B, T]; `clip_high` [B]) and its metrics.

    What goes in follows the estimator's declaration (`entropyrl.core.estimator_names`): per-token
    entropy and its segment for those that read entropy, the reference log-probs for those that
    read them. Missing entropy (verl's bypass mode, or a worker that did not compute it) leaves
    `token_entropy` None: the estimators then fall back to GRPO and count it.
    """
    needs = ESTIMATOR_NEEDS.get(estimator, {})
    token_entropy = segment = None
    metrics: dict[str, float] = {}
    if needs.get("entropy"):
        token_entropy, segment, found = entropy_inputs(
            specs.entropy,
            response_mask,
            entropy=entropy,
            old_log_prob=old_log_probs,
            responses=responses,
            think_ids=think_ids,
        )
        if found is not None:
            rows = response_mask.bool().any(dim=-1)
            metrics["egpo/segment/fallback"] = float((rows & ~found).sum().item())
    step = Step(
        specs=specs,
        token_entropy=token_entropy,
        segment_mask=segment,
        ref_log_prob=ref_log_prob if needs.get("reference") else None,
        clip_high=clip_high,
    )
    return step, metrics


def _unwrap(value: Any) -> Any:
    # TransferQueue hands non-tensor fields back as NonTensorData wrappers or plain objects.
    return getattr(value, "data", value)


def _reward_info(fields: Any) -> Mapping[str, Any] | None:
    fields = _unwrap(fields)
    info = fields.get("reward_extra_info", {}) if isinstance(fields, Mapping) else {}
    info = _unwrap(info) if info is not None else {}
    return info if isinstance(info, Mapping) else None


def _finite_value(info: Mapping[str, Any] | None, name: str) -> float | None:
    """`info[name]` as a finite float, else None (absent, not a number, NaN or infinite)."""
    if info is None:
        return None
    try:
        value = float(info.get(name))
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def reward_infos(extra_fields: Sequence[Any]) -> list[dict[str, Any] | None]:
    """Each row's reward extra info as plain values (what the reward reported beside its score:
    the caption reward's `cider`, `chair_i`, ...), for the trace."""
    infos = []
    for fields in extra_fields:
        info = _reward_info(fields)
        infos.append(None if info is None else {k: _unwrap(v) for k, v in info.items()})
    return infos


def _real_rows(
    extra_fields: Sequence[Any], valid: torch.Tensor | None
) -> list[Mapping[str, Any] | None]:
    """The reward's extra info of each row, verl's synthetic padding rows (`valid` False) left out."""
    infos = [_reward_info(fields) for fields in extra_fields]
    if valid is None:
        return infos
    return [info for info, keep in zip(infos, valid.tolist()) if keep]


def chair_from_extra_fields(extra_fields: Sequence[Any] | None, batch_size: int) -> torch.Tensor:
    """CHAIR_i per sample [B] from verl's per-sample `extra_fields["reward_extra_info"]`.

    NaN where the reward did not report a score (CHAIR service down, unknown image, or a reward
    without CHAIR): a missing score is NaN and nothing else.
    """
    values = torch.full((batch_size,), float("nan"), dtype=torch.float32)
    if extra_fields is None:
        return values
    extra_fields = list(extra_fields)
    if len(extra_fields) != batch_size:
        raise ValueError(f"extra_fields has {len(extra_fields)} rows, the batch has {batch_size}")
    for i, fields in enumerate(extra_fields):
        value = _finite_value(_reward_info(fields), "chair_i")
        if value is not None:
            values[i] = value
    return values


# The caption reward's parts (`entropyrl.rewards.caption.CAPTION_FIELDS`) logged per step beside
# verl's `critic/score`, so a user tuning `chair_weight` sees which part moved.
REWARD_PARTS = ("cider", "chair_s", "recall", "hallucinated", "words")


def reward_part_metrics(
    extra_fields: Sequence[Any] | None, valid: torch.Tensor | None = None
) -> dict[str, float]:
    """`reward/<part>/mean` over this step's real rows that report the part with a finite value
    (a caption the CHAIR service did not score has no CHAIR_s or recall); empty for rewards
    without these parts."""
    if extra_fields is None:
        return {}
    infos = _real_rows(extra_fields, valid)
    metrics = {}
    for part in REWARD_PARTS:
        values = [v for v in (_finite_value(info, part) for info in infos) if v is not None]
        if values:
            metrics[f"reward/{part}/mean"] = sum(values) / len(values)
    return metrics


def _chair_rows(
    extra_fields: Sequence[Any] | None, valid: torch.Tensor | None
) -> list[Mapping[str, Any]]:
    """The real rows' reward infos that report CHAIR (a `chair_i` key, NaN when unscored)."""
    if extra_fields is None:
        return []
    return [info for info in _real_rows(extra_fields, valid) if info and "chair_i" in info]


def chair_fallback_rows(
    extra_fields: Sequence[Any] | None, valid: torch.Tensor | None = None
) -> list[dict[str, Any]]:
    """The reward infos (plain values) of the real rows the CHAIR service gave no answer for: no
    finite CHAIR_i and the reward's `chair_fallback` mark (`entropyrl.rewards.caption`)."""
    return [
        {key: _unwrap(value) for key, value in info.items()}
        for info in _chair_rows(extra_fields, valid)
        if _finite_value(info, "chair_i") is None
        and bool(_unwrap(info.get("chair_fallback", False)))
    ]


def chair_reporting_rows(
    extra_fields: Sequence[Any] | None, valid: torch.Tensor | None = None
) -> int:
    """How many real rows report CHAIR at all (scored or not): 0 for a reward without it."""
    return len(_chair_rows(extra_fields, valid))


def chair_status_metrics(
    extra_fields: Sequence[Any] | None, valid: torch.Tensor | None = None
) -> dict[str, float]:
    """How this step's samples fared with the CHAIR service (counts over real rows).

    `chair/scored_samples`: a finite CHAIR_i; `chair/fallback_samples`: the service gave no
    answer (unreachable, the documented fallback); `chair/error_samples`: it answered with an
    error for that caption (e.g. an unknown image id). Empty when the reward reports no CHAIR.
    """
    infos = _chair_rows(extra_fields, valid)
    if not infos:
        return {}
    scored = sum(1 for info in infos if _finite_value(info, "chair_i") is not None)
    fallback = len(chair_fallback_rows(extra_fields, valid))
    return {
        "chair/scored_samples": float(scored),
        "chair/fallback_samples": float(fallback),
        "chair/error_samples": float(len(infos) - scored - fallback),
    }


def clip_high_from_chair(
    chair_i: torch.Tensor, spec: ClipScheduleSpec, valid: torch.Tensor | None = None
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """Per-sample clip_high [B] from CHAIR_i [B] (NaN = unavailable), or None when disabled.

    Disabled, verl's own `actor.clip_ratio_high` applies to every sample (the loss runs as
    verl's `vanilla`). Samples without CHAIR get the schedule's neutral value and are counted in
    `chair/unavailable`. `valid` [B] (bool) leaves rows out of the metrics: verl's synthetic
    padding rows copy a real row's reward info and carry no loss.
    """
    if not spec.enable:
        return None, {}
    clip_high = clip_high_bounds(chair_i, spec)
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
                # loss reports its own `clip/high_mean` (over the samples it trained on).
                "clip/bound_mean": float(clip_valid.mean().item()),
                "clip/bound_min": float(clip_valid.min().item()),
                "clip/bound_max": float(clip_valid.max().item()),
            }
        )
    metrics.update(chair_score_metrics(chair_i, spec.threshold, valid))
    return clip_high, metrics


def chair_score_metrics(
    chair_i: torch.Tensor, threshold: float, valid: torch.Tensor | None = None
) -> dict[str, float]:
    """`chair/chair_i_mean` and `chair/hallucinated_frac` (CHAIR_i >= `threshold`, the clip
    schedule's) over the `valid` rows CHAIR scored; empty when it scored none. Logged whether or
    not a schedule is on, so runs with and without one compare on the same figures."""
    rows = chair_i if valid is None else chair_i[valid]
    scored = rows[torch.isfinite(rows)]
    if not scored.numel():
        return {}
    return {
        "chair/chair_i_mean": float(scored.mean().item()),
        "chair/hallucinated_frac": float((scored >= threshold).float().mean().item()),
    }


def clip_low_from_chair(
    chair_i: torch.Tensor, spec: ClipScheduleSpec, valid: torch.Tensor | None = None
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """Per-sample clip_low [B] from CHAIR_i [B] under the clip-low schedule, or None when off
    (verl's `actor.clip_ratio_low` for every sample); `clip/low_bound_*` over `valid` rows."""
    if not spec.enable:
        return None, {}
    clip_low = clip_low_bounds(chair_i, spec)
    rows = clip_low if valid is None else clip_low[valid]
    if not rows.numel():
        return clip_low, {}
    return clip_low, {
        "clip/low_bound_mean": float(rows.mean().item()),
        "clip/low_bound_min": float(rows.min().item()),
        "clip/low_bound_max": float(rows.max().item()),
    }


def _positions(value: Any) -> list[int] | None:
    value = _unwrap(value)
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    try:
        return [int(t) for t in value]
    except (TypeError, ValueError):
        raise ValueError(
            f"reward extra info {TOKEN_POSITIONS_KEY!r} must be a list of token indices, "
            f"got {value!r}"
        ) from None


def _spans(value: Any) -> list[list[int]] | None:
    value = _unwrap(value)
    if value is None:
        return None
    try:
        spans = json.loads(value) if isinstance(value, str) else value
        return [[int(a), int(b)] for a, b in spans]
    except (TypeError, ValueError):
        raise ValueError(
            f"reward extra info {SPANS_KEY!r} must be a JSON list of [start, end] character "
            f"spans, got {value!r}"
        ) from None


def token_positions_from_spans(
    extra_fields: Sequence[Any] | None,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    tokenizer: Any,
) -> list[list[int] | None]:
    """Each row's hallucinated response token indices, from its reward's character spans.

    Args:
        extra_fields: per row, verl's extra fields (the reward's extra info inside), or None.
        responses: LongTensor[B, T] response ids, padded.
        response_mask: Tensor[B, T]; a row's response is its ids up to its last masked token.
        tokenizer: the model's tokenizer, which verl's reward manager decoded the responses
            with (``skip_special_tokens=True``): the spans index that string.

    Returns:
        Per row, the indices (0 = first response token) of the tokens overlapping a span
        (`entropyrl.rewards.token_spans`), or None where the reward gave neither spans nor
        positions (CHAIR did not score the caption). A row with `TOKEN_POSITIONS_KEY` and no
        spans keeps those positions. ValueError when a span lies past the decoded response
        (the reward scored another string).
    """
    from entropyrl.rewards.token_spans import hallucinated_positions, response_offsets

    batch = response_mask.shape[0]
    rows = [None] * batch if extra_fields is None else list(extra_fields)
    if len(rows) != batch:
        raise ValueError(f"extra_fields has {len(rows)} rows, the batch has {batch}")
    mask = response_mask.bool()
    # each row's response: its ids up to its last response token
    lengths = torch.where(
        mask.any(dim=1), mask.shape[1] - mask.flip(1).int().argmax(dim=1), 0
    ).tolist()
    out: list[list[int] | None] = []
    for b, fields in enumerate(rows):
        info = _reward_info(fields)
        spans = None if info is None else _spans(info.get(SPANS_KEY))
        if spans is None:
            out.append(None if info is None else _positions(info.get(TOKEN_POSITIONS_KEY)))
            continue
        text, offsets = response_offsets(tokenizer, responses[b, : lengths[b]].tolist())
        if any(end > len(text) for _, end in spans):
            raise ValueError(
                f"row {b}: a hallucinated span ends past the decoded response ({len(text)} "
                f"characters): the reward scored another string than "
                "tokenizer.decode(response, skip_special_tokens=True)"
            )
        out.append(hallucinated_positions(spans, offsets))
    return out


def token_credit_metrics(
    hallucinated: torch.Tensor,
    response_mask: torch.Tensor,
    scored: torch.Tensor,
    valid: torch.Tensor | None = None,
) -> dict[str, float]:
    """`token_credit/hallucinated_token_frac` (over scored real rows' response tokens) and
    `token_credit/unscored_samples` (real rows without token positions)."""
    real = scored if valid is None else scored & valid
    share, _ = hallucinated_token_share(hallucinated, response_mask, real)
    unscored = (~scored) if valid is None else (~scored & valid)
    return {
        "token_credit/hallucinated_token_frac": share,
        "token_credit/unscored_samples": float(unscored.sum().item()),
    }


def require_token_positions(scored: torch.Tensor, valid: torch.Tensor | None, what: str) -> None:
    """Refuse a step where no real row reports token positions while `what` is on."""
    real = scored if valid is None else scored[valid]
    if real.numel() and not bool(real.any()):
        raise ValueError(
            f"{what} is on but no sample of this step reports {SPANS_KEY!r} or "
            f"{TOKEN_POSITIONS_KEY!r}: use the "
            "caption reward with CHAIR spans (entropyrl.rewards.caption)"
        )


def token_penalty_from_step(
    advantages: torch.Tensor,
    hallucinated: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    beta: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's advantages [B, T] with -beta on each hallucinated token (`token_penalty_advantage`)
    and the step's `token_credit/penalised_tokens`."""
    moved = token_penalty_advantage(advantages, hallucinated, response_mask, beta=beta)
    on = hallucinated.bool() & response_mask.bool()
    return moved, {"token_credit/penalised_tokens": float(on.sum().item())}
