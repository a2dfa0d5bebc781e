"""Actor-loss metrics that do not depend on how a mini-batch is split over ranks and micro-batches.

verl 0.9.1's `ppo_loss` wraps the policy loss's metrics as `Metric(MEAN)`: every micro-batch
reports its own token mean (the fraction of its tokens that were clipped, say), and verl then
averages those with equal weight, first over the data-parallel ranks (`Metric.aggregate_dp`),
then over a rank's micro-batches. Micro-batches and ranks hold different numbers of response
tokens (`balance_batch` evens out sequence lengths, not response tokens, and a rank's
micro-batches are whatever rows fall together), so that is a mean of means: the same mini-batch
reports a different clip fraction on 1 and on 2 ranks. verl's own `actor/pg_loss` avoids this by
normalising each micro-batch by the mini-batch's global token count and reducing with SUM;
`global_batch_metrics` does the same for the per-token and per-sample metrics of the clip loss, so
the logged value is the mini-batch's own fraction whatever the layout.
"""

from __future__ import annotations

from typing import Any

import torch
from verl.utils.metric import AggregationType, Metric

from entropyrl.verl.tensors import padded

# Means over the micro-batch's response tokens (verl's vanilla loss and ours).
TOKEN_MEAN_METRICS = (
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/pg_clipfrac_lower",
    "clip/frac_high",
    "clip/frac_low",
    "clip/frac_dual",
)
# Means over the micro-batch's samples with at least one response token.
ROW_MEAN_METRICS = ("clip/high_mean",)


def _scalar(data: Any, name: str) -> float | None:
    value = data.get(name, None)
    value = getattr(value, "data", value)  # a non-tensor wrapper
    if isinstance(value, torch.Tensor):
        value = value.item()
    return None if value is None else float(value)


def global_batch_metrics(metrics: dict[str, Any], data: Any) -> dict[str, Any]:
    """`metrics` of one micro-batch with the local means turned into shares of the mini-batch.

    A local mean m over n local tokens becomes `Metric(SUM, m * n * dp_size / N)` with N the
    mini-batch's tokens over all ranks (verl's `batch_num_tokens`): verl's reduction (mean over
    ranks, sum over micro-batches) then yields the mini-batch's token mean exactly. Per-sample
    means use the mini-batch's row count (`global_batch_size`; verl's synthetic padding rows, when
    a batch needs them, count as rows there). Without those counts nothing changes.
    """
    dp_size = _scalar(data, "dp_size") or 1.0
    num_tokens = _scalar(data, "batch_num_tokens")
    num_rows = _scalar(data, "global_batch_size")
    if not num_tokens or "response_mask" not in data:
        return metrics
    mask = padded(data["response_mask"]).bool()
    token_share = float(mask.sum()) * dp_size / num_tokens
    row_share = float(mask.any(dim=-1).sum()) * dp_size / num_rows if num_rows else None
    for names, share in ((TOKEN_MEAN_METRICS, token_share), (ROW_MEAN_METRICS, row_share)):
        for name in names:
            metric = metrics.get(name)
            if share is None or not isinstance(metric, Metric):
                continue
            if metric.aggregation != AggregationType.MEAN:
                continue
            shares = Metric(AggregationType.SUM)
            shares.extend([float(value) * share for value in metric.values])
            metrics[name] = shares
    return metrics
