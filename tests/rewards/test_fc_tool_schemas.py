"""The tool schemas in `extra_info["tools"]`, in every shape a row can hand them to the reward.

The converter writes a JSON string (the safe form: each row's schemas differ); a parquet written
with the tools as a struct comes back from pandas as numpy arrays, with every key any row has and
None where a row lacks it; older rows hold OpenAI-wrapped tools. Each must give the same verdict.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from entropyrl.rewards.function_calling import (
    FunctionSchema,
    ParameterSchema,
    compute_score,
    function_schema,
    score_details,
    tool_schemas,
)

PRIME = {
    "name": "get_prime_factors",
    "description": "Prime factors of a number.",
    "parameters": {
        "type": "object",
        "properties": {"number": {"type": "integer"}, "formatted": {"type": "boolean"}},
        "required": ["number", "formatted"],
    },
}
AREA = {
    "name": "area",
    "description": "Area under a curve.",
    "parameters": {
        "type": "object",
        "properties": {
            "interval": {"type": "array", "items": {"type": "number"}},
            "method": {"type": "string"},
        },
        "required": ["interval"],
    },
}
ANSWER = [{"get_prime_factors": {"number": [450], "formatted": [True, ""]}}]


def render(name: str, arguments: dict) -> str:
    call = json.dumps({"name": name, "arguments": arguments})
    return f"<think>\nI call {name}.\n</think>\n\n<tool_call>\n{call}\n</tool_call>"


OMITTED = render("get_prime_factors", {"number": 450})
GIVEN = render("get_prime_factors", {"number": 450, "formatted": True})


def parquet_struct_round_trip(tmp_path, tools: list[dict]) -> dict:
    """extra_info as pandas reads it back when the tools were stored as a struct, not a string."""
    path = tmp_path / "rows.parquet"
    frame = pd.DataFrame(
        {"extra_info": [{"index": 0, "tools": tools}, {"index": 1, "tools": [AREA]}]}
    )
    frame.to_parquet(path)
    return pd.read_parquet(path).to_dict("records")[0]["extra_info"]


@pytest.mark.parametrize(
    "tools",
    [
        json.dumps([PRIME, AREA]),
        [PRIME, AREA],
        json.dumps([{"type": "function", "function": PRIME}]),  # rows written before the change
        [{"type": "function", "function": PRIME}],
        json.dumps([PRIME]).encode(),
        PRIME,  # one definition on its own
    ],
    ids=["json", "list", "openai json", "openai list", "bytes", "one definition"],
)
def test_every_form_of_the_tools_gives_the_schemas_verdict(tools):
    assert compute_score(OMITTED, ANSWER, {"tools": tools}) == 0.0
    assert compute_score(GIVEN, ANSWER, {"tools": tools}) == 1.0


def test_tools_after_a_parquet_struct_round_trip(tmp_path):
    extra_info = parquet_struct_round_trip(tmp_path, [PRIME, AREA])
    assert not isinstance(extra_info["tools"], (list, str))  # numpy, keys unified
    schemas = tool_schemas(extra_info["tools"])
    assert schemas["get_prime_factors"] == FunctionSchema(
        {"number": ParameterSchema(int), "formatted": ParameterSchema(bool)},
        frozenset({"number", "formatted"}),
    )
    assert schemas["area"].parameters["interval"] == ParameterSchema(list, float)
    assert compute_score(OMITTED, ANSWER, extra_info) == 0.0
    assert compute_score(GIVEN, ANSWER, extra_info) == 1.0
    interval = [{"area": {"interval": [[1.0, 3.0]], "method": ["", "simpson"]}}]
    assert compute_score(render("area", {"interval": [1.0, 3.0]}), interval, extra_info) == 1.0
    assert compute_score(render("area", {"interval": [1, 3]}), interval, extra_info) == 0.0


def test_schema_forms():
    bfcl = {
        "name": "f",
        "parameters": {
            "type": "dict",
            "properties": {
                "x": {"type": "float"},
                "t": {"type": "tuple", "items": {"type": "any"}},
            },
            "required": ["x"],
        },
    }
    assert function_schema(bfcl) == FunctionSchema(
        {"x": ParameterSchema(float), "t": ParameterSchema(list, str)}, frozenset({"x"})
    )
    xlam = {"name": "g", "parameters": {"type": {"type": "str"}, "n": {"type": "int, optional"}}}
    assert function_schema(xlam) == FunctionSchema(
        {"type": ParameterSchema(str), "n": ParameterSchema(int)}, frozenset()
    )
    assert function_schema({"name": "h"}).parameters is None
    assert function_schema({"name": "h", "parameters": {"type": "object"}}).parameters is None
    unknown = {"name": "k", "parameters": {"properties": {"v": {"type": ["string", "null"]}}}}
    assert function_schema(unknown).parameters == {"v": ParameterSchema(None)}


@pytest.mark.parametrize(
    "extra_info", [None, {}, {"index": 3}, {"tools": None}, {"tools": []}, "not a mapping"]
)
def test_no_tools_means_the_ground_truth_decides(extra_info):
    assert compute_score(OMITTED, ANSWER, extra_info) == 1.0


def test_a_call_of_a_function_outside_the_tools_uses_the_ground_truth():
    assert compute_score(OMITTED, ANSWER, {"tools": [AREA]}) == 1.0


def test_a_parameter_the_schema_lacks_is_wrong():
    answer = [{"get_prime_factors": {"number": [450], "formatted": [True], "zz": [1]}}]
    text = render("get_prime_factors", {"number": 450, "formatted": True, "zz": 1})
    assert compute_score(text, answer) == 1.0
    assert compute_score(text, answer, {"tools": [PRIME]}) == 0.0  # BFCL: unexpected parameter


@pytest.mark.parametrize(
    "tools, match",
    [
        ("[not json", "invalid JSON"),
        (5, "list of function definitions"),
        ([{"description": "no name"}], r"tools'\]\[0\]"),
        (["get_prime_factors"], r"tools'\]\[0\]"),
    ],
)
def test_malformed_tools_are_a_data_error(tools, match):
    with pytest.raises(ValueError, match=match):
        score_details(GIVEN, ANSWER, {"tools": tools})
