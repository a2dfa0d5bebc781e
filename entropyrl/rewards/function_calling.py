"""Strict binary function-calling reward (the "single criterion" reward of text EGPO).

A response earns 1.0 only if its format is exact and its calls equal the ground truth:

- format: ``<think>...</think>`` first (leading whitespace allowed), then either only tool-call
  blocks in Qwen's template form ``<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>``
  (the newlines are required: BFCL's Qwen decoder finds calls by them, so an inline block would
  score 1 here and 0 there) separated by whitespace, or, when the model makes no call, free text
  containing no tool-call tag. Every block holds one strict JSON object with exactly the keys
  ``name`` (non-empty str) and ``arguments`` (object), nested at most ``MAX_JSON_DEPTH`` deep; no
  comments, NaN, duplicated keys, unclosed or nested tags, text between or after the blocks.
  The end-of-turn markers a decoder keeps with special tokens are not content: the response may
  end in at most one ``<|im_end|>`` and then at most one ``<|endoftext|>`` (whitespace around
  them allowed); anything more (two ``<|im_end|>``) is a format error.
- correctness: the multiset of calls equals the ground truth, order-insensitive (parallel calls),
  names equal, arguments equal as JSON values: an integer answer needs a JSON integer (``5.0``
  for ``5`` scores 0, as BFCL's type check does), a float answer accepts an integer of the same
  value (``10`` for ``10.0``, as BFCL does), ``"1" != 1`` and ``True != 1``, strings exact. BFCL
  possible-answer ground truth lists acceptable values per parameter, ``""`` among them meaning
  the parameter may be omitted; an acceptable value that is a dict of lists, or a list of such
  dicts (BFCL's list-of-dict parameters), is itself a possible answer matched key by key and
  element by element. ``[]`` means no call is expected (irrelevance): then a correct response has
  no tool call.

Parsing is linear in the response length, and any input (degenerate rollouts included) yields a
score or a ToolCallFormatError, never a RecursionError.

This reward is stricter than BFCL's own checker (which lower-cases strings and drops spaces and
``,./-_*^`` before comparing, and accepts a missing reasoning block); ``bfcl_verdict`` gives the
BFCL verdict of a response with BFCL's own decoder and checker (optional ``bfcl`` extra).

Tokenizer assumption: verl decodes ``solution_str`` with special tokens skipped. In the Qwen2 /
Qwen2-VL tokenizers the project builds (special tokens at ids 151643..151656) ``<tool_call>`` and
``<think>`` are not special tokens but ordinary BPE text; in Qwen2.5 / Qwen3 they are added
tokens with ``special: false``. Either way they survive decoding. A tokenizer that marks them
special would strip them and every response would score 0: decode without skipping them there.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "MAX_JSON_DEPTH",
    "ToolCallFormatError",
    "bfcl_verdict",
    "compute_score",
    "normalize_ground_truth",
    "parse_tool_calls",
    "score_details",
    "values_equal",
]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
IM_END, END_OF_TEXT = "<|im_end|>", "<|endoftext|>"
_TAGS = (THINK_OPEN, THINK_CLOSE, CALL_OPEN, CALL_CLOSE)
# Qwen's template puts the JSON on its own line: "<tool_call>\n{...}\n</tool_call>".
_BLOCK_OPEN, _BLOCK_CLOSE = CALL_OPEN + "\n", "\n" + CALL_CLOSE
_WHITESPACE = re.compile(r"\s*")
# Real tool arguments nest a few levels; the bound keeps every recursive step (json, matching)
# far below Python's recursion limit whatever a rollout emits.
MAX_JSON_DEPTH = 32


class ToolCallFormatError(ValueError):
    """The response does not follow the reasoning + tool-call format; the message says where."""


# ---------------------------------------------------------------------------- parsing
def _strip_end_of_turn(text: str) -> str:
    """The text without its end-of-turn markers: ``[<|im_end|>] [<|endoftext|>]`` at the end.

    A decoder that keeps special tokens leaves Qwen's end of turn (``<|im_end|>``) and, for a
    base model or a padded batch, ``<|endoftext|>``; one of each at most is the end of a turn,
    more is generated content (and then a format error in the caller's checks).
    """
    body = text.rstrip()
    if body.endswith(END_OF_TEXT):
        body = body[: -len(END_OF_TEXT)].rstrip()
    if body.endswith(IM_END):
        body = body[: -len(IM_END)].rstrip()
    for token in (IM_END, END_OF_TEXT):
        found = body.find(token)
        if found >= 0:
            raise ToolCallFormatError(
                f"{token} at character {found}: only one end of turn may close the response"
            )
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


def _json_depth(value: Any) -> int:
    """Nesting depth of a decoded JSON value (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
    return deepest


def _strict_json(text: str, *, max_depth: int | None = None) -> Any:
    """json.loads without NaN/Infinity or duplicated keys (comments are already invalid JSON).

    Deep nesting is a ValueError, not a RecursionError: the C decoder recurses once per level.
    """
    try:
        value = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ValueError("JSON nested too deep to decode") from None
    if max_depth is not None and _json_depth(value) > max_depth:
        raise ValueError(f"JSON nested deeper than {max_depth} levels")
    return value


def _parse_call(body: str, index: int, offset: int) -> dict[str, Any]:
    where = f"tool call {index} (at character {offset})"
    try:
        value = _strict_json(body, max_depth=MAX_JSON_DEPTH)
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
    # Index arithmetic on `rest` only (no slicing of the remainder): linear in the length.
    cursor = _WHITESPACE.match(rest).end()
    while cursor < len(rest):
        where = position + cursor
        if not rest.startswith(CALL_OPEN, cursor):
            snippet = rest[cursor : cursor + 30]
            raise ToolCallFormatError(
                f"unexpected text {snippet!r} at character {where}: only "
                f"{CALL_OPEN}...{CALL_CLOSE} blocks may follow the reasoning block"
            )
        if not rest.startswith(_BLOCK_OPEN, cursor):
            raise ToolCallFormatError(
                f"{CALL_OPEN} at character {where} must be followed by a newline "
                f"(Qwen's template: {CALL_OPEN}\\n{{...}}\\n{CALL_CLOSE})"
            )
        start = cursor + len(_BLOCK_OPEN)
        close = rest.find(CALL_CLOSE, start)
        if close < 0:
            raise ToolCallFormatError(f"unclosed {CALL_OPEN} at character {where}")
        if rest.find(CALL_OPEN, start, close) >= 0:
            raise ToolCallFormatError(
                f"{CALL_OPEN} at character {where} is not closed before the next one"
            )
        if close - 1 < start or rest[close - 1] != "\n":
            raise ToolCallFormatError(
                f"{CALL_CLOSE} at character {position + close} must follow a newline "
                f"(Qwen's template: {CALL_OPEN}\\n{{...}}\\n{CALL_CLOSE})"
            )
        calls.append(_parse_call(rest[start : close - 1], len(calls), where))
        cursor = _WHITESPACE.match(rest, close + len(CALL_CLOSE)).end()
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
def values_equal(value: Any, expected: Any) -> bool:
    """JSON value equality of a response's ``value`` with the ``expected`` one.

    Numbers compare by value, but an integer answer needs an integer (``5.0`` is not ``5``: BFCL
    rejects a float for an integer parameter) while a float answer accepts an integer
    (``10`` for ``10.0``, as BFCL converts int to float); no str/number or bool/number mixing.
    """
    if isinstance(value, bool) or isinstance(expected, bool):
        return isinstance(value, bool) and isinstance(expected, bool) and value == expected
    if isinstance(value, (int, float)) and isinstance(expected, (int, float)):
        if isinstance(expected, int) and not isinstance(value, int):
            return False
        return not (isinstance(value, float) and math.isnan(value)) and value == expected
    if isinstance(value, str) or isinstance(expected, str):
        return isinstance(value, str) and isinstance(expected, str) and value == expected
    if value is None or expected is None:
        return value is None and expected is None
    if isinstance(value, Mapping) and isinstance(expected, Mapping):
        return value.keys() == expected.keys() and all(
            values_equal(value[k], expected[k]) for k in value
        )
    if isinstance(value, (list, tuple)) and isinstance(expected, (list, tuple)):
        return len(value) == len(expected) and all(
            values_equal(x, y) for x, y in zip(value, expected)
        )
    return False


def _is_pattern(option: Any) -> bool:
    """A BFCL possible answer for a dict value: ``{key: [acceptable values...]}``."""
    return isinstance(option, Mapping) and all(isinstance(v, list) for v in option.values())


def _element_matches(value: Any, option: Any) -> bool:
    """``value`` equals ``option``, or ``option`` is a dict pattern that ``value`` satisfies."""
    if values_equal(value, option):
        return True
    return _is_pattern(option) and isinstance(value, Mapping) and _params_match(value, option)


def _acceptable(value: Any, options: list[Any]) -> bool:
    """BFCL: ``value`` matches one option; a dict of lists is itself a possible answer, and so is
    a list of them (a list-of-dict parameter, ``[[{"field": ["age"]}, ...]]``), element by element.
    """
    for option in options:
        if _element_matches(value, option):
            return True
        if (
            isinstance(option, list)
            and isinstance(value, list)
            and len(value) == len(option)
            and any(_is_pattern(item) for item in option)
            and all(_element_matches(v, o) for v, o in zip(value, option))
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


# ---------------------------------------------------------------------------- BFCL's own verdict
# BFCL's runner passes the registry name with "/" escaped; every Qwen FC entry of its model
# table decodes with QwenFCHandler and keeps dotted function names (underscore_to_dot False).
BFCL_QWEN_FC_MODEL = "Qwen/Qwen3-8B-FC"
BFCL_INSTALL_HINT = (
    "bfcl_verdict needs the bfcl-eval package: pip install 'entropyrl[bfcl]' && "
    "pip install --no-deps bfcl-eval==2026.3.23 (its full dependency tree pins numpy 1.26 and "
    "pulls sentence-transformers; the extra holds only what its checker and Qwen decoder import)"
)
_BFCL_UNSUPPORTED = ("multi_turn", "memory", "web_search", "format_sensitivity", "exec", "rest")


@functools.cache
def _bfcl() -> dict[str, Any]:
    """BFCL's Qwen function-calling handler, checker and helpers (imported once, lazily)."""
    try:
        from bfcl_eval.constants.enums import Language, ReturnFormat
        from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
        from bfcl_eval.model_handler.local_inference.qwen_fc import QwenFCHandler
        from bfcl_eval.utils import (
            is_empty_output,
            is_function_calling_format_output,
            is_java,
            is_js,
            is_relevance_or_irrelevance,
        )
    except ImportError as error:
        raise ImportError(f"{BFCL_INSTALL_HINT} ({error})") from error
    handler = QwenFCHandler(
        model_name=BFCL_QWEN_FC_MODEL.removesuffix("-FC"),
        temperature=0.0,
        registry_name=BFCL_QWEN_FC_MODEL,
        is_fc_model=True,
    )
    return {
        "handler": handler,
        "ast_checker": ast_checker,
        "Language": Language,
        "ReturnFormat": ReturnFormat,
        "is_empty_output": is_empty_output,
        "is_format_output": is_function_calling_format_output,
        "is_java": is_java,
        "is_js": is_js,
        "is_relevance": is_relevance_or_irrelevance,
    }


def _bfcl_stored_result(bfcl: dict[str, Any], solution_str: str) -> str:
    """What BFCL stores as the model result of a raw Qwen generation (reasoning removed)."""
    from types import SimpleNamespace

    response = SimpleNamespace(
        choices=[SimpleNamespace(text=solution_str)],
        usage=SimpleNamespace(prompt_tokens=0, completion_tokens=0),
    )
    return bfcl["handler"]._parse_query_response_prompting(response)["model_responses"]


def bfcl_verdict(
    solution_str: str,
    entry: Mapping[str, Any],
    possible_answer: Sequence[Any] | None,
    category: str,
) -> bool:
    """BFCL's verdict on a raw generation, as BFCL scores a Qwen function-calling model.

    The generation goes through BFCL's ``QwenFCHandler`` (reasoning split off at ``</think>``,
    ``<tool_call>\\n...\\n</tool_call>`` blocks decoded) and then through the per-entry logic of
    BFCL's ``eval_runner``: ``ast_checker`` for the AST categories (simple_python/java/javascript,
    multiple, parallel, parallel_multiple and their live variants), "any call"/"no call" for
    relevance/irrelevance. ``entry`` is the BFCL test entry (its ``function`` list in BFCL's own
    schema), ``possible_answer`` its ``ground_truth`` list (None for (ir)relevance), ``category``
    the BFCL category name (``simple_python``, ``live_multiple``, ...). Needs the ``bfcl`` extra.
    """
    if not isinstance(solution_str, str):
        raise TypeError(f"solution_str must be a str, got {type(solution_str).__name__}")
    if not isinstance(category, str) or not category:
        raise ValueError("category must be a BFCL category name such as 'simple_python'")
    if any(part in category for part in _BFCL_UNSUPPORTED):
        raise ValueError(f"category {category!r}: only single-turn AST and relevance categories")
    bfcl = _bfcl()
    result = _bfcl_stored_result(bfcl, solution_str)
    formats = bfcl["ReturnFormat"]
    if bfcl["is_relevance"](category):
        try:
            decoded = bfcl["handler"].decode_ast(result, formats.PYTHON, False)
            made_call = not bfcl["is_empty_output"](decoded)
        except Exception:  # BFCL: a decoder failure means no function call
            made_call = False
        return made_call if "irrelevance" not in category else not made_call
    functions = entry.get("function") if isinstance(entry, Mapping) else None
    if not isinstance(functions, list) or not functions:
        raise ValueError("entry must be a BFCL test entry with a non-empty 'function' list")
    if not isinstance(possible_answer, Sequence) or isinstance(possible_answer, str):
        raise ValueError("possible_answer must be the entry's BFCL ground_truth list")
    languages = bfcl["Language"]
    if bfcl["is_java"](category):
        language, return_format = languages.JAVA, formats.JAVA
    elif bfcl["is_js"](category):
        language, return_format = languages.JAVASCRIPT, formats.JAVASCRIPT
    else:
        language, return_format = languages.PYTHON, formats.PYTHON
    try:
        decoded = bfcl["handler"].decode_ast(result, return_format, False)
    except Exception:  # BFCL: "Invalid syntax. Failed to decode AST."
        return False
    if not bfcl["is_format_output"](decoded):
        return False
    try:
        checked = bfcl["ast_checker"](
            functions,
            decoded,
            list(possible_answer),
            language,
            category,
            BFCL_QWEN_FC_MODEL.replace("/", "_"),
        )
    except Exception:  # BFCL's runner would stop here: it has no verdict, so no credit
        return False
    return bool(checked["valid"])
