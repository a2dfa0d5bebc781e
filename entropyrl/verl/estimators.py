"""Advantage estimators registered with verl: `egpo`, `egpo_ratio`, `entropy_adv`, `maxent_grpo`.

Each has verl's estimator signature `(token_level_rewards, response_mask, config, index, **kw)
-> (advantages [B, T], returns [B, T])` and only moves tensors into `entropyrl.advantages` /
`entropyrl.maxent`. verl passes no entropy, so per-token entropy, the entropy segment and the
reference log-probs come from `entropyrl.verl.inputs.advantage_inputs` (opened by the
entropy-aware trainer). Without it every sample's entropy is unavailable (NaN) and the core
falls back to the plain GRPO advantage, counted in `egpo/entropy/missing`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import register_adv_est

from entropyrl import advantages as core
from entropyrl import maxent
from entropyrl.entropy import sequence_entropy
from entropyrl.verl.inputs import AdvantageInputs, current_advantage_inputs

ESTIMATORS: tuple[str, ...] = ("egpo", "egpo_ratio", "entropy_adv", "maxent_grpo")


def config_value(config: Any, path: str, default: Any) -> Any:
    """Read a dotted key from verl's algorithm config (DictConfig, dataclass or dict).

    Missing keys and None give `default`, so recipes only set what they change.
    """
    node = config
    for part in path.split("."):
        if node is None:
            return default
        if isinstance(node, dict):
            node = node.get(part)
        elif hasattr(node, "get") and not isinstance(node, torch.Tensor):
            try:
                node = node.get(part)
            except (AttributeError, KeyError, TypeError):
                node = getattr(node, part, None)
        else:
            node = getattr(node, part, None)
    return default if node is None else node


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


def sequence_scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Per-sample return [B]: the sum of token rewards, exactly as verl's GRPO computes it."""
    del response_mask  # verl sums the whole row; rewards sit on response tokens only
    return token_level_rewards.sum(dim=-1)


def sample_entropy(inputs: AdvantageInputs | None, response_mask: torch.Tensor) -> torch.Tensor:
    """H_i [B]: mean of `inputs.token_entropy` over each sample's segment; NaN where unavailable.

    Which per-token quantity that is (full-vocabulary entropy, or the sampled token's negative
    log-likelihood for `algorithm.egpo.entropy_source=nll`) is the trainer's choice.
    """
    if inputs is None or inputs.token_entropy is None:
        return torch.full(
            (response_mask.shape[0],),
            float("nan"),
            dtype=torch.float32,
            device=response_mask.device,
        )
    token_entropy = inputs.token_entropy.to(torch.float32)
    if token_entropy.shape != response_mask.shape:
        raise ValueError(
            f"token entropy shape {tuple(token_entropy.shape)} != response_mask shape "
            f"{tuple(response_mask.shape)}"
        )
    mask = response_mask.bool()
    if inputs.segment_mask is not None:
        mask = mask & inputs.segment_mask.bool()
    # An empty segment gives NaN: the core then keeps that sample's plain GRPO advantage.
    return sequence_entropy(token_entropy, mask)


def _norm_by_std(config: Any) -> bool:
    return bool(config_value(config, "norm_adv_by_std_in_grpo", True))


def _record(inputs: AdvantageInputs | None, prefix: str, metrics: dict[str, Any]) -> None:
    if inputs is None:
        return
    for key, value in metrics.items():
        name = key if key.startswith(prefix) else f"{prefix}{key}"
        inputs.metrics[name] = float(value.item() if isinstance(value, torch.Tensor) else value)


def _to_tokens(
    advantages: torch.Tensor, response_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    token_advantages = core.broadcast_to_tokens(advantages, response_mask)
    return token_advantages, token_advantages


@register_adv_est("egpo")
def compute_egpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    index: np.ndarray | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """EGPO additive bonus (Hao et al. 2025, arXiv 2508.05118): A_i + lambda*clip(H_i, |A_i|/alpha).

    Reads `algorithm.egpo_lambda` (0.4) and `algorithm.egpo_alpha` (2.0).
    """
    inputs = current_advantage_inputs()
    scores = sequence_scores(token_level_rewards, response_mask)
    entropy = sample_entropy(inputs, response_mask)
    advantages, metrics = core.egpo_bonus_advantage(
        scores,
        entropy,
        group_ids(index, scores.shape[0]).to(scores.device),
        lam=float(config_value(config, "egpo_lambda", 0.4)),
        alpha=float(config_value(config, "egpo_alpha", 2.0)),
        norm_by_std=_norm_by_std(config),
    )
    _record(inputs, "egpo/", metrics)
    return _to_tokens(advantages, response_mask)


@register_adv_est("egpo_ratio")
def compute_egpo_ratio_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    index: np.ndarray | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """EGPO multiplicative calibration: A_i * clip(mean_group(H) / (H_i + eps), lambda_min, lambda_max).

    Reads `algorithm.egpo.{lambda_min (0.5), lambda_max (2.0), entropy_epsilon (1e-6)}`;
    `entropy_mode` and `entropy_source` shape the trainer's inputs.
    """
    inputs = current_advantage_inputs()
    scores = sequence_scores(token_level_rewards, response_mask)
    entropy = sample_entropy(inputs, response_mask)
    advantages, metrics = core.egpo_ratio_advantage(
        scores,
        entropy,
        group_ids(index, scores.shape[0]).to(scores.device),
        lambda_min=float(config_value(config, "egpo.lambda_min", 0.5)),
        lambda_max=float(config_value(config, "egpo.lambda_max", 2.0)),
        entropy_eps=float(config_value(config, "egpo.entropy_epsilon", 1e-6)),
        norm_by_std=_norm_by_std(config),
    )
    _record(inputs, "egpo/", metrics)
    return _to_tokens(advantages, response_mask)


@register_adv_est("entropy_adv")
def compute_entropy_shaped_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    index: np.ndarray | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level entropy shaping (Cheng et al. 2025, arXiv 2506.14758) on the GRPO advantage.

    Reads `algorithm.entropy_adv.{alpha (0.4), kappa (2.0)}`. Without token entropy the
    shaping term is zero (plain GRPO), counted in `egpo/entropy/missing`.
    """
    inputs = current_advantage_inputs()
    scores = sequence_scores(token_level_rewards, response_mask)
    advantages = core.grpo_advantage(
        scores,
        group_ids(index, scores.shape[0]).to(scores.device),
        norm_by_std=_norm_by_std(config),
    )
    if inputs is None or inputs.token_entropy is None:
        token_entropy = torch.zeros_like(token_level_rewards, dtype=torch.float32)
        missing = float(scores.shape[0])
    else:
        token_entropy = inputs.token_entropy.to(torch.float32)
        missing = 0.0
    token_advantages = core.entropy_shaped_token_advantage(
        advantages,
        token_entropy,
        response_mask,
        alpha=float(config_value(config, "entropy_adv.alpha", 0.4)),
        kappa=float(config_value(config, "entropy_adv.kappa", 2.0)),
    )
    if inputs is not None:
        inputs.metrics["egpo/entropy/missing"] = missing
    return token_advantages, token_advantages


@register_adv_est("maxent_grpo")
def compute_maxent_grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    index: np.ndarray | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MaxEnt-GRPO sequence-level target (experimental; its author reports collapse risk).

    Reads `algorithm.maxent.{tau (1.0), beta (0.1), source (rewards), temperature (1.0)}`. The reference
    policy's sequence log-likelihood comes from `AdvantageInputs.ref_log_prob`; without it
    the reference is uniform, which is only exact when beta = 0 (then it cancels).
    """
    inputs = current_advantage_inputs()
    scores = sequence_scores(token_level_rewards, response_mask)
    beta = float(config_value(config, "maxent.beta", 0.1))
    if inputs is not None and inputs.ref_log_prob is not None:
        log_pi_ref = (inputs.ref_log_prob.to(torch.float32) * response_mask).sum(dim=-1)
    elif beta != 0.0:
        raise ValueError(
            "maxent_grpo with algorithm.maxent.beta != 0 needs the reference log-probs "
            "(field `ref_log_prob`): enable the reference policy (actor.use_kl_loss=true)"
        )
    else:
        log_pi_ref = torch.zeros_like(scores, dtype=torch.float32)
    advantages, metrics = maxent.maxent_advantage(
        scores,
        log_pi_ref,
        group_ids(index, scores.shape[0]).to(scores.device),
        tau=float(config_value(config, "maxent.tau", 1.0)),
        beta=beta,
        source=str(config_value(config, "maxent.source", "rewards")),
        temperature=float(config_value(config, "maxent.temperature", 1.0)),
    )
    _record(inputs, "maxent/", metrics)
    return _to_tokens(advantages, response_mask)
