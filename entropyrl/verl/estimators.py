"""verl advantage estimators: every entry of `entropyrl.algorithms.ESTIMATORS` but `grpo`
(`entropyrl.estimator_names.VERL_ESTIMATORS`).

Each is registered under its name with verl's estimator signature `(token_level_rewards,
response_mask, config, index, **kw) -> (advantages [B, T], returns [B, T])` and only moves
tensors: the algorithm sections of `config` (verl's `algorithm` node) become
`entropyrl.specs.AlgorithmSpecs`, and per-token entropy, its segment and the reference
log-probs (which verl does not pass) come from `entropyrl.verl.inputs.advantage_inputs`, opened
by the entropy-aware trainer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import register_adv_est

from entropyrl.algorithms import EstimatorInputs, estimate
from entropyrl.estimator_names import VERL_ESTIMATORS
from entropyrl.specs import algorithm_specs
from entropyrl.verl.inputs import current_advantage_inputs


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
    """verl's `algorithm.norm_adv_by_std_in_grpo` (default true)."""
    if config is None:
        return True
    getter = getattr(config, "get", None)
    if callable(getter):
        value = getter("norm_adv_by_std_in_grpo", True)
    else:
        value = getattr(config, "norm_adv_by_std_in_grpo", True)
    return True if value is None else bool(value)


def estimator_inputs(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any,
    index: Any,
) -> EstimatorInputs:
    """The algorithm table's inputs from what verl passes plus the trainer's context."""
    extra = current_advantage_inputs()
    # verl's GRPO sums the whole row; rewards sit on response tokens only.
    scores = token_level_rewards.sum(dim=-1)
    ref_seq = None
    if extra is not None and extra.ref_log_prob is not None:
        ref_seq = (extra.ref_log_prob.to(torch.float32) * response_mask).sum(dim=-1)
    return EstimatorInputs(
        scores=scores,
        group=group_ids(index, scores.shape[0]).to(scores.device),
        mask=response_mask,
        token_entropy=None if extra is None else extra.token_entropy,
        segment_mask=None if extra is None else extra.segment_mask,
        ref_seq_log_prob=ref_seq,
        norm_by_std=norm_by_std(config),
    )


def _registered(name: str):
    def estimator(
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        config: Any = None,
        index: np.ndarray | None = None,
        **_: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = estimator_inputs(token_level_rewards, response_mask, config, index)
        result = estimate(name, inputs, algorithm_specs(config))
        extra = current_advantage_inputs()
        if extra is not None:
            extra.metrics.update(result.metrics)
        return result.token, result.token

    estimator.__name__ = f"compute_{name}_advantage"
    estimator.__doc__ = f"`{name}` from `entropyrl.algorithms` (reads `algorithm.*` sections)."
    return estimator


for _name in VERL_ESTIMATORS:
    register_adv_est(_name)(_registered(_name))
