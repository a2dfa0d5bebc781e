"""Clip metrics of one mini-batch are the same however verl splits it over ranks and micro-batches.

The micro-batches go through our actor loss and then through verl 0.9.1's own reduction
(`append_to_dict` per rank as `postprocess_batch_func` does, `Metric.aggregate_dp` over ranks as
`train_mini_batch` does, `reduce_metrics` on the driver). The ranks get deliberately unequal
token shares: reduced as verl reduces its policy-loss metrics (equal-weight means of the ranks'
and micro-batches' own means), the clip fractions would depend on the layout.
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.utils.metric import Metric, reduce_metrics
from verl.utils.py_functional import append_to_dict

import entropyrl.verl.plugin  # noqa: F401  (registers the policy loss)
from entropyrl.verl.loss import CLIP_FIELD, PerSampleClipPPOLoss
from entropyrl.verl.rank_metrics import ROW_MEAN_METRICS, TOKEN_MEAN_METRICS

PROMPT = 3
ROWS, WIDTH = 8, 9
CLIP_METRICS = tuple(
    f"actor/{name}" if name.startswith("clip/") else name
    for name in TOKEN_MEAN_METRICS + ROW_MEAN_METRICS
)


def mini_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """One PPO mini-batch: short rows first, long rows last (so a split by rows is uneven)."""
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(ROWS, WIDTH, generator=gen) - 0.5
    # Ratios between 0.5 and 1.8: both clip bounds are crossed somewhere.
    log_prob = old + torch.empty(ROWS, WIDTH).uniform_(-0.7, 0.6, generator=gen)
    return {
        "log_prob": log_prob,
        "old": old,
        "adv": torch.randn(ROWS, generator=gen),
        "lengths": torch.tensor([1, 2, 1, 3, 9, 8, 9, 7]),
        "clip_high": torch.tensor([0.3, 0.5, 0.3, 0.5, 0.5, 0.3, 0.5, 0.3]),
    }


def micro_batch(batch: dict[str, torch.Tensor], rows: list[int], **globals_):
    """(model_output, data) for `rows`, laid out as verl's engines hand them to the loss."""
    lengths = batch["lengths"][rows]
    mask = (torch.arange(WIDTH).unsqueeze(0) < lengths.unsqueeze(1)).float()
    pieces = []
    for i, row in enumerate(rows):
        n = int(lengths[i])
        pieces += [torch.zeros(PROMPT - 1), batch["log_prob"][row, :n], torch.zeros(1)]
    values = torch.cat(pieces)
    data = TensorDict(
        {
            "prompts": torch.ones(len(rows), PROMPT, dtype=torch.long),
            "responses": torch.ones(len(rows), WIDTH, dtype=torch.long),
            "attention_mask": torch.cat([torch.ones(len(rows), PROMPT), mask], dim=1).long(),
            "response_mask": mask,
            "old_log_probs": batch["old"][rows],
            "advantages": batch["adv"][rows].unsqueeze(-1) * mask,
            "ref_log_prob": batch["old"][rows] - 0.1,
            CLIP_FIELD: batch["clip_high"][rows],
        },
        batch_size=len(rows),
    )
    tu.assign_non_tensor(data, **globals_)
    return {"log_probs": values, "entropy": values.abs()}, data


def reduced_metrics(loss_fn, batch, layout: list[list[list[int]]]) -> dict[str, float]:
    """Metrics of one mini-batch split as `layout[rank][micro_batch] = rows`, reduced as verl does."""
    total_tokens = int(batch["lengths"].sum())
    per_rank = []
    for micro_batches in layout:
        collected: dict = {}
        for rows in micro_batches:
            model_output, data = micro_batch(
                batch,
                rows,
                dp_size=len(layout),
                batch_num_tokens=total_tokens,
                global_batch_size=ROWS,
            )
            _, metrics = loss_fn(model_output, data)
            append_to_dict(collected, metrics)  # postprocess_batch_func, per rank
        per_rank.append(collected)
    # `_postprocess_output` gathers each key over the ranks; `train_mini_batch` reduces.
    output = {}
    for key in per_rank[0]:
        values = [rank[key] for rank in per_rank]
        output[key] = Metric.aggregate_dp(values) if isinstance(values[0], Metric) else values
    return reduce_metrics(
        {f"actor/{k}" if k.startswith("clip/") else k: v for k, v in output.items()}
    )


@pytest.fixture
def loss_fn(chair_config):
    actor = OmegaConf.create(
        OmegaConf.to_container(chair_config.actor_rollout_ref.actor, resolve=True)
    )
    return PerSampleClipPPOLoss(actor)


LAYOUTS = {
    "1 rank, 1 micro-batch": [[list(range(ROWS))]],
    "1 rank, 2 micro-batches": [[[0, 1, 2, 3], [4, 5, 6, 7]]],
    # balance_batch gives each rank the same number of rows, not of tokens.
    "2 ranks, unequal token shares": [[[0, 1], [2, 3]], [[4, 5], [6, 7]]],
    "2 ranks, mixed": [[[0, 4], [1, 5]], [[2, 6], [3, 7]]],
}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_clip_metrics_are_the_mini_batchs_own_whatever_the_layout(loss_fn, seed):
    batch = mini_batch(seed)
    whole = reduced_metrics(loss_fn, batch, LAYOUTS["1 rank, 1 micro-batch"])
    assert whole["actor/clip/frac_high"] + whole["actor/clip/frac_low"] > 0  # the clip acts
    # The reference: token-weighted over the whole mini-batch, sample-weighted for the bound.
    assert whole["actor/clip/high_mean"] == pytest.approx(float(batch["clip_high"].mean()))
    shares = [
        int(batch["lengths"][[row for rows in rank for row in rows]].sum())
        for rank in LAYOUTS["2 ranks, unequal token shares"]
    ]
    assert shares[0] * 3 < shares[1]
    for name, layout in LAYOUTS.items():
        got = reduced_metrics(loss_fn, batch, layout)
        for key in (*CLIP_METRICS, "actor/pg_loss"):
            assert got[key] == pytest.approx(whole[key], rel=1e-6, abs=1e-9), (name, key)
