"""MaxEnt-GRPO (experimental): a closed-form sequence-level target over each group's candidates.

Per context with K candidates, listwise target q and reference policy pi_ref, maximising
E_pi[log q] + tau * H(pi) - beta * KL(pi || pi_ref) over distributions on the candidates gives

    pi*(a_i) ∝ q_i^{1/(tau+beta)} * pi_ref_i^{beta/(tau+beta)}.

Limits: beta -> 0 gives pi* ∝ q^{1/tau} (a pure maximum-entropy fit of a sharpened q; q itself
at tau = 1); tau -> 0 gives pi* ∝ q^{1/beta} * pi_ref (reference-anchored, GRPO-like). The
projection to tokens is a weighted MLE of the candidates with weights pi*; its author reports
a risk of collapse, so it stays behind its own estimator name.
"""

from __future__ import annotations

import torch
from torch import Tensor

from entropyrl.core._segments import (
    check_1d,
    float_dtype,
    gather,
    group_index,
    seg_count,
    seg_max,
    seg_sum,
)
from entropyrl.core.specs import MAXENT_SOURCES, MaxEntSpec

__all__ = ["LISTWISE_SOURCES", "listwise_log_target", "maxent_advantage", "maxent_target"]

LISTWISE_SOURCES = MAXENT_SOURCES


def _finite(x: Tensor, name: str, length: int | None = None) -> None:
    check_1d(x, name, length)
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} must be finite (no NaN/inf)")


def _group_log_softmax(logits: Tensor, inv: Tensor, num_groups: int) -> Tensor:
    # Shift by the group maximum first and subtract log(sum) afterwards: subtracting a full
    # logsumexp of -5000 in float32 would round the result to the 5e-4 spacing of floats there.
    shifted = logits - gather(seg_max(logits, inv, num_groups), inv)
    total = seg_sum(torch.exp(shifted), inv, num_groups)
    return shifted - gather(torch.log(total), inv)


def maxent_target(
    log_q: Tensor, log_pi_ref: Tensor, group: Tensor, *, tau: float, beta: float
) -> Tensor:
    """log pi*_i = [(log q_i + beta log pi_ref_i) / (tau + beta)] - logsumexp over the group.

    Args:
        log_q: Tensor[B] log target (need not be normalised: a per-group constant cancels).
        log_pi_ref: Tensor[B] sequence log-likelihood of each candidate under the reference.
        group: IntTensor[B] group ids. tau, beta: >= 0 with tau + beta > 0.

    Returns:
        Tensor[B] log pi*, normalised within each group (logsumexp 0), in log space throughout
        so sequence log-likelihoods of -1e3 do not underflow.
    """
    _check_tau_beta(tau, beta)
    _finite(log_q, "log_q")
    _finite(log_pi_ref, "log_pi_ref", log_q.shape[0])
    inv, num_groups = group_index(group, log_q.shape[0])
    return _target(log_q, log_pi_ref, inv, num_groups, tau, beta)


def _check_tau_beta(tau: float, beta: float) -> None:
    if tau < 0 or beta < 0 or not tau + beta > 0:
        raise ValueError(f"need tau >= 0, beta >= 0 and tau + beta > 0, got tau={tau}, beta={beta}")


def _target(log_q, log_pi_ref, inv, num_groups, tau, beta) -> Tensor:
    dtype = float_dtype(log_q)
    logits = (log_q.to(dtype) + beta * log_pi_ref.to(dtype)) / (tau + beta)
    return _group_log_softmax(logits, inv, num_groups)


def _group_ranks(x: Tensor, inv: Tensor, num_groups: int) -> Tensor:
    """Tensor[B] rank within the group, 0 = best (highest score); ties share their mean rank."""
    n = x.shape[0]
    order = torch.argsort(x, descending=True, stable=True)
    order = order[torch.argsort(inv[order], stable=True)]  # by group, then score descending
    g_sorted = inv[order]
    x_sorted = x[order]
    counts = seg_count(inv, num_groups, torch.long)
    group_start = torch.cumsum(counts, 0) - counts
    new_block = torch.ones(n, dtype=torch.bool, device=x.device)
    if n > 1:
        new_block[1:] = (g_sorted[1:] != g_sorted[:-1]) | (x_sorted[1:] != x_sorted[:-1])
    block = torch.cumsum(new_block.long(), 0) - 1
    pos = torch.arange(n, device=x.device)
    block_first = pos[new_block]
    block_size = torch.bincount(block)
    rank_sorted = (block_first[block] - group_start[g_sorted]).to(x.dtype) + (
        block_size[block] - 1
    ).to(x.dtype) / 2
    ranks = torch.empty_like(x)
    ranks[order] = rank_sorted
    return ranks


def listwise_log_target(
    scores: Tensor,
    group: Tensor,
    *,
    source: str = MaxEntSpec.source,
    temperature: float = MaxEntSpec.temperature,
) -> Tensor:
    """Tensor[B] log q, normalised within each group.

    ``rewards``: q = softmax(scores / temperature) within the group. ``ranks``: q ∝
    exp(-rank / temperature), rank 0 for the best candidate and tied scores sharing their mean
    rank, so q ignores the reward scale. Equal scores give a uniform q either way.
    """
    _check_listwise(source, temperature)
    _finite(scores, "scores")
    inv, num_groups = group_index(group, scores.shape[0])
    return _group_log_softmax(
        _listwise_logits(scores, inv, num_groups, source, temperature), inv, num_groups
    )


def _check_listwise(source: str, temperature: float) -> None:
    if source not in LISTWISE_SOURCES:
        raise ValueError(f"source must be one of {LISTWISE_SOURCES}, got {source!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def _listwise_logits(scores, inv, num_groups, source, temperature) -> Tensor:
    """Unnormalised log q (a per-group constant away from the normalised one)."""
    x = scores.to(float_dtype(scores))
    if source == "ranks":
        x = -_group_ranks(x, inv, num_groups)
    return x / temperature


def maxent_advantage(
    scores: Tensor,
    log_pi_ref: Tensor,
    group: Tensor,
    *,
    tau: float = MaxEntSpec.tau,
    beta: float = MaxEntSpec.beta,
    source: str = MaxEntSpec.source,
    temperature: float = MaxEntSpec.temperature,
) -> tuple[Tensor, dict[str, float]]:
    """Centred MaxEnt-GRPO weight K_g * pi*_i - 1, used as a per-sample advantage.

    The projection is a weighted MLE of the candidates with weights pi*_i. Taking the
    uniform-weight MLE (1/K_g) sum_i log pi(a_i) as a baseline, what is left is
    (1/K_g) sum_i (K_g pi*_i - 1) log pi(a_i): the weight K_g pi*_i - 1 is zero-sum per group
    (0 for a group of one and for a uniform pi*), so it plugs into the same PPO loss as a GRPO
    advantage. Sign: candidates pi* favours over uniform are pushed up. The defaults
    (`entropyrl.core.specs.MaxEntSpec`) are a starting point, not tuned values.

    Args:
        scores: Tensor[B] rewards. log_pi_ref: Tensor[B] reference sequence log-likelihoods.
        group: IntTensor[B] group ids.

    Returns:
        (Tensor[B] weights, metrics): ``maxent/target_entropy`` (mean over groups of H(pi*)),
        ``maxent/weight/max``, ``maxent/weight/min``.
    """
    _check_listwise(source, temperature)
    _check_tau_beta(tau, beta)
    _finite(scores, "scores")
    _finite(log_pi_ref, "log_pi_ref", scores.shape[0])
    inv, num_groups = group_index(group, scores.shape[0])
    # q's per-group normaliser cancels in pi*'s own normalisation: one softmax suffices.
    log_q = _listwise_logits(scores, inv, num_groups, source, temperature)
    dtype = float_dtype(log_q)
    logits = (log_q.to(dtype) + beta * log_pi_ref.to(dtype)) / (tau + beta)
    shifted = logits - gather(seg_max(logits, inv, num_groups), inv)
    e = torch.exp(shifted)
    total = seg_sum(e, inv, num_groups)
    count = seg_count(inv, num_groups, dtype)
    # K pi* - 1 = (K / sum_g e) * e - 1, with pi* = e / sum_g e.
    weight = gather(count / total.clamp_min(torch.finfo(dtype).tiny), inv) * e - 1.0
    if weight.numel() == 0:
        return weight, dict.fromkeys(
            ("maxent/target_entropy", "maxent/weight/max", "maxent/weight/min"), 0.0
        )
    # H(pi*_g) = log sum e - sum(e * shifted) / sum e (empty groups are left out).
    nonempty = count > 0
    ent = torch.log(total) - seg_sum(e * shifted, inv, num_groups) / total
    ent_mean = torch.where(nonempty, ent, 0.0).sum() / nonempty.sum()
    stats = torch.stack([ent_mean, weight.max(), weight.min()]).to(torch.float64).tolist()
    return weight, dict(
        zip(("maxent/target_entropy", "maxent/weight/max", "maxent/weight/min"), stats)
    )
