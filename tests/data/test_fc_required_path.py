"""BFCL rows end to end: `entropyrl prepare fc --format bfcl` -> parquet -> pandas -> verl's reward.

The rows are two shipped BFCL v4 entries (bfcl-eval 2026.3.23 data, Apache-2.0), copied here so
the path runs without bfcl-eval: simple_python_17, whose schema requires ``formatted`` while its
possible answer marks it optional (``[true, ""]``; BFCL's checker rejects a call without it), and
simple_python_13, whose answer is a list of floats (``[[1.0, 3.0]]``; BFCL's checker rejects
``[1, 3]``). The reward gets `reward_model.ground_truth` and `extra_info` exactly as pandas reads
them back, as verl hands them over.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from entropyrl.cli import main as entropyrl_main
from entropyrl.rewards.function_calling import compute_score
from entropyrl.verl.rewards import function_calling_score

ENTRIES = [
    {
        "id": "simple_python_13",
        "question": [
            [
                {
                    "role": "user",
                    "content": "Calculate the area under the curve y=x^2 from x=1 to x=3.",
                }
            ]
        ],
        "function": [
            {
                "name": "calculate_area_under_curve",
                "description": "Calculate the area under a mathematical function within a given "
                "interval.",
                "parameters": {
                    "type": "dict",
                    "properties": {
                        "function": {
                            "type": "string",
                            "description": "The mathematical function as a string.",
                        },
                        "interval": {
                            "type": "array",
                            "items": {"type": "float"},
                            "description": "An array that defines the interval to calculate the "
                            "area under the curve from the start to the end point.",
                        },
                        "method": {
                            "type": "string",
                            "description": "The numerical method to approximate the area under "
                            "the curve. The default value is 'trapezoidal'.",
                        },
                    },
                    "required": ["function", "interval"],
                },
            }
        ],
    },
    {
        "id": "simple_python_17",
        "question": [[{"role": "user", "content": "Find the prime factors of 450"}]],
        "function": [
            {
                "name": "get_prime_factors",
                "description": "Function to retrieve prime factors of a number.",
                "parameters": {
                    "type": "dict",
                    "properties": {
                        "number": {
                            "type": "integer",
                            "description": "Number for which prime factors need to be calculated",
                        },
                        "formatted": {
                            "type": "boolean",
                            "description": "Return formatted string if true, array if false. "
                            "Default is true.",
                        },
                    },
                    "required": ["number", "formatted"],
                },
            }
        ],
    },
]
ANSWERS = [
    {
        "id": "simple_python_13",
        "ground_truth": [
            {
                "calculate_area_under_curve": {
                    "function": ["x**2", "lambda x: x**2", "y=x**2"],
                    "interval": [[1.0, 3.0]],
                    "method": ["", "trapezoidal"],
                }
            }
        ],
    },
    {
        "id": "simple_python_17",
        "ground_truth": [{"get_prime_factors": {"number": [450], "formatted": [True, ""]}}],
    },
]


def render(name: str, arguments: dict) -> str:
    call = json.dumps({"name": name, "arguments": arguments})
    return f"<think>\nI call {name}.\n</think>\n\n<tool_call>\n{call}\n</tool_call><|im_end|>"


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> dict[str, dict]:
    """The converted rows as pandas reads the parquet back, by BFCL id."""
    root = tmp_path_factory.mktemp("bfcl")
    source = root / "BFCL_v4_simple_python.json"
    source.write_text("".join(json.dumps(entry) + "\n" for entry in ENTRIES))
    (root / "possible_answer").mkdir()
    (root / "possible_answer" / source.name).write_text(
        "".join(json.dumps(answer) + "\n" for answer in ANSWERS)
    )
    out = root / "out"
    command = ["prepare", "fc", "--format", "bfcl", "--input", str(source), "--out", str(out)]
    code = entropyrl_main([*command, "--test-size", "0"])
    assert code in (0, None)
    frame = pd.read_parquet(out / "train.parquet")
    return {row["extra_info"]["source_id"]: row for row in frame.to_dict("records")}


def verl_score(row: dict, response: str) -> float:
    result = function_calling_score(
        row["data_source"], response, row["reward_model"]["ground_truth"], row["extra_info"]
    )
    return result["score"]


def test_a_schema_required_parameter_marked_optional_must_be_given(rows):
    row = rows["simple_python_17"]
    assert verl_score(row, render("get_prime_factors", {"number": 450})) == 0.0
    assert verl_score(row, render("get_prime_factors", {"number": 450, "formatted": True})) == 1.0
    assert verl_score(row, render("get_prime_factors", {"number": 450, "formatted": False})) == 0.0


def test_the_row_keeps_the_schema_the_reward_needs(rows):
    row = rows["simple_python_17"]
    tools = json.loads(row["extra_info"]["tools"])
    assert [tool["name"] for tool in tools] == ["get_prime_factors"]  # no OpenAI wrapper
    assert tools[0]["parameters"]["required"] == ["number", "formatted"]
    # BFCL's unmodified answer marks "formatted" optional: the schema in extra_info still rules.
    raw = json.loads(row["extra_info"]["bfcl"])["possible_answer"]
    assert raw == ANSWERS[1]["ground_truth"]
    omitted = render("get_prime_factors", {"number": 450})
    assert verl_score({**row, "reward_model": {"ground_truth": json.dumps(raw)}}, omitted) == 0.0
    assert compute_score(omitted, raw) == 1.0  # without a schema, the ground truth decides


def test_numbers_inside_a_list_keep_the_answers_type(rows):
    row = rows["simple_python_13"]
    name = "calculate_area_under_curve"
    assert verl_score(row, render(name, {"function": "x**2", "interval": [1.0, 3.0]})) == 1.0
    assert verl_score(row, render(name, {"function": "x**2", "interval": [1, 3]})) == 0.0
    assert verl_score(row, render(name, {"function": "x**2", "interval": [1.0, 3]})) == 0.0
    given = {"function": "x**2", "interval": [1.0, 3.0], "method": "trapezoidal"}
    assert verl_score(row, render(name, given)) == 1.0
