"""The advantage estimators by name, with the spec each reads: one table for both engines.

Each estimator is registered where it is defined, by `@estimator(name, ...)`, which also declares
what it reads beyond the scores (per-token entropy, the reference policy's log-probs) and whether
verl ships it itself. Every list of names and every engine's decision of which inputs to gather
derives from these declarations: `entropyrl.core.estimator_names` reads them without importing
torch.
verl gets each entry but `grpo` (verl has its own) from `entropyrl.verl.estimators`; the local
runner dispatches through `estimate`. An entry maps the same inputs (per-sample
scores, group ids, the response mask, per-token entropy of the rollout policy and optionally the
reference policy's sequence log-likelihood) to token-level advantages, so both engines give the
same advantages for the same spec and inputs.

Inputs that are missing follow one rule everywhere: without per-token entropy every sample's
entropy is unavailable (NaN), and the estimators keep that sample's plain GRPO advantage and
count it in `egpo/entropy/missing`; MaxEnt-GRPO with beta > 0 needs the reference log-likelihood
and raises without it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from entropyrl.core import advantages as adv
from entropyrl.core import maxent
from entropyrl.core.entropy import segment_mask, sequence_entropy
from entropyrl.core.specs import AlgorithmSpecs, EntropySpec

__all__ = [
    "ESTIMATORS",
    "Estimate",
    "Estimator",
    "EstimatorInputs",
    "entropy_inputs",
    "estimate",
    "estimator",
]


@dataclass
class EstimatorInputs:
    """One batch of N responses (T = response length).

    scores: Tensor[N] sequence rewards. group: LongTensor[N] prompt-group ids.
    mask: Tensor[N, T] response mask. token_entropy: Tensor[N, T] or None (unavailable).
    segment_mask: Tensor[N, T] tokens that form H_i (None: the whole response).
    ref_seq_log_prob: Tensor[N] reference policy's sequence log-likelihood, or None.
    norm_by_std: divide group-centred rewards by the group std (GRPO; False = Dr. GRPO).
    """

    scores: Tensor
    group: Tensor
    mask: Tensor
    token_entropy: Tensor | None = None
    segment_mask: Tensor | None = None
    ref_seq_log_prob: Tensor | None = None
    norm_by_std: bool = True

    def sample_entropy(self) -> Tensor:
        """H_i [N]: mean token entropy over each sample's segment; NaN where unavailable."""
        if self.token_entropy is None:
            return torch.full(
                (self.scores.shape[0],), float("nan"), dtype=torch.float32, device=self.mask.device
            )
        if self.token_entropy.shape != self.mask.shape:
            raise ValueError(
                f"token entropy shape {tuple(self.token_entropy.shape)} != response mask shape "
                f"{tuple(self.mask.shape)}"
            )
        mask = self.mask.bool()
        if self.segment_mask is not None:
            mask = mask & self.segment_mask.bool()
        # An empty segment gives NaN: that sample keeps its plain GRPO advantage.
        return sequence_entropy(self.token_entropy.to(torch.float32), mask)


def entropy_inputs(
    spec: EntropySpec,
    mask: Tensor,
    *,
    entropy: Tensor | None,
    old_log_prob: Tensor | None,
    responses: Tensor | None,
    think_ids: tuple[Sequence[int], Sequence[int]] | None,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The per-token quantity that forms H_i and the tokens it is taken over, as `spec` says.

    `entropy` [N, T]: the rollout policy's per-token entropy (`source="logits"`);
    `old_log_prob` [N, T]: its log-probs of the sampled tokens (`source="nll"`); either may be
    missing (verl's bypass mode computes no entropy). `responses` [N, T] and the `<think>` /
    `</think>` token ids `think_ids` locate the segment unless `mode="full"`.

    Returns:
        (token_entropy Tensor[N, T] float32, or None when unavailable: the estimators then keep
        plain GRPO and count it; segment_mask BoolTensor[N, T], or None for the whole response;
        found BoolTensor[N], rows whose segment was found, or None without a segment).
    """
    token_entropy = None
    if spec.source == "logits" and entropy is not None:
        token_entropy = entropy.to(torch.float32)
    elif spec.source == "nll" and old_log_prob is not None:
        token_entropy = -old_log_prob.to(torch.float32)
    if spec.mode == "full" or token_entropy is None:
        return token_entropy, None, None
    if responses is None or think_ids is None:
        raise ValueError(
            f"entropy.mode={spec.mode!r} (algorithm.entropy.mode) needs the response token ids "
            "and the think tags"
        )
    segment, found = segment_mask(responses, mask, think_ids[0], think_ids[1], spec.mode)
    return token_entropy, segment, found


@dataclass
class Estimate:
    """token: Tensor[N, T] advantages (0 on padding); sample: Tensor[N] for sequence-level
    estimators (None for token-level ones); metrics: `egpo/*`, `maxent/*` scalars."""

    token: Tensor
    sample: Tensor | None
    metrics: dict[str, float]


def _floats(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v.item() if isinstance(v, Tensor) else v) for k, v in metrics.items()}


def _sequence(inputs: EstimatorInputs, advantages: Tensor, metrics: dict[str, Any]) -> Estimate:
    return Estimate(adv.broadcast_to_tokens(advantages, inputs.mask), advantages, _floats(metrics))


Formula = Callable[[EstimatorInputs, AlgorithmSpecs], Estimate]


@dataclass(frozen=True)
class Estimator:
    """One entry of the table: its formula and what it reads beyond scores, groups and mask.

    entropy: per-token entropy of the rollout policy (without it a sample keeps its plain GRPO
        advantage and is counted in `egpo/entropy/missing`).
    reference: the reference policy's sequence log-likelihood (`maxent.beta > 0` needs it).
    in_verl: verl registers an estimator of this name itself (the plugin registers the others).
    """

    name: str
    formula: Formula
    entropy: bool = False
    reference: bool = False
    in_verl: bool = False


# name -> Estimator, filled by `@estimator` below, in definition order.
ESTIMATORS: dict[str, Estimator] = {}


def estimator(
    name: str, *, entropy: bool = False, reference: bool = False, in_verl: bool = False
) -> Callable[[Formula], Formula]:
    """Register the decorated formula as estimator `name`, with what it reads.

    Write the arguments as literals: `entropyrl.core.estimator_names` reads them from this file's
    source, where torch is too heavy to import.
    """

    def register(formula: Formula) -> Formula:
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is defined twice")
        ESTIMATORS[name] = Estimator(name, formula, entropy, reference, in_verl)
        return formula

    return register


@estimator("grpo", in_verl=True)
def _grpo(inputs: EstimatorInputs, specs: AlgorithmSpecs) -> Estimate:
    return _sequence(
        inputs, adv.grpo_advantage(inputs.scores, inputs.group, norm_by_std=inputs.norm_by_std), {}
    )


@estimator("egpo", entropy=True)
def _egpo(inputs: EstimatorInputs, specs: AlgorithmSpecs) -> Estimate:
    advantages, metrics = adv.egpo_bonus_advantage(
        inputs.scores,
        inputs.sample_entropy(),
        inputs.group,
        lam=specs.egpo_bonus.lam,
        alpha=specs.egpo_bonus.alpha,
        norm_by_std=inputs.norm_by_std,
    )
    return _sequence(inputs, advantages, metrics)


@estimator("egpo_ratio", entropy=True)
def _egpo_ratio(inputs: EstimatorInputs, specs: AlgorithmSpecs) -> Estimate:
    spec = specs.egpo_ratio
    advantages, metrics = adv.egpo_ratio_advantage(
        inputs.scores,
        inputs.sample_entropy(),
        inputs.group,
        lambda_min=spec.lambda_min,
        lambda_max=spec.lambda_max,
        entropy_eps=spec.entropy_epsilon,
        norm_by_std=inputs.norm_by_std,
    )
    return _sequence(inputs, advantages, metrics)


@estimator("entropy_adv", entropy=True)
def _entropy_adv(inputs: EstimatorInputs, specs: AlgorithmSpecs) -> Estimate:
    base = adv.grpo_advantage(inputs.scores, inputs.group, norm_by_std=inputs.norm_by_std)
    if inputs.token_entropy is None:
        token_entropy = torch.zeros(inputs.mask.shape, dtype=torch.float32, device=base.device)
        missing = float(inputs.scores.shape[0])
    else:
        token_entropy, missing = inputs.token_entropy.to(torch.float32), 0.0
    token = adv.entropy_shaped_token_advantage(
        base,
        token_entropy,
        inputs.mask,
        alpha=specs.entropy_adv.alpha,
        kappa=specs.entropy_adv.kappa,
    )
    return Estimate(token, None, {"egpo/entropy/missing": missing})


@estimator("maxent_grpo", reference=True)
def _maxent(inputs: EstimatorInputs, specs: AlgorithmSpecs) -> Estimate:
    spec = specs.maxent
    reference = inputs.ref_seq_log_prob
    if reference is None:
        if spec.beta != 0.0:
            raise ValueError(
                "maxent_grpo with maxent.beta > 0 needs the reference policy's log-probs "
                "(verl: actor_rollout_ref.actor.use_kl_loss=true; local runner: it keeps the "
                "warm-up model as reference)"
            )
        reference = torch.zeros_like(inputs.scores, dtype=torch.float32)
    advantages, metrics = maxent.maxent_advantage(
        inputs.scores,
        reference.to(torch.float32),
        inputs.group,
        tau=spec.tau,
        beta=spec.beta,
        source=spec.source,
        temperature=spec.temperature,
    )
    return _sequence(inputs, advantages, metrics)


def estimate(name: str, inputs: EstimatorInputs, specs: AlgorithmSpecs) -> Estimate:
    """Advantages of estimator `name` (a key of `ESTIMATORS`) for one batch."""
    try:
        entry = ESTIMATORS[name]
    except KeyError:
        raise ValueError(
            f"unknown advantage estimator {name!r}; known: {', '.join(ESTIMATORS)}"
        ) from None
    return entry.formula(inputs, specs)
