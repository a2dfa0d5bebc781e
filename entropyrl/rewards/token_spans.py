"""Character spans of a caption -> the response token positions that carry them.

CHAIR says where each hallucinated mention is in the caption (``[start, end)`` character
spans, ``chair_server.contract``); the token-level mechanisms need response token indices
(0 = first response token). A token belongs to a mention when its character range in the
caption overlaps the span: a BPE token " dog" (its leading space included) belongs to "dog",
both tokens of "hot dog" to "hot dog", a "." after it to nothing.

The caption both engines score is the response decoded with ``skip_special_tokens=True``
(verl's reward managers and the local runner), so the character ranges must index that string:
``response_offsets`` gives them for the response's own ids (special tokens, as an end-of-turn
``<|im_end|>``, get an empty range and are never marked), ``text_offsets`` for a string when
only the string is known (its own tokenisation, which equals the response's for a response
the tokenizer would have produced).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "caption_positions",
    "hallucinated_positions",
    "overlapping_tokens",
    "response_offsets",
    "text_offsets",
]


def overlapping_tokens(spans: Tensor, offsets: Tensor) -> Tensor:
    """Which tokens share a character with any span.

    Args:
        spans: LongTensor[S, 2] character spans ``[start, end)``.
        offsets: LongTensor[T, 2] each token's character range ``[start, end)``; an empty
            range (a special token) overlaps nothing.

    Returns:
        BoolTensor[T].
    """
    if spans.numel() == 0 or offsets.numel() == 0:
        return torch.zeros(offsets.shape[0], dtype=torch.bool)
    starts, ends = offsets[:, 0:1], offsets[:, 1:2]  # [T, 1]
    overlap = (starts < spans[:, 1]) & (spans[:, 0] < ends)  # [T, S]
    return overlap.any(dim=1) & (ends[:, 0] > starts[:, 0])


def hallucinated_positions(
    spans: Sequence[Sequence[int]], offsets: Sequence[Sequence[int]]
) -> list[int]:
    """Sorted token indices (into `offsets`, i.e. from the first response token) of the tokens
    overlapping `spans`; ``[]`` when there is none. ValueError for a malformed span."""
    span_tensor = torch.as_tensor([list(s) for s in spans], dtype=torch.long).reshape(-1, 2)
    if (span_tensor[:, 0] > span_tensor[:, 1]).any() or (span_tensor < 0).any():
        raise ValueError(f"spans must be [start, end) with 0 <= start <= end, got {spans!r}")
    offset_tensor = torch.as_tensor([list(o) for o in offsets], dtype=torch.long).reshape(-1, 2)
    return torch.nonzero(overlapping_tokens(span_tensor, offset_tensor)).flatten().tolist()


def text_offsets(tokenizer: Any, text: str) -> list[tuple[int, int]]:
    """Each token's ``[start, end)`` in `text` under `tokenizer` (a fast tokenizer's
    ``return_offsets_mapping``), no special tokens added."""
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return [(int(a), int(b)) for a, b in encoded["offset_mapping"]]


def response_offsets(
    tokenizer: Any, ids: Sequence[int], response_start: int = 0
) -> tuple[str, list[tuple[int, int]]]:
    """The response's text and each response token's character range in it.

    Args:
        tokenizer: the model's (fast) tokenizer.
        ids: token ids; the response is ``ids[response_start:]`` (pass the prompt's length to
            skip a chat-template prefix: positions then count from the first response token).

    Returns:
        (the response decoded with ``skip_special_tokens=True``, ``[(start, end), ...]`` one per
        response token, empty for special tokens and padding). When re-encoding the text gives
        the response's ids back, the tokenizer's offsets are used; otherwise (a sampled
        tokenisation the tokenizer would not produce) each token gets the characters its
        decoding adds to the decoded prefix.
    """
    response = [int(t) for t in ids[response_start:]]
    text = tokenizer.decode(response, skip_special_tokens=True)
    special = set(tokenizer.all_special_ids)
    kept = [i for i, t in enumerate(response) if t not in special]
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets: list[tuple[int, int]] = [(len(text), len(text))] * len(response)
    if list(encoded["input_ids"]) == [response[i] for i in kept]:
        for i, (a, b) in zip(kept, encoded["offset_mapping"]):
            offsets[i] = (int(a), int(b))
        return text, _fill_empty(offsets)
    lengths = [
        len(tokenizer.decode(response[:k], skip_special_tokens=True))
        for k in range(len(response) + 1)
    ]
    for i in range(len(response)):
        end = min(lengths[i + 1], len(text))
        offsets[i] = (min(lengths[i], end), end)
    return text, offsets


def caption_positions(
    tokenizer: Any,
    spans: Sequence[Sequence[int]],
    caption: str,
    response_ids: Sequence[int] | None = None,
) -> list[int]:
    """The response token positions of `spans` in `caption`: through `response_ids` (which
    must decode to `caption`, else ValueError: other tokens would be marked) when given, else
    through the tokenizer's own tokenisation of `caption`."""
    if response_ids is None:
        return hallucinated_positions(spans, text_offsets(tokenizer, caption))
    text, offsets = response_offsets(tokenizer, response_ids)
    if text != caption:
        raise ValueError(
            "the response ids do not decode to the caption scored: its token positions would "
            "mark other tokens"
        )
    return hallucinated_positions(spans, offsets)


def _fill_empty(offsets: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Empty ranges of special tokens placed where they sit (after the token before them)."""
    out, position = [], 0
    for a, b in offsets:
        if b > a:
            position = b
            out.append((a, b))
        else:
            out.append((position, position))
    return out
