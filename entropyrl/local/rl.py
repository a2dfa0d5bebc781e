"""One GRPO-family step and one supervised step of the local runner, for any `Task`.

The RL step follows the project's data flow (architecture.md, "one step"): sample n responses per
prompt, score them once, compute old log-probs and full-vocabulary token entropies at the sampling
temperature, group-relative advantages with the chosen entropy guidance
(`entropyrl.advantages`, `entropyrl.maxent`), per-sample eps_high from each sample's CHAIR_i
(`entropyrl.clip_schedules`), then PPO updates (`entropyrl.losses.ppo_clip_loss`) over several
mini-batches so the clip bounds act. Formulas live in those modules; this one only moves tensors.
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

from entropyrl.advantages import (
    egpo_bonus_advantage,
    egpo_ratio_advantage,
    entropy_shaped_token_advantage,
    grpo_advantage,
)
from entropyrl.clip_schedules import clip_high_from_hallucination
from entropyrl.entropy import masked_mean, sequence_entropy
from entropyrl.local.policy import (
    expand_prompts,
    generate,
    response_log_probs,
    select_rows,
)
from entropyrl.losses import ppo_clip_loss
from entropyrl.maxent import maxent_advantage

__all__ = [
    "RLSettings",
    "RewardOutput",
    "Task",
    "compute_advantages",
    "kl_k3",
    "per_sample_clip_high",
    "rl_step",
    "supervised_step",
]


@dataclass
class RewardOutput:
    """Scores of a rollout batch. Arrays have shape [N]; `chair_i` is NaN where unavailable."""

    scores: np.ndarray
    chair_i: np.ndarray | None
    metrics: dict[str, float]


class Task(Protocol):
    """What the RL step needs from a task (captioning, function calling)."""

    def prompts(self, items: Sequence[Any]) -> dict[str, Tensor]:
        """Model inputs of the prompts of `items` ([B, P], left-padded)."""

    def reward(self, texts: Sequence[str], items: Sequence[Any]) -> RewardOutput:
        """Score decoded responses (one call per rollout batch)."""


@dataclass
class RLSettings:
    """The knobs `rl_step` reads (a subset of `DemoConfig`, named as there)."""

    adv: str = "grpo"
    clip_schedule: str = "off"
    samples_per_prompt: int = 8
    temperature: float = 1.0
    max_new_tokens: int = 24
    num_minibatches: int = 2
    ppo_epochs: int = 1
    clip_low: float = 0.2
    clip_high: float = 0.28
    clip_high_clean: float = 0.3
    clip_high_hallucinated: float = 0.5
    clip_direction: str = "hallucinated_high"
    clip_c: float = 3.0
    kl_coef: float = 0.0
    egpo_lambda: float = 0.4
    egpo_alpha: float = 2.0
    egpo_lambda_min: float = 0.5
    egpo_lambda_max: float = 2.0
    token_alpha: float = 0.4
    token_kappa: float = 2.0
    maxent_tau: float = 1.0
    maxent_beta: float = 0.1
    max_grad_norm: float = 1.0


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
    ref_seq_log_prob: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Advantages of the chosen estimator: Tensor[N] (sequence level) or Tensor[N, T] (token).

    `token_entropy` [N, T] is the rollout policy's entropy at the sampling temperature; the
    sequence entropy H_i is its masked mean over the response.
    """
    seq_entropy = sequence_entropy(token_entropy, mask)
    if settings.adv == "grpo":
        return grpo_advantage(scores, group), {}
    if settings.adv == "egpo":
        return egpo_bonus_advantage(
            scores, seq_entropy, group, lam=settings.egpo_lambda, alpha=settings.egpo_alpha
        )
    if settings.adv == "egpo_ratio":
        return egpo_ratio_advantage(
            scores,
            seq_entropy,
            group,
            lambda_min=settings.egpo_lambda_min,
            lambda_max=settings.egpo_lambda_max,
        )
    if settings.adv == "entropy_adv":
        base = grpo_advantage(scores, group)
        shaped = entropy_shaped_token_advantage(
            base, token_entropy, mask, alpha=settings.token_alpha, kappa=settings.token_kappa
        )
        return shaped, {}
    if settings.adv == "maxent_grpo":
        if ref_seq_log_prob is None:
            raise ValueError("adv=maxent_grpo needs reference log-likelihoods")
        return maxent_advantage(
            scores, ref_seq_log_prob, group, tau=settings.maxent_tau, beta=settings.maxent_beta
        )
    raise ValueError(f"adv: unknown estimator {settings.adv!r}")


def per_sample_clip_high(settings: RLSettings, chair_i: np.ndarray | None, n: int) -> Tensor:
    """eps_high per sample: constant with schedule `off` (or no CHAIR), else from CHAIR_i."""
    if settings.clip_schedule == "off" or chair_i is None:
        return torch.full((n,), float(settings.clip_high))
    return clip_high_from_hallucination(
        torch.as_tensor(chair_i, dtype=torch.float32),
        rule=settings.clip_schedule,
        low=settings.clip_high_clean,
        high=settings.clip_high_hallucinated,
        direction=settings.clip_direction,
    )


def _mean(values: Tensor | np.ndarray) -> float:
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    return float(values.mean()) if values.size else float("nan")


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
    reward = task.reward(texts, expanded_items)
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
    maskf = mask.float()
    group = torch.arange(len(items)).repeat_interleave(n)
    ref_seq = None
    if settings.adv == "maxent_grpo":
        source = ref_log_prob if ref_log_prob is not None else old_log_prob
        ref_seq = (source * maskf).sum(-1).cpu()
    adv, adv_metrics = compute_advantages(
        settings, scores, group, entropy.cpu(), mask.cpu(), ref_seq_log_prob=ref_seq
    )
    adv = adv.to(device)
    clip_high = per_sample_clip_high(settings, reward.chair_i, scores.shape[0]).to(device)

    total = scores.shape[0]
    losses, clip_frac_high, clip_frac_low, kls = [], [], [], []
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
            loss, loss_metrics = ppo_clip_loss(
                log_prob,
                old_log_prob[index_d],
                adv[index_d],
                mask[index_d],
                clip_low=settings.clip_low,
                clip_high=clip_high[index_d],
                clip_c=settings.clip_c,
                agg="token-mean",
            )
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
        "clip_high": float(clip_high.mean()),
        "response_length": float(lengths.mean()),
        "adv_abs_mean": float(adv.abs().mean()),
        "loss": _mean(np.array(losses)),
        "clip_frac_high": _mean(np.array(clip_frac_high)),
        "clip_frac_low": _mean(np.array(clip_frac_low)),
        "seconds": time.perf_counter() - started,
        **reward.metrics,
        **adv_metrics,
    }
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
