"""One GRPO-family step and one supervised step of the local runner, for any `Task`.

The RL step follows the project's data flow of one training step: sample n responses per prompt,
score them once, compute old log-probs and full-vocabulary token entropies at the sampling
temperature, group-relative advantages with the chosen entropy guidance
(`entropyrl.core.advantages`, `entropyrl.core.maxent`), per-sample clip_high (and clip_low) from
each sample's CHAIR_i (`entropyrl.core.clip_schedules`), the token mechanisms on the tokens of
hallucinated mentions (`entropyrl.core.token_credit`), then PPO updates
(`entropyrl.core.losses.ppo_clip_loss`) over several mini-batches so the clip bounds act. Formulas
live in those modules; this one only moves tensors.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from entropyrl.core.algorithms import Estimate, EstimatorInputs, entropy_inputs, estimate
from entropyrl.core.clip_schedules import clip_high_bounds, clip_low_bounds
from entropyrl.core.entropy import masked_mean
from entropyrl.core.losses import ppo_clip_loss
from entropyrl.core.specs import AlgorithmSpecs, ClipScheduleSpec, PpoClipSpec
from entropyrl.core.token_credit import (
    hallucinated_token_mask,
    hallucinated_token_share,
    token_clip_bounds,
    token_penalty_advantage,
)
from entropyrl.rig.local.policy import (
    expand_prompts,
    generate,
    response_log_probs,
    select_rows,
)

__all__ = [
    "RLSettings",
    "RewardOutput",
    "Task",
    "compute_advantages",
    "hallucination_split_metrics",
    "kl_k3",
    "rl_step",
    "sample_clip_high",
    "sample_clip_low",
    "supervised_step",
    "token_credit",
    "token_entropy_split",
]


@dataclass
class RewardOutput:
    """Scores of a rollout batch. Arrays have shape [N]; `chair_i` is NaN where unavailable.

    `hallucinated_positions`: per response, the token indices (0 = first response token) of its
    hallucinated mentions, None where CHAIR did not score it; None for a reward without spans.
    """

    scores: np.ndarray
    chair_i: np.ndarray | None
    metrics: dict[str, float]
    hallucinated_positions: list[list[int] | None] | None = None


class Task(Protocol):
    """What the RL step needs from a task (captioning, function calling)."""

    def prompts(self, items: Sequence[Any]) -> dict[str, Tensor]:
        """Model inputs of the prompts of `items` ([B, P], left-padded)."""

    def reward(
        self, texts: Sequence[str], items: Sequence[Any], responses: Tensor | None = None
    ) -> RewardOutput:
        """Score decoded responses (one call per rollout batch); `responses` [N, R] are the ids
        the texts were decoded from, so token positions index the sampled tokens."""


@dataclass
class RLSettings:
    """What `rl_step` reads; built from a `DemoConfig` by `entropyrl.rig.local.runner.rl_settings`.

    `specs` are the algorithm sections (the same as verl's `algorithm.*`); `ppo` the clip
    constants, whose `clip_high` every sample gets when the clip schedule is disabled.
    """

    adv: str
    specs: AlgorithmSpecs
    ppo: PpoClipSpec
    samples_per_prompt: int
    temperature: float
    max_new_tokens: int
    num_minibatches: int
    ppo_epochs: int
    kl_coef: float
    max_grad_norm: float
    think_ids: tuple[list[int], list[int]] | None = None
    token_penalty_beta: float | None = None
    token_clip: tuple[float, float] | None = None
    clip_low_schedule: ClipScheduleSpec | None = None

    @property
    def token_mechanisms(self) -> bool:
        """Whether a mechanism reads the hallucinated tokens (the reward must report them)."""
        return self.token_penalty_beta is not None or self.token_clip is not None


def kl_k3(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref) (Schulman 2020; verl's `low_var_kl`), [B, T]."""
    delta = (ref_log_prob - log_prob).clamp(-20.0, 20.0)
    return (torch.exp(delta) - delta - 1.0).clamp(-10.0, 10.0)


def compute_advantages(
    settings: RLSettings,
    scores: Tensor,
    group: Tensor,
    token_entropy: Tensor,
    mask: Tensor,
    *,
    responses: Tensor | None = None,
    old_log_prob: Tensor | None = None,
    ref_seq_log_prob: Tensor | None = None,
) -> Estimate:
    """The chosen estimator's advantages (`entropyrl.core.algorithms`, the table verl registers).

    `token_entropy` [N, T] is the rollout policy's entropy at the sampling temperature;
    `settings.specs.entropy` picks which quantity (entropy or the sampled token's NLL, from
    `old_log_prob`) and which tokens (`responses` locate `<think>` tags) form H_i.
    """
    per_token, segment, _ = entropy_inputs(
        settings.specs.entropy,
        mask,
        entropy=token_entropy,
        old_log_prob=old_log_prob,
        responses=responses,
        think_ids=settings.think_ids,
    )
    inputs = EstimatorInputs(
        scores=scores,
        group=group,
        mask=mask,
        token_entropy=per_token,
        segment_mask=segment,
        ref_seq_log_prob=ref_seq_log_prob,
    )
    return estimate(settings.adv, inputs, settings.specs)


def sample_clip_high(settings: RLSettings, chair_i: np.ndarray | None, size: int) -> Tensor:
    """clip_high per sample [N] (float32): the clip schedule's bounds from CHAIR_i (NaN or None =
    unscored: the neutral bound), or `settings.ppo.clip_high` for all when it is disabled."""
    spec = settings.specs.clip_schedule
    if not spec.enable:
        return torch.full((size,), float(settings.ppo.clip_high), dtype=torch.float32)
    chair = None if chair_i is None else torch.as_tensor(chair_i, dtype=torch.float32)
    return clip_high_bounds(chair, spec, batch_size=size)


def sample_clip_low(settings: RLSettings, chair_i: np.ndarray | None, size: int) -> Tensor | float:
    """clip_low per sample [N] from the clip-low schedule, or `settings.ppo.clip_low` when off."""
    spec = settings.clip_low_schedule
    if spec is None or not spec.enable:
        return float(settings.ppo.clip_low)
    chair = None if chair_i is None else torch.as_tensor(chair_i, dtype=torch.float32)
    return clip_low_bounds(chair, spec, batch_size=size)


def token_credit(
    settings: RLSettings,
    reward: RewardOutput,
    adv: Tensor,
    mask: Tensor,
    clip_low: Tensor | float,
    clip_high: Tensor,
) -> tuple[Tensor, Tensor | float, Tensor, dict[str, float]]:
    """The token penalty on `adv` [N, T] and the token clip's [N, T] bounds, when they are on.

    Returns (advantages, clip_low, clip_high, metrics); unchanged inputs when both are off. A
    reward without token positions is refused: the mechanisms would do nothing, silently.
    """
    if not settings.token_mechanisms:
        return adv, clip_low, clip_high, {}
    if reward.hallucinated_positions is None:
        raise ValueError(
            "token_penalty / token_clip need the reward's hallucinated token positions "
            "(the captioning task with CHAIR on)"
        )
    hall, scored = hallucinated_token_mask(reward.hallucinated_positions, mask)
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1).expand(mask.shape)
    if settings.token_penalty_beta is not None:
        adv = token_penalty_advantage(adv, hall, mask, beta=settings.token_penalty_beta)
    if settings.token_clip is not None:
        clip_low, clip_high = token_clip_bounds(
            hall,
            mask,
            base_low=clip_low,
            base_high=clip_high,
            token_low=settings.token_clip[0],
            token_high=settings.token_clip[1],
        )
    share, _ = hallucinated_token_share(hall, mask, scored)
    metrics = {
        "hallucinated_token_frac": share,
        "token_unscored": float((~scored).sum()),
    }
    return adv, clip_low, clip_high, metrics


def token_entropy_split(
    positions: Sequence[Sequence[int] | None] | None, entropy: Tensor, mask: Tensor
) -> dict[str, float]:
    """Mean token entropy on hallucinated mention tokens and on the other tokens of scored rows.

    What the token mechanisms act on: the tokens CHAIR marks, against every other response token
    of a row CHAIR scored. A side with no token in this batch has no key (nothing measured).

    Args:
        positions: per row, its hallucinated token indices (None: unscored), or None (no CHAIR).
        entropy, mask: [N, T] per-token entropy and response mask.
    """
    if positions is None:
        return {}
    hall, scored = hallucinated_token_mask(positions, mask)
    tokens = mask.detach().to(torch.float64).cpu() * scored.cpu().to(torch.float64).unsqueeze(-1)
    hall = hall.detach().cpu().to(torch.float64) * tokens
    ent = entropy.detach().to(torch.float64).cpu()
    out: dict[str, float] = {}
    for name, weight in (("hallucinated_tokens", hall), ("clean_tokens", tokens - hall)):
        count = float(weight.sum())
        if count > 0:
            out[f"entropy/{name}"] = float((ent * weight).sum()) / count
    return out


def _mean(values: Tensor | np.ndarray) -> float:
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    return float(values.mean()) if values.size else float("nan")


def hallucination_split_metrics(
    chair_i: np.ndarray | None,
    entropy: Tensor,
    mask: Tensor,
    clipped_high: Tensor,
    clipped_low: Tensor,
    updates: int,
) -> dict[str, float]:
    """Token entropy and clip fractions of hallucinating vs clean samples of one rollout batch.

    The per-sample clip bound is meant to treat the two groups differently, so the step reports
    what each group's tokens did: a sample is hallucinated when CHAIR scored it above 0, clean
    when it scored 0, in neither group when unscored. Per group g, over its tokens:
    ``entropy/g`` = their mean entropy at the sampling temperature; ``clip_frac_high/g`` and
    ``clip_frac_low/g`` = clipped tokens / (tokens x `updates`), each token being seen once per
    PPO epoch. A group with no sample in this batch has no keys (nothing was measured).

    Args:
        chair_i: [N] CHAIR_i per sample (NaN = unscored), or None (no CHAIR at all).
        entropy, mask: [N, T] per-token entropy and response mask.
        clipped_high, clipped_low: [N] clipped tokens per sample, summed over every update.
        updates: how many times each token went through the loss (the PPO epochs).
    """
    if chair_i is None:
        return {}
    scores = torch.as_tensor(np.asarray(chair_i, dtype=np.float64))
    scored = torch.isfinite(scores)
    tokens = mask.detach().to(torch.float64).cpu()
    per_sample_entropy = (entropy.detach().to(torch.float64).cpu() * tokens).sum(-1)
    per_sample_tokens = tokens.sum(-1)
    high = clipped_high.detach().to(torch.float64).cpu()
    low = clipped_low.detach().to(torch.float64).cpu()
    out: dict[str, float] = {}
    for name, rows in (("hallucinated", scored & (scores > 0)), ("clean", scored & (scores == 0))):
        count = float(per_sample_tokens[rows].sum())
        if count == 0:
            continue
        out[f"entropy/{name}"] = float(per_sample_entropy[rows].sum()) / count
        out[f"clip_frac_high/{name}"] = float(high[rows].sum()) / (count * updates)
        out[f"clip_frac_low/{name}"] = float(low[rows].sum()) / (count * updates)
    return out


def rl_step(
    model: Any,
    optimizer: torch.optim.Optimizer,
    task: Task,
    items: Sequence[Any],
    settings: RLSettings,
    *,
    tokenizer: Any,
    suppress: list[int],
    generator: torch.Generator,
    ref_model: Any | None = None,
) -> dict[str, float]:
    """Rollout, scoring, advantages, clip bounds and PPO updates for one batch of prompts.

    Returns the step's metrics (means over the rollout batch unless named otherwise).
    """
    started = time.perf_counter()
    device = next(model.parameters()).device
    n = settings.samples_per_prompt
    prompts = {k: v.to(device) for k, v in task.prompts(items).items()}
    rollout = expand_prompts(prompts, n)
    responses, mask = generate(
        model,
        rollout,
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
        max_new_tokens=settings.max_new_tokens,
        temperature=settings.temperature,
        suppress=suppress,
    )
    texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
    expanded_items = [item for item in items for _ in range(n)]
    reward = task.reward(texts, expanded_items, responses=responses.cpu())
    scores = torch.as_tensor(reward.scores, dtype=torch.float32)
    if not torch.isfinite(scores).all():
        raise ValueError("reward: non-finite scores")
    model.eval()
    with torch.no_grad():
        old_log_prob, entropy = response_log_probs(
            model, rollout, responses, mask, temperature=settings.temperature, with_entropy=True
        )
        ref_log_prob = None
        if ref_model is not None:
            ref_log_prob, _ = response_log_probs(
                ref_model, rollout, responses, mask, temperature=settings.temperature
            )
    model.train()
    group = torch.arange(len(items)).repeat_interleave(n)
    ref_seq = None
    if ref_log_prob is not None:
        ref_seq = (ref_log_prob * mask.float()).sum(-1).cpu()
    result = compute_advantages(
        settings,
        scores,
        group,
        entropy.cpu(),
        mask.cpu(),
        responses=responses.cpu(),
        old_log_prob=old_log_prob.cpu(),
        ref_seq_log_prob=ref_seq,
    )
    adv = result.token.to(device)
    adv_metrics = result.metrics
    clip_high = sample_clip_high(settings, reward.chair_i, scores.shape[0]).to(device)
    clip_low = sample_clip_low(settings, reward.chair_i, scores.shape[0])
    if isinstance(clip_low, Tensor):
        clip_low = clip_low.to(device)
    adv, clip_low, clip_high, credit_metrics = token_credit(
        settings, reward, adv, mask, clip_low, clip_high
    )

    total = scores.shape[0]
    losses, clip_frac_high, clip_frac_low, kls = [], [], [], []
    clipped_high = torch.zeros(total, dtype=torch.float64)
    clipped_low = torch.zeros(total, dtype=torch.float64)
    for _ in range(settings.ppo_epochs):
        order = torch.randperm(total, generator=generator)
        for index in torch.chunk(order, settings.num_minibatches):
            index_d = index.to(device)
            log_prob, _ = response_log_probs(
                model,
                select_rows(rollout, index_d),
                responses[index_d],
                mask[index_d],
                temperature=settings.temperature,
            )
            loss, loss_metrics, clipped = ppo_clip_loss(
                log_prob,
                old_log_prob[index_d],
                adv[index_d],
                mask[index_d],
                clip_low=clip_low if isinstance(clip_low, float) else clip_low[index_d],
                clip_high=clip_high[index_d],
                clip_c=settings.ppo.clip_c,
                agg="token-mean",
            )
            clipped_high.index_add_(0, index, clipped.high.sum(-1).cpu().to(torch.float64))
            clipped_low.index_add_(0, index, clipped.low.sum(-1).cpu().to(torch.float64))
            if ref_log_prob is not None and settings.kl_coef > 0:
                kl = masked_mean(kl_k3(log_prob, ref_log_prob[index_d]), mask[index_d], dim=None)
                loss = loss + settings.kl_coef * kl
                kls.append(float(kl.detach()))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
            optimizer.step()
            losses.append(float(loss.detach()))
            clip_frac_high.append(loss_metrics.get("clip/frac_high", float("nan")))
            clip_frac_low.append(loss_metrics.get("clip/frac_low", float("nan")))

    lengths = mask.sum(-1).float()
    metrics = {
        "reward": _mean(reward.scores),
        "entropy": float(masked_mean(entropy, mask, dim=None)),
        "clip_high": float(
            clip_high.mean() if clip_high.dim() == 1 else masked_mean(clip_high, mask, dim=None)
        ),
        "response_length": float(lengths.mean()),
        "adv_abs_mean": float(
            result.sample.abs().mean()
            if result.sample is not None
            else masked_mean(adv.abs(), mask, dim=None)
        ),
        "loss": _mean(np.array(losses)),
        "clip_frac_high": _mean(np.array(clip_frac_high)),
        "clip_frac_low": _mean(np.array(clip_frac_low)),
        "seconds": time.perf_counter() - started,
        **reward.metrics,
        **adv_metrics,
        **credit_metrics,
        **hallucination_split_metrics(
            reward.chair_i, entropy, mask, clipped_high, clipped_low, settings.ppo_epochs
        ),
        **token_entropy_split(reward.hallucinated_positions, entropy, mask),
    }
    if isinstance(clip_low, Tensor):
        metrics["clip_low"] = float(
            clip_low.mean() if clip_low.dim() == 1 else masked_mean(clip_low, mask, dim=None)
        )
    if kls:
        metrics["kl"] = _mean(np.array(kls))
    if reward.chair_i is not None:
        metrics["chair_i"] = _mean(reward.chair_i)
    return {k: float(v) for k, v in metrics.items() if not isinstance(v, str)}


def supervised_step(
    model: Any,
    optimizer: torch.optim.Optimizer,
    prompts: dict[str, Tensor],
    targets: Sequence[Sequence[int]],
    *,
    pad_id: int,
    max_grad_norm: float = 1.0,
) -> float:
    """One cross-entropy step on `targets` (token ids ending in end-of-turn) given `prompts`.

    Returns the mean token negative log-likelihood.
    """
    device = next(model.parameters()).device
    length = max(len(t) for t in targets)
    responses = torch.full((len(targets), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(targets), length), dtype=torch.long)
    for row, ids in enumerate(targets):
        responses[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
        mask[row, : len(ids)] = 1
    prompts = {k: v.to(device) for k, v in prompts.items()}
    responses, mask = responses.to(device), mask.to(device)
    model.train()
    log_prob, _ = response_log_probs(model, prompts, responses, mask)
    loss = -masked_mean(log_prob, mask, dim=None)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    value = float(loss.detach())
    if not math.isfinite(value):
        raise FloatingPointError("warm-up loss is not finite")
    return value
