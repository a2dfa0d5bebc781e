"""verl advantage estimators: each entry of `entropyrl.core.algorithms.ESTIMATORS` verl lacks.

Each is registered where it is defined, with `@register_adv_est(name)` as verl's own
`core_algos.py` does, under verl's estimator signature `(token_level_rewards, response_mask,
config, index, **kw) -> (advantages [B, T], returns [B, T])`. They only move tensors: the
formula, and what each reads (entropy, reference log-probs), is the table's entry of the same
name. The run's parsed algorithm sections, the per-token entropy, its segment and the reference
log-probs (which verl does not pass) come from the step context
(`entropyrl.verl.inputs.with_step`, opened by the entropy-aware trainer), and the estimator's
metrics go back to it. Without a step the sections are read from verl's `config`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import register_adv_est

from entropyrl.core.algorithms import EstimatorInputs, estimate
from entropyrl.core.specs import algorithm_specs
from entropyrl.verl.inputs import Step, current_step, report


def group_ids(
    index: Sequence[Any] | np.ndarray | torch.Tensor | None, batch_size: int
) -> torch.Tensor:
    """Map verl's per-sample group labels (`uid`: strings) to integer ids [B].

    Without labels every sample is its own group (advantage 0), as verl's GRPO does.
    """
    if index is None:
        return torch.arange(batch_size)
    if isinstance(index, torch.Tensor):
        index = index.cpu().numpy()
    labels = np.asarray(index, dtype=object)
    if labels.shape != (batch_size,):
        raise ValueError(f"index (uid) must have shape ({batch_size},), got {labels.shape}")
    _, inverse = np.unique(labels.astype(str), return_inverse=True)
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.long)


def norm_by_std(config: Any) -> bool:
    """verl's `algorithm.norm_adv_by_std_in_grpo` (default true), read by attribute as verl's
    DictConfig, its AlgoConfig dataclass and any config object all allow."""
    value = getattr(config, "norm_adv_by_std_in_grpo", None)
    return True if value is None else bool(value)


def estimator_inputs(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any,
    index: Any,
    step: Step | None = None,
) -> EstimatorInputs:
    """The algorithm table's inputs from what verl passes plus the step context."""
    # verl's GRPO sums the whole row; rewards sit on response tokens only.
    scores = token_level_rewards.sum(dim=-1)
    step = step or Step()
    ref_seq = None
    if step.ref_log_prob is not None:
        ref_seq = (step.ref_log_prob.to(torch.float32) * response_mask).sum(dim=-1)
    return EstimatorInputs(
        scores=scores,
        group=group_ids(index, scores.shape[0]).to(scores.device),
        mask=response_mask,
        token_entropy=step.token_entropy,
        segment_mask=step.segment_mask,
        ref_seq_log_prob=ref_seq,
        norm_by_std=norm_by_std(config),
    )


def advantages(
    name: str,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    index: Any = None,
    step: Step | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level advantages [B, T] of table entry `name` and its metrics (`egpo/*`, ...)."""
    specs = step.specs if step is not None else None
    inputs = estimator_inputs(token_level_rewards, response_mask, config, index, step)
    result = estimate(name, inputs, specs or algorithm_specs(config))
    return result.token, result.metrics


def _for_verl(
    name: str,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any,
    index: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's (advantages, returns) of `name`; the metrics go back to the open step."""
    token, metrics = advantages(
        name, token_level_rewards, response_mask, config, index, current_step()
    )
    report(metrics)
    return token, token


@register_adv_est("egpo")
def compute_egpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    index: np.ndarray | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """EGPO's additive entropy bonus on GRPO (`algorithm.egpo_bonus.*`; reads entropy)."""
    return _for_verl("egpo", token_level_rewards, response_mask, config, index)


@register_adv_est("egpo_ratio")
def compute_egpo_ratio_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    index: np.ndarray | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO weighted by the group's entropy ratio (`algorithm.egpo_ratio.*`; reads entropy)."""
    return _for_verl("egpo_ratio", token_level_rewards, response_mask, config, index)


@register_adv_est("entropy_adv")
def compute_entropy_adv_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    index: np.ndarray | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO shaped per token by the token's entropy (`algorithm.entropy_adv.*`; reads entropy)."""
    return _for_verl("entropy_adv", token_level_rewards, response_mask, config, index)


@register_adv_est("maxent_grpo")
def compute_maxent_grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    index: np.ndarray | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MaxEnt-GRPO's listwise target (`algorithm.maxent.*`; reads the reference log-probs)."""
    return _for_verl("maxent_grpo", token_level_rewards, response_mask, config, index)
