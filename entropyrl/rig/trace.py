"""Per-sample records of a real verl run, to check that each sample's values reach the loss.

With `ENTROPYRL_TRACE_DIR=DIR`, the entropy-aware trainer writes one JSON line per sample and
step to `DIR/driver.jsonl` (what it computed: the clip bound from CHAIR_i, the advantages, and the
old-policy log-probs and entropies the actor ranks returned) and the actor loss writes one line per
sample and micro-batch call to `DIR/worker-<rank>-<pid>.jsonl` (what that rank's loss actually
used). Samples are matched by a key that both sides hold and that does not depend on how the
batch was split or ordered: a hash of the prompt's dataset index and the response tokens. Two
rows share a key only when they are the same response to the same prompt, and then every traced
value agrees. Off by default: nothing is computed or written.

The weight-sync probe: each time verl syncs the actor's weights to the `hf` rollout, the sending
rank writes the fingerprint of every tensor it sent (`DIR/sync-*.jsonl`), and the rollout
server, each time it generates, writes the fingerprint of the weights it generated with
(`DIR/rollout-*.jsonl`, the tensors listed once per distinct state). A rollout that generates
with anything but the last weights the actor sent shows as a fingerprint that differs.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from entropyrl.core.files import json_dumps
from entropyrl.verl.tensors import padded

TRACE_ENV = "ENTROPYRL_TRACE_DIR"


def trace_dir() -> Path | None:
    path = os.environ.get(TRACE_ENV)
    return Path(path) if path else None


def sample_keys(
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    prompt_ids: Sequence[Any] | None = None,
) -> list[str]:
    """One key per row [B]: a hash of the row's prompt id (dataset index) and response tokens."""
    keys = []
    prompts = [None] * responses.shape[0] if prompt_ids is None else list(prompt_ids)
    for tokens, mask, prompt in zip(
        responses.detach().cpu(), response_mask.detach().cpu().bool(), prompts
    ):
        digest = hashlib.sha1(f"{prompt}:".encode() if prompt is not None else b"")
        digest.update(tokens[mask].to(torch.int64).numpy().tobytes())
        keys.append(digest.hexdigest()[:16])
    return keys


def _first_token_values(values: torch.Tensor, response_mask: torch.Tensor) -> list[float | None]:
    """The value at each row's first response token ([B, T] -> [B]); None for empty rows."""
    values, mask = values.detach().cpu().float(), response_mask.detach().cpu().bool()
    out: list[float | None] = []
    for row, row_mask in zip(values, mask):
        positions = torch.nonzero(row_mask, as_tuple=False)
        out.append(float(row[positions[0, 0]]) if len(positions) else None)
    return out


# the token mechanisms' [B, T] mask, as entropyrl.verl.loss.HALLUCINATED_FIELD names it
HALLUCINATED_KEY = "hallucinated_tokens"


def token_values(values: torch.Tensor | None, response_mask: torch.Tensor) -> list[Any]:
    """Each row's values on its response tokens ([B, T] -> B lists); None rows without values."""
    if values is None:
        return [None] * response_mask.shape[0]
    values, mask = values.detach().cpu().float(), response_mask.detach().cpu().bool()
    width = min(values.shape[-1], mask.shape[-1])
    return [row[:width][m[:width]].tolist() for row, m in zip(values, mask)]


def _plain(item: Any) -> Any:
    """A JSON-ready scalar: numpy / torch scalars as Python numbers, non-tensor wrappers opened."""
    if isinstance(item, torch.Tensor | np.generic):
        return item.item()
    if type(item).__name__ == "NonTensorData":
        return _plain(item.data)
    return item


def row_values(value: Any, size: int) -> list[Any]:
    """A per-row field of a TensorDict (tensor, non-tensor stack or list) as [size] values."""
    if value is None:
        return [None] * size
    if isinstance(value, torch.Tensor):
        value = value.reshape(value.shape[0], -1)[:, 0] if value.dim() else value.expand(size)
    elif type(value).__name__ == "NonTensorData":
        value = value.data
    if hasattr(value, "tolist"):  # numpy arrays, tensors, non-tensor stacks
        value = value.tolist()
    items = list(value) if isinstance(value, list | tuple) else [value] * size
    if len(items) != size:
        raise ValueError(f"a per-row field has {len(items)} values for {size} rows")
    return [_plain(item) for item in items]


def tensor_fingerprints(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, str]:
    """{name: 16 hex digits of blake2b over the tensor's float32 bytes}: two tensors of one
    name get the same fingerprint exactly when their values are equal in float32, so a weight
    that moved by one rounding step (lr 1e-6 on an fp32 master weight) shows."""
    prints = {}
    for name, tensor in named:
        values = tensor.detach().to("cpu", torch.float32).contiguous()
        prints[name] = hashlib.blake2b(values.numpy().tobytes(), digest_size=8).hexdigest()
    return prints


def state_digest(fingerprints: dict[str, str]) -> str:
    """One name for a whole set of tensor fingerprints (names and values, order-free)."""
    digest = hashlib.blake2b(digest_size=8)
    for name in sorted(fingerprints):
        digest.update(f"{name}={fingerprints[name]};".encode())
    return digest.hexdigest()


def write(name: str, rows: Iterable[dict[str, Any]]) -> None:
    directory = trace_dir()
    if directory is None:
        return
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f"{name}.jsonl", "a") as handle:
        for row in rows:
            handle.write(json_dumps(row) + "\n")


def sample_rows(
    *,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    clip_high: torch.Tensor | None,
    advantages: torch.Tensor | None,
    prompt_ids: Sequence[Any] | None = None,
    clip_low: torch.Tensor | None = None,
    **extra: Any,
) -> list[dict[str, Any]]:
    """Trace rows for a batch: key, position, clip bounds (None without one), advantages.

    `advantage` is the value at the first response token (what a per-sample estimator gives
    every token), `advantages` the value at every response token.
    """
    keys = sample_keys(responses, response_mask, prompt_ids)
    bounds = _per_row(clip_high, len(keys))
    low_bounds = _per_row(clip_low, len(keys))
    first = (
        [None] * len(keys) if advantages is None else _first_token_values(advantages, response_mask)
    )
    every = token_values(advantages, response_mask)
    prompts = [None] * len(keys) if prompt_ids is None else list(prompt_ids)
    return [
        {
            "key": key,
            "prompt": prompt,
            "position": position,
            "clip_high": bound,
            "clip_low": low,
            "advantage": adv,
            "advantages": all_adv,
            **extra,
        }
        for position, (key, prompt, bound, low, adv, all_adv) in enumerate(
            zip(keys, prompts, bounds, low_bounds, first, every)
        )
    ]


def _per_row(values: torch.Tensor | None, rows: int) -> list[float | None]:
    if values is None:
        return [None] * rows
    return [float(v) for v in values.detach().cpu().reshape(-1)]


def _field(data: Any, name: str) -> Any:
    return data.get(name, None)


_loss_calls = 0


def worker_rows(
    data: Any,
    clip_high: torch.Tensor | None,
    log_probs: torch.Tensor | None = None,
    clip_low: torch.Tensor | None = None,
) -> list[dict[str, Any]]:
    """Rows for one call of the actor loss on a verl micro-batch TensorDict.

    Each row also says where the sample sat (rank, this process's loss-call number, row in the
    micro-batch) and the global normalisers verl handed the loss (dp size, mini-batch tokens and
    rows), so a test can rebuild how the ranks split every mini-batch. `log_probs` [B, T] are
    the policy's log-probs the loss compares with the old ones, so the clip decisions (and the
    logged clip fractions) can be recomputed from the rows.
    """
    global _loss_calls
    _loss_calls += 1
    mask = padded(data["response_mask"])
    responses = padded(_field(data, "responses"))
    if responses is None:  # no response ids in the micro-batch: the tail of input_ids
        responses = padded(data["input_ids"])[:, -mask.shape[-1] :]
    size = mask.shape[0]
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    step = row_values(_field(data, "global_steps"), size)[0]
    shared = {
        name: row_values(_field(data, name), size)[0]
        for name in ("dp_size", "batch_num_tokens", "global_batch_size")
    }
    rows = sample_rows(
        responses=responses,
        response_mask=mask,
        clip_high=clip_high,
        clip_low=clip_low,
        advantages=padded(data["advantages"]),
        prompt_ids=row_values(_field(data, "index"), size),
        rank=rank,
        call=_loss_calls,
        process=os.getpid(),
        threads=torch.get_num_threads(),
        step=int(step) if isinstance(step, int | float) else None,
        **shared,
        fields=sorted(str(key) for key in data.keys()),  # noqa: SIM118 (TensorDict iterates rows)
    )
    old_log_probs = token_values(padded(_field(data, "old_log_probs")), mask)
    current = token_values(None if log_probs is None else padded(log_probs), mask)
    hallucinated = _field(data, HALLUCINATED_KEY)
    if hallucinated is not None:  # the token clip's mask, as the loss reads it
        for row, values in zip(rows, token_values(padded(hallucinated), mask)):
            row[HALLUCINATED_KEY] = values
    for row, values, now in zip(rows, old_log_probs, current):
        row["old_log_probs"] = values
        row["log_probs"] = now
    return rows


def driver_rows(
    *,
    tensors: dict[str, torch.Tensor | None],
    advantages: torch.Tensor | None,
    prompt_ids: Sequence[Any] | None,
    clip_high: torch.Tensor | None,
    chair_i: torch.Tensor,
    valid: torch.Tensor,
    seq_lens: Sequence[Any],
    step: int,
    clip_low: torch.Tensor | None = None,
    scores: torch.Tensor | None = None,
    groups: Sequence[Any] | None = None,
    reward_parts: Sequence[dict[str, Any] | None] | None = None,
    hallucinated: torch.Tensor | None = None,
) -> list[dict[str, Any]]:
    """Rows for one step of the entropy-aware trainer, in the order of its (balanced) batch.

    Besides the bound and advantages, each row keeps the old-policy log-probs and entropies the
    actor ranks computed for the sample, the reference's log-probs when there is a reference,
    verl's `seq_len` tag (what `balance_batch` sorts on), the sample's reward (`score`), its
    GRPO group (`group`: verl's uid) and response tokens, so a step's advantages can be computed
    again from the trace; `run` (the trainer's process id) tells a resumed run's rows apart;
    `reward_parts` is what the reward reported beside the score (its extra info), so the score
    can be recomposed from its parts; with a token mechanism on, `hallucinated_tokens` is the
    trainer's 0/1 mask on each response token (the key is absent otherwise).
    """
    mask = tensors["response_mask"]
    rows = sample_rows(
        responses=tensors["responses"],
        response_mask=mask,
        clip_high=clip_high,
        clip_low=clip_low,
        advantages=advantages,
        prompt_ids=prompt_ids,
        step=step,
    )
    old_log_probs = token_values(tensors.get("old_log_probs"), mask)
    entropy = token_values(tensors.get("entropy"), mask)
    reference = token_values(tensors.get("ref_log_prob"), mask)
    response = token_values(tensors.get("responses"), mask)
    size = mask.shape[0]
    score_list = [None] * size if scores is None else [float(v) for v in scores.reshape(-1)]
    group_list = [None] * size if groups is None else [_plain(g) for g in groups]
    parts_list = [None] * size if reward_parts is None else list(reward_parts)
    for row, chair, keep, seq_len, logp, ent, ref, score, group, tokens, parts in zip(
        rows,
        chair_i.tolist(),
        valid.tolist(),
        seq_lens,
        old_log_probs,
        entropy,
        reference,
        score_list,
        group_list,
        response,
        parts_list,
    ):
        row.update(
            run=os.getpid(),
            response=None if tokens is None else [int(t) for t in tokens],
            chair_i=None if chair != chair else chair,
            padding=not keep,
            seq_len=_plain(seq_len),
            old_log_probs=logp,
            entropy=ent,
            ref_log_prob=ref,
            score=score,
            group=group,
            reward_parts=None if parts is None else {k: _plain(v) for k, v in parts.items()},
        )
    if hallucinated is not None:
        for row, values in zip(rows, token_values(hallucinated, mask)):
            row[HALLUCINATED_KEY] = values
    return rows


def read(directory: Path, prefix: str) -> list[dict[str, Any]]:
    """Every row of the trace files `DIR/<prefix>*.jsonl`."""
    rows = []
    for path in sorted(directory.glob(f"{prefix}*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows
