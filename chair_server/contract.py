"""The request contract of the CHAIR service, in one place for both sides.

A scoring request holds captions as `{"image_id": int | str, "caption": str}` objects. The
service (`chair_server.app`, `chair_server.scorer`) refuses a malformed one with a 400 naming
the field; the training-side client (`entropyrl.rewards.chair_client`) checks the same rules
before sending, with the same words, so a caption it sends is one the service accepts. No
torch, no Flask: both sides import this.

The answer's sentence entries say where each mention is: ``mention_spans`` holds one
``[start, end]`` per element of ``mentioned`` and ``hallucinated_spans`` one per element of
``hallucinated``, in the same order (a repeated mention has a span each). ``start`` and
``end`` are character offsets into the caption string the client sent, end exclusive:
``caption[start:end]`` is the mention's text ("Dogs", "hot dog"), without punctuation. The
fields are additive; an answer without them (a service from before) still parses, and
``spans`` says None for it.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BODY_KEYS",
    "FIELDS",
    "HALLUCINATED_SPANS_KEY",
    "MENTION_SPANS_KEY",
    "ItemProblem",
    "RequestError",
    "TooManyCaptions",
    "check_body_keys",
    "check_items",
    "image_id",
    "item_problem",
    "spans",
]

FIELDS = ("image_id", "caption")
# the keys of a `POST /v1/chair` body; any other is refused (a typo such as `include_caption`
# would otherwise change nothing, silently)
BODY_KEYS = ("captions", "include_captions")
# the sentence entry's character spans of its mentions / of its hallucinated mentions
MENTION_SPANS_KEY = "mention_spans"
HALLUCINATED_SPANS_KEY = "hallucinated_spans"
_COUNTED = {MENTION_SPANS_KEY: "mentioned", HALLUCINATED_SPANS_KEY: "hallucinated"}


class RequestError(ValueError):
    """A request the service refuses (HTTP 400); the message names the field."""


class TooManyCaptions(RequestError):
    """More captions than the service's `--max-batch` (HTTP 413)."""


@dataclass(frozen=True)
class ItemProblem:
    """Why one caption object breaks the contract: the field at fault and the message."""

    field: str
    message: str


def image_id(value: object) -> int | str | None:
    """The id as the service accepts it (an int or a string), None when it cannot be one.

    Integer types other than int (numpy's, anything with `__index__`) become ints, as JSON
    sends them; bools, floats, None and containers are refused.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int | str):
        return value
    index = getattr(type(value), "__index__", None)
    if index is None or type(value).__name__.startswith("bool"):  # numpy.bool_ has __index__
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def item_problem(item: object, where: str) -> ItemProblem | None:
    """The first way `item` (named `where`, e.g. "captions[3]") breaks the contract, or None."""
    if not isinstance(item, Mapping):
        return ItemProblem("", f"{where} must be an object with image_id and caption")
    for name in FIELDS:
        if name not in item:
            return ItemProblem(name, f"{where}.{name} is missing")
    if image_id(item["image_id"]) is None:
        return ItemProblem("image_id", f"{where}.image_id must be an integer or a string")
    if not isinstance(item["caption"], str):
        return ItemProblem("caption", f"{where}.caption must be a string")
    return None


def check_body_keys(body: Mapping[str, Any]) -> None:
    """RequestError naming the first key of `body` outside `BODY_KEYS`, with the nearest one."""
    import difflib

    for key in body:
        if key not in BODY_KEYS:
            near = difflib.get_close_matches(str(key), BODY_KEYS, n=1)
            hint = f"did you mean {near[0]}? " if near else ""
            raise RequestError(f"body.{key}: unknown key; {hint}accepted: {', '.join(BODY_KEYS)}")


def check_items(items: object, where: str, max_batch: int | None = None) -> list[Mapping[str, Any]]:
    """`items` when it is a list of well-formed caption objects (at most `max_batch`), else
    RequestError (TooManyCaptions for the count) naming the first field at fault."""
    if not isinstance(items, list):
        raise RequestError(f"{where} must be a list of {{image_id, caption}} objects")
    if max_batch is not None and len(items) > max_batch:
        raise TooManyCaptions(f"{where} has {len(items)} captions, more than max_batch={max_batch}")
    for i, item in enumerate(items):
        problem = item_problem(item, f"{where}[{i}]")
        if problem is not None:
            raise RequestError(problem.message)
    return items


def spans(
    entry: Mapping[str, Any], key: str = HALLUCINATED_SPANS_KEY
) -> list[tuple[int, int]] | None:
    """The ``(start, end)`` spans under ``key`` of a scored sentence entry; None when the entry
    has none (an answer from a service without spans). ValueError when they are malformed:
    not one pair of ints ``0 <= start <= end`` per element of the list they belong to."""
    if key not in _COUNTED:
        raise ValueError(f"key must be one of {sorted(_COUNTED)}, not {key!r}")
    value = entry.get(key)
    if value is None:
        return None
    counted = entry.get(_COUNTED[key])
    if not isinstance(value, list) or (isinstance(counted, list) and len(value) != len(counted)):
        raise ValueError(f"{key} must be a list with one [start, end] per {_COUNTED[key]} entry")
    out: list[tuple[int, int]] = []
    for pair in value:
        if (
            not isinstance(pair, list | tuple)
            or len(pair) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in pair)
            or not 0 <= pair[0] <= pair[1]
        ):
            raise ValueError(f"{key} holds {pair!r}, not a [start, end] pair of offsets")
        out.append((pair[0], pair[1]))
    return out
