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
  for ``5`` scores 0, as BFCL's type check does), a float argument accepts an integer of the same
  value (``10`` for ``10.0``) only at the top level of the arguments, where BFCL converts it,
  while inside lists and dicts every number has the answer's type (``[12, 15]`` for
  ``[12.0, 15.0]`` scores 0: BFCL type-checks list items against the schema's item type);
  ``"1" != 1`` and ``True != 1``, strings exact. BFCL possible-answer ground truth lists
  acceptable values per parameter, ``""`` among them meaning the parameter may be omitted; an
  acceptable value that is a dict of lists is a pattern for a dict argument (each key's value
  one of the listed ones, literally), a list of such dicts a pattern for a list of dicts, matched
  element by element, as BFCL's checker reads them. ``[]`` means no call is expected
  (irrelevance): then a correct response has no tool call.
- the tool schema, when the row carries it (``extra_info["tools"]``, as ``entropyrl prepare fc``
  writes it): with a BFCL answer, a parameter the schema lists under ``required`` must be given
  even where the answer marks it optional, a parameter the schema lacks is wrong, and each
  argument goes through BFCL's Python type check (declared type, array items one level deep,
  int for float only for a float parameter) before its value is compared exactly; with an exact
  answer, the int-for-float allowance holds only where the schema declares no other type.
  Without a schema the ground truth alone decides.

Parsing is linear in the response length, and any input (degenerate rollouts included) yields a
score or a ToolCallFormatError, never a RecursionError.

This reward is never looser than BFCL's own checker on BFCL's Python categories, and stricter
(BFCL lower-cases strings and drops spaces and ``,./-_*^`` before comparing, compares values
inside dicts with Python's ``==``, and accepts a missing reasoning block); ``bfcl_verdict`` gives
the BFCL verdict of a response with BFCL's own decoder and checker (optional ``bfcl`` extra), and
``benchmarks/bfcl_agreement.py`` counts where the two differ.

``FunctionCallingScorer`` is the reward as a `Scorer` (``entropyrl.rewards.scorer``), which verl's
``entropyrl.verl.rewards.function_calling_score`` and the local runner call; ``score_details``
(score, format, reason, calls) is it on one response. ``compute_score`` (the score alone) is
deprecated: verl's entry point is ``function_calling_score``, a script's call the scorer.

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
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from entropyrl.rewards.scorer import ResponseScorer, Score, score_one

__all__ = [
    "DETAIL_KEYS",
    "MAX_JSON_DEPTH",
    "FunctionCallingScorer",
    "FunctionSchema",
    "ParameterSchema",
    "ToolCallFormatError",
    "bfcl_checker",
    "bfcl_verdict",
    "compute_score",
    "function_schema",
    "normalize_ground_truth",
    "parse_tool_calls",
    "score_details",
    "tool_schemas",
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


# ---------------------------------------------------------------------------- tool schemas
# Parameter types as BFCL's checker reads them for Python (its PYTHON_TYPE_MAPPING in
# bfcl_eval/eval_checker/ast_eval/ast_checker.py), plus the JSON Schema names the converter writes
# for BFCL's ("number" for float, "object" for dict) and the short names xLAM uses.
_DECLARED_TYPES: dict[str, type] = {
    "string": str,
    "str": str,
    "any": str,
    "integer": int,
    "int": int,
    "float": float,
    "number": float,
    "double": float,
    "boolean": bool,
    "bool": bool,
    "array": list,
    "list": list,
    "tuple": list,
    "dict": dict,
    "object": dict,
}


@dataclass(frozen=True)
class ParameterSchema:
    """What a tool schema declares for one parameter, in the Python types BFCL checks.

    ``kind`` is None when the schema gives no type the reward knows; ``item_kind`` is the type of
    an array's items, which BFCL's checker checks one level deep.
    """

    kind: type | None = None
    item_kind: type | None = None


@dataclass(frozen=True)
class FunctionSchema:
    """A function's parameters (None: the schema does not list them) and its required ones."""

    parameters: Mapping[str, ParameterSchema] | None
    required: frozenset[str]


def _declared_type(spec: Any) -> type | None:
    """The Python type of a schema type name: ``"float"``, ``"number"``, xLAM's ``"int, optional"``."""
    name = spec.get("type") if isinstance(spec, Mapping) else None
    if not isinstance(name, str):
        return None
    return _DECLARED_TYPES.get(name.split(",")[0].strip().lower())


def _parameter_schema(spec: Any) -> ParameterSchema:
    kind = _declared_type(spec)
    item_kind = _declared_type(spec.get("items")) if kind is list else None
    return ParameterSchema(kind, item_kind)


def _plain(value: Any) -> Any:
    """Lists and dicts of a parquet round trip as plain Python: numpy arrays become lists, and
    None-valued keys (pyarrow gives every struct all the keys any row has) are dropped."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def function_schema(definition: Mapping[str, Any]) -> FunctionSchema:
    """The parameters a function definition declares, and which of them it requires.

    JSON Schema keeps them under ``parameters.properties``; xLAM writes a flat ``{param: {type,
    ...}}`` map (a parameter may itself be called "type"); a JSON Schema without properties
    declares nothing (``parameters`` None: no check against it).
    """
    parameters = _plain(definition.get("parameters"))
    if not isinstance(parameters, Mapping):
        return FunctionSchema(None, frozenset())
    properties = parameters.get("properties")
    required = parameters.get("required") or ()
    if isinstance(required, str) or not isinstance(required, Sequence):
        required = ()
    if isinstance(properties, Mapping):
        declared = {name: _parameter_schema(spec) for name, spec in properties.items()}
    elif not isinstance(parameters.get("type"), str) and all(
        isinstance(spec, Mapping) for spec in parameters.values()
    ):
        declared = {name: _parameter_schema(spec) for name, spec in parameters.items()}  # xLAM
    else:
        declared = None
    return FunctionSchema(
        None if declared is None else MappingProxyType(declared),
        frozenset(r for r in required if isinstance(r, str)),
    )


@functools.lru_cache(maxsize=256)
def _schemas_from_json(text: str) -> Mapping[str, FunctionSchema]:
    try:
        tools = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise ValueError(f"extra_info['tools']: invalid JSON ({error})") from None
    return _schemas_from_list(tools)


def _schemas_from_list(tools: Any) -> Mapping[str, FunctionSchema]:
    tools = _plain(tools)
    if isinstance(tools, Mapping):
        tools = [tools]
    if not isinstance(tools, list):
        raise ValueError(
            f"extra_info['tools'] must be a list of function definitions, got {type(tools).__name__}"
        )
    schemas = {}
    for index, tool in enumerate(tools):
        if isinstance(tool, Mapping) and tool.get("type") == "function" and "function" in tool:
            tool = tool["function"]  # OpenAI's {"type": "function", "function": {...}} wrapper
        if not isinstance(tool, Mapping) or not isinstance(tool.get("name"), str):
            raise ValueError(f"extra_info['tools'][{index}]: a function definition needs a name")
        schemas[tool["name"]] = function_schema(tool)
    return MappingProxyType(schemas)


def tool_schemas(tools: Any) -> Mapping[str, FunctionSchema]:
    """Function name -> declared parameters and ``required``, from a row's ``extra_info["tools"]``.

    Accepts the JSON string the converter writes or the parsed list (also as pandas reads a parquet
    struct: numpy arrays, None for keys a row lacks), of definitions ``{"name", "parameters":
    {"properties", "required"}}`` or OpenAI ``{"type": "function", "function": {...}}`` tools.
    None (no tools) gives no schemas; anything else malformed is a ValueError.
    """
    if tools is None:
        return {}
    if isinstance(tools, bytes):
        tools = tools.decode("utf-8")
    if isinstance(tools, str):
        return _schemas_from_json(tools)
    return _schemas_from_list(tools)


def _schemas_of(extra_info: Any) -> Mapping[str, FunctionSchema]:
    if hasattr(extra_info, "tolist") and not isinstance(extra_info, Mapping):
        extra_info = extra_info.tolist()
    if not isinstance(extra_info, Mapping):
        return {}
    return tool_schemas(extra_info.get("tools"))


# ---------------------------------------------------------------------------- matching
def values_equal(value: Any, expected: Any, *, int_for_float: bool = True) -> bool:
    """JSON value equality of a response's ``value`` with the ``expected`` one.

    An integer answer needs an integer (``5.0`` is not ``5``: BFCL rejects a float for an integer
    parameter); no str/number or bool/number mixing (BFCL: bool is not int). A float answer
    accepts an integer of the same value only for ``value`` itself and ``int_for_float``: BFCL
    converts int to float for a Python function's float argument, but type-checks the items of a
    list against the schema's item type, so inside lists and dicts every number has the answer's
    type (``[12, 15]`` is not ``[12.0, 15.0]``).
    """
    if isinstance(value, bool) or isinstance(expected, bool):
        return isinstance(value, bool) and isinstance(expected, bool) and value == expected
    if isinstance(value, (int, float)) and isinstance(expected, (int, float)):
        if isinstance(value, float) and not isinstance(expected, float):
            return False
        if isinstance(value, int) and isinstance(expected, float) and not int_for_float:
            return False
        return not (isinstance(value, float) and math.isnan(value)) and value == expected
    if isinstance(value, str) or isinstance(expected, str):
        return isinstance(value, str) and isinstance(expected, str) and value == expected
    if value is None or expected is None:
        return value is None and expected is None
    if isinstance(value, Mapping) and isinstance(expected, Mapping):
        return value.keys() == expected.keys() and all(
            values_equal(value[k], expected[k], int_for_float=False) for k in value
        )
    if isinstance(value, (list, tuple)) and isinstance(expected, (list, tuple)):
        return len(value) == len(expected) and all(
            values_equal(x, y, int_for_float=False) for x, y in zip(value, expected)
        )
    return False


def _is_pattern(option: Any) -> bool:
    """A BFCL possible answer for a dict value: ``{key: [acceptable values...]}``."""
    return isinstance(option, Mapping) and all(isinstance(v, list) for v in option.values())


def _is_pattern_list(option: Any) -> bool:
    """A BFCL possible answer for a list of dicts: ``[{key: [values]}, ...]``, element by element."""
    return isinstance(option, list) and bool(option) and all(_is_pattern(o) for o in option)


def _pattern_matches(value: Any, pattern: Any) -> bool:
    """BFCL's dict check: every key known to the pattern, its value one of the listed ones
    (literally: a value inside the dict is never itself a pattern), keys not given omittable."""
    if not isinstance(value, Mapping) or not _is_pattern(pattern):
        return False
    if any(key not in pattern for key in value):
        return False
    return all(
        any(values_equal(value[key], o, int_for_float=False) for o in options)
        if key in value
        else "" in options
        for key, options in pattern.items()
    )


def _patterns_match(value: Any, option: Any) -> bool:
    """BFCL's list-of-dict check: as many dicts as the option lists, each matching its pattern."""
    return (
        isinstance(value, list)
        and isinstance(option, list)
        and len(value) == len(option)
        and all(_pattern_matches(v, o) for v, o in zip(value, option))
    )


def _acceptable(value: Any, options: list[Any]) -> bool:
    """``value`` matches one of BFCL's acceptable values, read by their shape (no schema): a dict
    of lists is a pattern for a dict value, a list of them a pattern for a list of dicts (as
    BFCL's checker reads them for dict and list-of-dict parameters), anything else a literal."""
    for option in options:
        if _is_pattern(option):
            if _pattern_matches(value, option):
                return True
        elif _is_pattern_list(option):
            if _patterns_match(value, option):
                return True
        elif values_equal(value, option):
            return True
    return False


def _answer_type(options: Sequence[Any]) -> type | None:
    """BFCL's type of a list of acceptable values: that of the first one that is not ``""``."""
    return next((type(option) for option in options if option != ""), None)


def _item_type_ok(item: Any, option: Any, item_kind: type) -> bool:
    # BFCL's nested type_checker: the item has the schema's item type, or the type of the
    # option's first element (BFCL's "variable" case); never int for float.
    return type(item) is item_kind or type(item) is _answer_type(option)


def _declared_accepts(value: Any, options: list[Any], declared: ParameterSchema) -> bool:
    """BFCL's ``simple_function_checker`` for one Python argument, with exact values.

    The type check is BFCL's (``type_checker``): an int for a float parameter counts as a float
    (the only number conversion, at the top level), then the value must have the declared type
    (and an array's items the item type, one level deep, against at least one acceptable list)
    or the type of the first acceptable value (BFCL's "variable"). The value check is BFCL's
    dispatch by declared type (dict: pattern, list of dicts: patterns, otherwise a listed value)
    with the reward's exact equality instead of BFCL's normalised strings and Python ``==``.
    """
    kind = declared.kind
    written = value  # compared as written: an integer answer (BFCL has some) needs an integer
    if kind is float and type(value) is int:
        value = float(value)
    answer_type = _answer_type(options)
    if type(value) is kind:
        variable = answer_type is not None and answer_type is not kind
        if declared.item_kind is not None and not any(
            type(option) is not list
            or all(_item_type_ok(item, option, declared.item_kind) for item in value)
            for option in options
        ):
            return False
    elif answer_type is not None and type(value) is answer_type:
        variable = True
    else:
        return False
    if not variable and kind is dict:
        return any(_pattern_matches(value, option) for option in options)
    if not variable and kind is list and declared.item_kind is dict:
        return any(_patterns_match(value, option) for option in options)
    # BFCL: the (converted) value is among the options; the reward: also exactly as written.
    return any(values_equal(written, option) and value == option for option in options)


def _params_match(
    arguments: Mapping[str, Any],
    possible: Mapping[str, list[Any]],
    schema: FunctionSchema | None = None,
) -> bool:
    """A call's arguments against a BFCL possible answer, under the function's schema if known."""
    declared = schema.parameters if schema is not None else None
    if any(key not in possible for key in arguments):
        return False  # a parameter the ground truth does not know
    if declared is not None and any(key not in declared for key in arguments):
        return False  # BFCL: a parameter the schema does not define
    if schema is not None and any(key not in arguments for key in schema.required):
        return False  # BFCL: a required parameter omitted, whatever the ground truth allows
    for key, options in possible.items():
        if key not in arguments:
            if "" not in options:
                return False  # a parameter the ground truth does not let be omitted
            continue
        parameter = declared.get(key) if declared is not None else None
        if parameter is not None and parameter.kind is not None:
            if not _declared_accepts(arguments[key], options, parameter):
                return False
        elif not _acceptable(arguments[key], options):
            return False
    return True


def _exact_match(
    arguments: Mapping[str, Any], expected: Mapping[str, Any], schema: FunctionSchema | None
) -> bool:
    """Exact arguments; an int for a float argument only where the schema does not declare
    another type (BFCL converts int to float for float parameters only)."""
    if arguments.keys() != expected.keys():
        return False
    declared = schema.parameters if schema is not None else None
    for key, value in arguments.items():
        parameter = declared.get(key) if declared is not None else None
        int_for_float = parameter is None or parameter.kind in (None, float)
        if not values_equal(value, expected[key], int_for_float=int_for_float):
            return False
    return True


def _call_matches(
    call: Mapping[str, Any],
    spec: tuple[str, str, Any],
    schemas: Mapping[str, FunctionSchema] | None = None,
) -> bool:
    kind, name, expected = spec
    if call["name"] != name:
        return False
    schema = schemas.get(name) if schemas else None
    if kind == "exact":
        return _exact_match(call["arguments"], expected, schema)
    return _params_match(call["arguments"], expected, schema)


def _perfect_matching(
    calls: list[dict[str, Any]],
    specs: list[tuple[str, str, Any]],
    schemas: Mapping[str, FunctionSchema] | None = None,
) -> int:
    """Size of a maximum matching call <-> spec (Kuhn's algorithm; lists are a few items)."""
    edges = [
        [j for j, spec in enumerate(specs) if _call_matches(call, spec, schemas)] for call in calls
    ]
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
DETAIL_KEYS = ("score", "format_ok", "reason", "num_calls")


class FunctionCallingScorer(ResponseScorer):
    """The strict binary reward as a `Scorer` (see the module docstring for the rules).

    Each `Score` is 1.0 or 0.0 with the reason (``"ok"``, ``"format: ..."``, ...) and the details
    ``format_ok`` (bool) and ``num_calls`` (calls parsed; 0 on a format error). A row's
    ``extra_info["tools"]`` (optional) are the functions' schemas: with them a BFCL answer is
    checked as BFCL's checker does (required parameters, declared types). Raises ValueError only
    for a malformed ground truth or tools (a data error, not the model's).
    """

    def score_response(
        self, solution: str, ground_truth: Any, extra_info: Mapping[str, Any] | None
    ) -> Score:
        specs = normalize_ground_truth(ground_truth)
        schemas = _schemas_of(extra_info)
        try:
            calls = parse_tool_calls(solution)
        except ToolCallFormatError as error:
            return Score(0.0, f"format: {error}", {"format_ok": False, "num_calls": 0})
        details = {"format_ok": True, "num_calls": len(calls)}
        if len(calls) != len(specs):
            return Score(0.0, f"expected {len(specs)} call(s), got {len(calls)}", details)
        if _perfect_matching(calls, specs, schemas) != len(specs):
            names = sorted(call["name"] for call in calls)
            return Score(0.0, f"calls {names} do not match the ground truth", details)
        return Score(1.0, "ok", details)


def score_details(
    solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``{"score", "format_ok", "reason", "num_calls"}`` of `FunctionCallingScorer`, for one
    response (debugging and metrics)."""
    scored = score_one(FunctionCallingScorer(), solution_str, ground_truth, extra_info)
    return scored.as_dict(DETAIL_KEYS)


def compute_score(
    solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None
) -> float:
    """Deprecated (0.2): 1.0 when the response's format and calls are exact, else 0.0, as
    `FunctionCallingScorer` scores it (verl's entry point: `entropyrl.verl.rewards`,
    ``function_calling_score``)."""
    warnings.warn(_MOVED, DeprecationWarning, stacklevel=2)
    return score_one(FunctionCallingScorer(), solution_str, ground_truth, extra_info).score


_MOVED = (
    "entropyrl.rewards.function_calling.compute_score is deprecated: score with "
    "FunctionCallingScorer, or name pkg://entropyrl.verl.rewards, function_calling_score in verl"
)


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
def bfcl_checker() -> dict[str, Any]:
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
    bfcl = bfcl_checker()
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
