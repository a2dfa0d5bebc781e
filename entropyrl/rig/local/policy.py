"""Policy-side tensor work of the local runner: sampling, response masks, log-probs, entropies.

A batch is a dict of model inputs for the *prompts* (`input_ids` [B, P] left-padded,
`attention_mask` [B, P], plus `pixel_values`, `image_grid_thw`, `mm_token_type_ids` for a VLM).
Responses are [B, R] right-padded with the pad id after the first end-of-turn token.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from entropyrl.core.entropy import token_entropy

__all__ = [
    "expand_prompts",
    "forbidden_token_ids",
    "generate",
    "response_log_probs",
    "response_mask",
    "select_rows",
    "sequence_inputs",
]


def forbidden_token_ids(tokenizer: Any) -> list[int]:
    """Every special / added token but end-of-turn: an untrained model that samples
    `<|image_pad|>` breaks the next forward ("image features and image tokens do not match")."""
    keep = tokenizer.eos_token_id
    ids = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    return sorted(i for i in ids if i != keep)


def expand_prompts(batch: Mapping[str, Tensor], n: int) -> dict[str, Tensor]:
    """Repeat every prompt `n` times (rows b*n .. b*n+n-1 come from prompt b).

    `pixel_values` holds the patches of all images back to back; each image's block is repeated
    as a whole, following `image_grid_thw`.
    """
    out: dict[str, Tensor] = {}
    for key, value in batch.items():
        if key == "pixel_values":
            sizes = batch["image_grid_thw"].prod(dim=-1).tolist()
            blocks = torch.split(value, sizes, dim=0)
            out[key] = torch.cat([block for block in blocks for _ in range(n)], dim=0)
        else:
            out[key] = value.repeat_interleave(n, dim=0)
    return out


def response_mask(responses: Tensor, eos_id: int) -> Tensor:
    """LongTensor[B, R]: 1 up to and including the first `eos_id`, 0 after it."""
    is_eos = responses == eos_id
    before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()  # eos seen strictly before t
    return (before == 0).long()


@torch.no_grad()
def generate(
    model: Any,
    prompts: Mapping[str, Tensor],
    *,
    eos_id: int,
    pad_id: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    greedy: bool = False,
    suppress: list[int] | None = None,
) -> tuple[Tensor, Tensor]:
    """Sample (or greedy-decode) one response per prompt row.

    Returns:
        (responses LongTensor[B, R], mask LongTensor[B, R]); R <= max_new_tokens, positions after
        the first end-of-turn hold `pad_id` and mask 0.
    """
    was_training = model.training
    model.eval()
    kwargs: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "suppress_tokens": suppress or None,
    }
    if greedy:
        kwargs.update(do_sample=False)
    else:
        kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    output = model.generate(**prompts, **kwargs)
    if was_training:
        model.train()
    responses = output[:, prompts["input_ids"].shape[1] :]
    mask = response_mask(responses, eos_id)
    responses = torch.where(mask.bool(), responses, torch.full_like(responses, pad_id))
    return responses, mask


@torch.no_grad()
def greedy_texts(
    model: Any,
    tokenizer: Any,
    prompts: Callable[[Sequence[Any]], Mapping[str, Tensor]],
    items: Sequence[Any],
    *,
    max_new_tokens: int,
    batch_size: int = 32,
    suppress: list[int] | None = None,
) -> list[str]:
    """Greedy decoding of every item, `batch_size` prompts at a time, as decoded text.

    `prompts(chunk)` builds the model inputs of a chunk of items (a task's `prompts` method);
    evaluation of every task goes through here so all are decoded the same way.
    """
    device = next(model.parameters()).device
    texts: list[str] = []
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        inputs = {k: v.to(device) for k, v in prompts(chunk).items()}
        responses, _ = generate(
            model,
            inputs,
            eos_id=tokenizer.eos_token_id,
            pad_id=tokenizer.pad_token_id,
            max_new_tokens=max_new_tokens,
            greedy=True,
            suppress=suppress,
        )
        texts += tokenizer.batch_decode(responses, skip_special_tokens=True)
    return texts


def sequence_inputs(
    prompts: Mapping[str, Tensor], responses: Tensor, mask: Tensor
) -> dict[str, Tensor]:
    """Model inputs for prompt + response (right-padded responses, left-padded prompts)."""
    inputs = dict(prompts)
    inputs["input_ids"] = torch.cat([prompts["input_ids"], responses], dim=1)
    inputs["attention_mask"] = torch.cat(
        [prompts["attention_mask"], mask.to(prompts["attention_mask"].dtype)], dim=1
    )
    if "mm_token_type_ids" in prompts:
        zeros = torch.zeros_like(responses, dtype=prompts["mm_token_type_ids"].dtype)
        inputs["mm_token_type_ids"] = torch.cat([prompts["mm_token_type_ids"], zeros], dim=1)
    if "pixel_values" not in prompts:
        # Text models read positions from here; left padding must not shift them.
        position_ids = torch.cumsum(inputs["attention_mask"], dim=1) - 1
        inputs["position_ids"] = position_ids.clamp_min(0)
    return inputs


def response_log_probs(
    model: Any,
    prompts: Mapping[str, Tensor],
    responses: Tensor,
    mask: Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs of the response tokens (and per-token entropy) at the sampling temperature.

    Only the positions that predict a response token inside `mask` go through the LM head (the
    vocabulary-sized work is most of a tiny model's step, and padding is a large share of a
    batch of short captions).

    Returns:
        (log_prob Tensor[B, R], entropy Tensor[B, R] or None); 0 at masked positions.
    """
    inputs = sequence_inputs(prompts, responses, mask)
    length = responses.shape[1]
    keep = mask.bool()
    head = model.get_output_embeddings()
    if head is None:  # no separate LM head to call: the model's logits of the response positions
        logits = model(**inputs, use_cache=False, logits_to_keep=length + 1).logits
        logits = logits[:, :-1, :][keep]
    else:
        hidden = model.base_model(**inputs, use_cache=False).last_hidden_state
        logits = head(hidden[:, -length - 1 : -1, :][keep])
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    picked = torch.log_softmax(logits, dim=-1).gather(-1, responses[keep].unsqueeze(-1))
    log_prob = logits.new_zeros(responses.shape).masked_scatter(keep, picked.squeeze(-1))
    entropy = None
    if with_entropy:
        entropy = logits.new_zeros(responses.shape).masked_scatter(
            keep, token_entropy(logits.detach())
        )
    return log_prob, entropy


def select_rows(batch: Mapping[str, Tensor], index: Tensor) -> dict[str, Tensor]:
    """Rows `index` of a prompt batch; each image's `pixel_values` block travels with its row."""
    out: dict[str, Tensor] = {}
    for key, value in batch.items():
        if key == "pixel_values":
            sizes = batch["image_grid_thw"].prod(dim=-1).tolist()
            blocks = torch.split(value, sizes, dim=0)
            out[key] = torch.cat([blocks[i] for i in index.tolist()], dim=0)
        else:
            out[key] = value[index]
    return out
