"""Strict binary function-calling reward (the "single criterion" reward of text EGPO).

A response earns 1.0 only if its format is exact and its calls equal the ground truth:

- format: ``<think>...</think>`` first (leading whitespace allowed), then either only
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks separated by whitespace, or,
  when the model makes no call, free text containing no tool-call tag. Every block holds one
  strict JSON object with exactly the keys ``name`` (non-empty str) and ``arguments`` (object);
  no comments, NaN, duplicated keys, unclosed or nested tags, text between or after the blocks.
  A final ``<|im_end|>`` / ``<|endoftext|>`` is tolerated (end-of-turn, not content).
- correctness: the multiset of calls equals the ground truth, order-insensitive (parallel calls),
  names equal, arguments equal as JSON values: ``1 == 1.0`` but ``"1" != 1`` and ``True != 1``,
  strings exact. BFCL possible-answer ground truth lists acceptable values per parameter, ``""``
  among them meaning the parameter may be omitted. ``[]`` means no call is expected
  (irrelevance): then a correct response has no tool call.

Tokenizer assumption: verl decodes ``solution_str`` with special tokens skipped. In the Qwen2 /
Qwen2-VL tokenizers the project builds (special tokens at ids 151643..151656) ``<tool_call>`` and
``<think>`` are not special tokens but ordinary BPE text; in Qwen2.5 / Qwen3 they are added
tokens with ``special: false``. Either way they survive decoding. A tokenizer that marks them
special would strip them and every response would score 0: decode without skipping them there.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "ToolCallFormatError",
    "compute_score",
    "normalize_ground_truth",
    "parse_tool_calls",
    "score_details",
    "values_equal",
]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_END_OF_TURN = ("<|im_end|>", "<|endoftext|>")
_TAGS = (THINK_OPEN, THINK_CLOSE, CALL_OPEN, CALL_CLOSE)


class ToolCallFormatError(ValueError):
    """The response does not follow the reasoning + tool-call format; the message says where."""


# ---------------------------------------------------------------------------- parsing
def _strip_end_of_turn(text: str) -> str:
    """The text without trailing end-of-turn markers (when decoded with special tokens)."""
    body = text.rstrip()
    while body.endswith(_END_OF_TURN):
        for token in _END_OF_TURN:
            if body.endswith(token):
                body = body[: -len(token)].rstrip()
    return body


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicated key {key!r}")
        out[key] = value
    return out


def _strict_json(text: str) -> Any:
    """json.loads without NaN/Infinity or duplicated keys (comments are already invalid JSON)."""
    return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)


def _parse_call(body: str, index: int, offset: int) -> dict[str, Any]:
    where = f"tool call {index} (at character {offset})"
    try:
        value = _strict_json(body)
    except ValueError as error:  # JSONDecodeError is a ValueError
        raise ToolCallFormatError(f"{where}: invalid JSON: {error}") from None
    if not isinstance(value, dict):
        raise ToolCallFormatError(f"{where}: expected a JSON object, got {type(value).__name__}")
    if set(value) != {"name", "arguments"}:
        raise ToolCallFormatError(
            f"{where}: keys must be exactly 'name' and 'arguments', got {sorted(value)}"
        )
    name, arguments = value["name"], value["arguments"]
    if not isinstance(name, str) or not name:
        raise ToolCallFormatError(f"{where}: 'name' must be a non-empty string")
    if not isinstance(arguments, dict):
        raise ToolCallFormatError(
            f"{where}: 'arguments' must be a JSON object, got {type(arguments).__name__}"
        )
    return {"name": name, "arguments": arguments}


def parse_tool_calls(text: str, *, require_think: bool = True) -> list[dict[str, Any]]:
    """The ``[{"name", "arguments"}]`` calls of a response (``[]`` when it makes none).

    Raises ToolCallFormatError with the reason and position when the format is broken (see the
    module docstring). ``require_think=False`` makes the leading reasoning block optional.
    """
    if not isinstance(text, str):
        raise ToolCallFormatError(f"response must be a str, got {type(text).__name__}")
    body = _strip_end_of_turn(text)
    position = len(body) - len(body.lstrip())
    if body.startswith(THINK_OPEN, position):
        close = body.find(THINK_CLOSE, position)
        if close < 0:
            raise ToolCallFormatError(f"unclosed {THINK_OPEN} at character {position}")
        reasoning = body[position + len(THINK_OPEN) : close]
        if not reasoning.strip():
            raise ToolCallFormatError(f"empty reasoning block at character {position}")
        for tag in _TAGS:
            if tag in reasoning:
                raise ToolCallFormatError(f"{tag} inside the reasoning block")
        position = close + len(THINK_CLOSE)
    elif require_think:
        raise ToolCallFormatError(
            f"the response must start with a {THINK_OPEN}...{THINK_CLOSE} block"
        )
    rest = body[position:]
    for tag in (THINK_OPEN, THINK_CLOSE):
        found = rest.find(tag)
        if found >= 0:
            raise ToolCallFormatError(f"unexpected {tag} at character {position + found}")
    if CALL_OPEN not in rest and CALL_CLOSE not in rest:
        return []  # a plain answer: no call made
    calls = []
    cursor = 0
    while True:
        stripped = len(rest) - len(rest[cursor:].lstrip())
        cursor = stripped
        if cursor == len(rest):
            break
        if not rest.startswith(CALL_OPEN, cursor):
            snippet = rest[cursor : cursor + 30]
            raise ToolCallFormatError(
                f"unexpected text {snippet!r} at character {position + cursor}: only "
                f"{CALL_OPEN}...{CALL_CLOSE} blocks may follow the reasoning block"
            )
        start = cursor + len(CALL_OPEN)
        close = rest.find(CALL_CLOSE, start)
        if close < 0:
            raise ToolCallFormatError(f"unclosed {CALL_OPEN} at character {position + cursor}")
        inner = rest[start:close]
        if CALL_OPEN in inner:
            raise ToolCallFormatError(
                f"{CALL_OPEN} at character {position + cursor} is not closed before the next one"
            )
        calls.append(_parse_call(inner, len(calls), position + cursor))
        cursor = close + len(CALL_CLOSE)
    return calls


# ---------------------------------------------------------------------------- ground truth
def _exact_spec(name: str, arguments: Any, index: int) -> tuple[str, str, Any]:
    if isinstance(arguments, str):
        try:
            arguments = _strict_json(arguments)
        except ValueError as error:
            raise ValueError(f"ground_truth[{index}].arguments: invalid JSON ({error})") from None
    if not isinstance(name, str) or not name:
        raise ValueError(f"ground_truth[{index}].name must be a non-empty string")
    if not isinstance(arguments, dict):
        raise ValueError(f"ground_truth[{index}].arguments must be an object")
    return ("exact", name, arguments)


def normalize_ground_truth(ground_truth: Any) -> list[tuple[str, str, Any]]:
    """``[(kind, name, arguments_or_possible_answers)]`` with kind ``"exact"`` or ``"bfcl"``.

    Accepts a JSON string or a list of ``{"name", "arguments"}`` (arguments may be a JSON string)
    or of BFCL possible answers ``{"func": {"param": [acceptable values...]}}``.
    """
    if isinstance(ground_truth, (str, bytes)):
        try:
            ground_truth = _strict_json(ground_truth)
        except ValueError as error:
            raise ValueError(f"ground_truth: invalid JSON ({error})") from None
    if hasattr(ground_truth, "tolist"):  # a numpy array, as parquet list columns arrive
        ground_truth = ground_truth.tolist()
    if isinstance(ground_truth, Mapping):
        ground_truth = [ground_truth]
    if not isinstance(ground_truth, Sequence) or isinstance(ground_truth, str):
        raise ValueError(f"ground_truth must be a list of calls, got {type(ground_truth).__name__}")
    specs = []
    for index, entry in enumerate(ground_truth):
        if not isinstance(entry, Mapping):
            raise ValueError(f"ground_truth[{index}] must be an object")
        if set(entry) == {"name", "arguments"}:
            specs.append(_exact_spec(entry["name"], entry["arguments"], index))
        elif len(entry) == 1:
            ((name, params),) = entry.items()
            if not isinstance(params, Mapping) or not all(
                isinstance(values, list) for values in params.values()
            ):
                raise ValueError(
                    f"ground_truth[{index}]: BFCL form needs {{name: {{param: [values...]}}}}"
                )
            specs.append(("bfcl", str(name), dict(params)))
        else:
            raise ValueError(
                f"ground_truth[{index}] must be {{'name', 'arguments'}} or a BFCL possible answer,"
                f" got keys {sorted(entry)}"
            )
    return specs


# ---------------------------------------------------------------------------- matching
def values_equal(a: Any, b: Any) -> bool:
    """JSON value equality: numbers by value (1 == 1.0), no str/number or bool/number mixing."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return not (isinstance(a, float) and math.isnan(a)) and a == b
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(values_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(values_equal(x, y) for x, y in zip(a, b))
    return False


def _acceptable(value: Any, options: list[Any]) -> bool:
    """BFCL: value equals one option; a dict option of lists is itself a possible answer."""
    for option in options:
        if values_equal(value, option):
            return True
        if (
            isinstance(option, Mapping)
            and isinstance(value, Mapping)
            and all(isinstance(v, list) for v in option.values())
            and _params_match(value, option)
        ):
            return True
    return False


def _params_match(arguments: Mapping[str, Any], possible: Mapping[str, list[Any]]) -> bool:
    if any(key not in possible for key in arguments):
        return False  # a parameter the ground truth does not know
    for key, options in possible.items():
        if key in arguments:
            if not _acceptable(arguments[key], options):
                return False
        elif "" not in options:
            return False  # required parameter omitted
    return True


def _call_matches(call: Mapping[str, Any], spec: tuple[str, str, Any]) -> bool:
    kind, name, expected = spec
    if call["name"] != name:
        return False
    if kind == "exact":
        return values_equal(call["arguments"], expected)
    return _params_match(call["arguments"], expected)


def _perfect_matching(calls: list[dict[str, Any]], specs: list[tuple[str, str, Any]]) -> int:
    """Size of a maximum matching call <-> spec (Kuhn's algorithm; lists are a few items)."""
    edges = [[j for j, spec in enumerate(specs) if _call_matches(call, spec)] for call in calls]
    owner = [-1] * len(specs)

    def augment(i: int, seen: list[bool]) -> bool:
        for j in edges[i]:
            if not seen[j]:
                seen[j] = True
                if owner[j] < 0 or augment(owner[j], seen):
                    owner[j] = i
                    return True
        return False

    return sum(augment(i, [False] * len(specs)) for i in range(len(calls)))


# ---------------------------------------------------------------------------- reward
def score_details(solution_str: str, ground_truth: Any) -> dict[str, Any]:
    """``{"score", "format_ok", "reason", "num_calls"}`` for debugging and metrics.

    Raises ValueError only for a malformed ground truth (a data error, not the model's).
    """
    specs = normalize_ground_truth(ground_truth)
    try:
        calls = parse_tool_calls(solution_str)
    except ToolCallFormatError as error:
        return {"score": 0.0, "format_ok": False, "reason": f"format: {error}", "num_calls": 0}
    details = {"score": 0.0, "format_ok": True, "num_calls": len(calls)}
    if len(calls) != len(specs):
        reason = f"expected {len(specs)} call(s), got {len(calls)}"
    elif _perfect_matching(calls, specs) != len(specs):
        names = sorted(call["name"] for call in calls)
        reason = f"calls {names} do not match the ground truth"
    else:
        details["score"] = 1.0
        reason = "ok"
    details["reason"] = reason
    return details


def compute_score(
    solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None
) -> float:
    """1.0 when the response's format is exact and its calls equal the ground truth, else 0.0."""
    del extra_info  # accepted for verl's reward signature; the score needs nothing from it
    return float(score_details(solution_str, ground_truth)["score"])
