"""The request contract of the CHAIR service, in one place for both sides.

A scoring request holds captions as `{"image_id": int | str, "caption": str}` objects. The
service (`chair_server.app`, `chair_server.scorer`) refuses a malformed one with a 400 naming
the field; the training-side client (`entropyrl.rewards.chair_client`) checks the same rules
before sending, with the same words, so a caption it sends is one the service accepts. No
torch, no Flask: both sides import this.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FIELDS",
    "ItemProblem",
    "RequestError",
    "TooManyCaptions",
    "check_items",
    "image_id",
    "item_problem",
]

FIELDS = ("image_id", "caption")


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
