"""The advantage step's fields in and out of verl 0.9.1's TransferQueue, in verl's layout.

verl's v1 trainer keeps a step's tensors in TransferQueue, keyed per sample; the driver holds
only their keys (`KVBatchMeta`). The entropy-aware trainer reads the fields its formulas need
as padded [B, T] tensors and writes its own beside `advantages`: per-sample ones ([B]) as they
are, per-token ones nested like the response mask, as verl writes `advantages`, so every
mini-batch and PPO epoch of the actor update carries them.
"""

from __future__ import annotations

from typing import Any

import torch
import transfer_queue as tq
from tensordict import TensorDict

from entropyrl.verl.tensors import padded

__all__ = [
    "TENSOR_FIELDS",
    "available",
    "fetch_step_fields",
    "get_fields",
    "put_fields",
    "put_per_token",
    "step_field_names",
]

TENSOR_FIELDS = ("entropy", "old_log_probs", "ref_log_prob", "responses", "response_mask")


def available(batch: Any, names: tuple[str, ...]) -> list[str]:
    """Those of `names` the batch's metadata lists (fields written before the old-log-prob
    pass, such as the dataset's `index` and the reward's `extra_fields`)."""
    fields = getattr(batch, "fields", None)
    return list(names) if fields is None else [name for name in names if name in fields]


def step_field_names(config: Any, use_reference_policy: bool) -> list[str]:
    """The per-token fields verl 0.9.1 has written to TransferQueue when advantages are computed.

    From the config, not from the batch's metadata: the driver's `KVBatchMeta` is the one the
    old-log-prob pass returned, and the reference pass writes `ref_log_prob` after it without
    refreshing it, so the metadata would leave the reference out. In rollout-correction bypass
    mode the old log-probs are the rollout's and verl computes no entropy.
    """
    correction = config.algorithm.get("rollout_correction", None)
    bypass = bool(correction and correction.get("bypass_mode", False))
    names = ["responses", "response_mask", "old_log_probs"]
    if not bypass:
        names.append("entropy")
    if use_reference_policy:
        names.append("ref_log_prob")
    return names


def get_fields(batch: Any, names: list[str]) -> dict[str, Any]:
    """The batch's `names` as TransferQueue holds them (nested per-token fields stay nested)."""
    return tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=names)


def fetch_step_fields(
    batch: Any, names: list[str]
) -> tuple[dict[str, torch.Tensor | None], list[Any] | None]:
    """Padded [B, T] tensors of `names` (None for the others of `TENSOR_FIELDS`) and the
    per-sample extra fields (the reward's extra info), fetched by key."""
    data = get_fields(batch, names)
    tensors = {name: padded(data.get(name, None)) for name in TENSOR_FIELDS}
    extra = None
    if available(batch, ("extra_fields",)):
        got = get_fields(batch, ["extra_fields"])
        if "extra_fields" in got:
            extra = list(got["extra_fields"])
    return tensors, extra


def put_fields(batch: Any, fields: dict[str, torch.Tensor]) -> Any:
    """Write `fields` (each [B, ...], as given) beside the batch's own; returns verl's updated
    batch metadata."""
    return tq.kv_batch_put(
        keys=batch.keys,
        partition_id=batch.partition_id,
        fields=TensorDict(fields, batch_size=len(batch)),
    )


def put_per_token(batch: Any, fields: dict[str, torch.Tensor]) -> Any:
    """Write padded [B, T] `fields` in verl's layout: nested like the response mask when verl
    keeps it nested (as verl writes `advantages`), padded otherwise."""
    from verl.workers.utils.padding import response_to_nested

    mask = get_fields(batch, ["response_mask"])["response_mask"]
    nested = getattr(mask, "is_nested", False)
    out = {
        name: response_to_nested(value, mask) if nested else value for name, value in fields.items()
    }
    return put_fields(batch, out)
