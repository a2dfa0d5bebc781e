"""Number types at every depth: what the strict reward accepts, BFCL's checker accepts too.

BFCL's checker (bfcl-eval 2026.3.23, `bfcl_eval/eval_checker/ast_eval/ast_checker.py`) converts
an int to a float only for a Python function's float argument itself (`simple_function_checker`),
type-checks the items of an array argument against the schema's item type one level deep
(`type_checker` with `nested_type_converted`), and compares values inside lists and dicts with
Python's `==`. The strict reward allows int for float only at the top level and keeps every
nested number's type, so it is never looser; where BFCL's `==` is looser (an int inside a dict
or a list of lists), the reward is stricter by design.

The property runs the reward three ways (the raw BFCL answer with BFCL's schema, the converter's
ground truth and tools, the ground truth alone) against `bfcl_verdict` (BFCL's Qwen FC decoder and
`ast_checker`). The edge-case table pins both verdicts for single arguments. The BFCL parts skip
when bfcl-eval is not installed, and fail instead in CI (CI=true).
"""

from __future__ import annotations

import importlib
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from entropyrl.data.function_calling import example_from_bfcl
from entropyrl.rewards.function_calling import bfcl_verdict, compute_score

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
OMIT = object()  # the argument is left out of the call


def require_bfcl() -> None:
    """BFCL's checker, or a skip outside CI (in CI a missing checker is a failure)."""
    module = "bfcl_eval.eval_checker.ast_eval.ast_checker"
    if IN_CI:
        importlib.import_module(module)
    else:
        pytest.importorskip(module, reason="bfcl-eval is not installed (optional extra bfcl)")


def render(arguments: dict) -> str:
    call = json.dumps({"name": "f", "arguments": arguments})
    return f"<think>\nThe user asks for f.\n</think>\n\n<tool_call>\n{call}\n</tool_call>"


def entry_for(properties: dict, required: list[str]) -> dict:
    """A BFCL simple_python entry for one function ``f`` with BFCL's own schema types."""
    return {
        "id": "simple_python_0",
        "question": [[{"role": "user", "content": "Call f."}]],
        "function": [
            {
                "name": "f",
                "description": "A test function.",
                "parameters": {"type": "dict", "properties": properties, "required": required},
            }
        ],
    }


def scores(text: str, entry: dict, answer: list) -> dict[str, float]:
    """The strict reward as a row can hand it over: BFCL's answer and schema, the converter's
    ground truth and JSON Schema tools, the converter's ground truth alone."""
    example = example_from_bfcl(entry, answer, category="simple_python")
    converted_tools = json.dumps([tool["function"] for tool in example.tools])
    return {
        "raw + BFCL schema": compute_score(text, answer, {"tools": entry["function"]}),
        "converted + tools": compute_score(text, example.answer, {"tools": converted_tools}),
        "converted, no schema": compute_score(text, example.answer),
    }


# ---------------------------------------------------------------------------- edge cases
FLOAT = {"type": "float"}
FLOATS = {"type": "array", "items": {"type": "float"}}
GRID = {"type": "array", "items": {"type": "array"}}
ROWS = {"type": "array", "items": {"type": "dict"}}
DICT = {"type": "dict", "properties": {"k": {"type": "float"}}}
INTEGER, BOOLEAN, STRING = {"type": "integer"}, {"type": "boolean"}, {"type": "string"}

# (name, schema, required, acceptable values, value written, strict reward, BFCL's checker)
EDGE_CASES = [
    # the top-level int-for-float allowance (BFCL converts int to float for float arguments)
    ("int for a top-level float", FLOAT, True, [12.0], 12, 1.0, True),
    ("float for a top-level float", FLOAT, True, [12.0], 12.0, 1.0, True),
    ("float for a top-level int", INTEGER, True, [5], 5.0, 0.0, False),
    ("int answer of a float parameter, as written", FLOAT, True, [0], 0, 1.0, True),
    ("int answer of a float parameter, as a float", FLOAT, True, [0], 0.0, 0.0, True),
    # lists: BFCL type-checks the items against the schema's item type
    ("ints in a list of floats", FLOATS, True, [[12.0, 15.0, 18.0]], [12, 15, 18], 0.0, False),
    ("one int in a list of floats", FLOATS, True, [[12.0, 15.0]], [12.0, 15], 0.0, False),
    ("floats in a list of floats", FLOATS, True, [[12.0, 15.0]], [12.0, 15.0], 1.0, True),
    ("floats in a list of ints", FLOATS, True, [[23, 45]], [23.0, 45.0], 0.0, True),
    ("bool in a list of floats", FLOATS, True, [[1.0]], [True], 0.0, False),
    # lists of lists: BFCL checks the inner lists' type only, then Python ==
    ("ints in a list of lists", GRID, True, [[[1.0, 2.0], [3.0]]], [[1, 2], [3]], 0.0, True),
    (
        "floats in a list of lists",
        GRID,
        True,
        [[[1.0, 2.0], [3.0]]],
        [[1.0, 2.0], [3.0]],
        1.0,
        True,
    ),
    ("a flat list for a list of lists", GRID, True, [[[1.0, 2.0]]], [1.0, 2.0], 0.0, False),
    # dicts inside lists: BFCL matches each against its pattern with Python ==
    (
        "int in a dict inside a list",
        ROWS,
        True,
        [[{"a": [1.5], "b": [2.0]}]],
        [{"a": 1.5, "b": 2}],
        0.0,
        True,
    ),
    ("bool for an int in a dict in a list", ROWS, True, [[{"a": [1]}]], [{"a": True}], 0.0, True),
    (
        "exact dict inside a list",
        ROWS,
        True,
        [[{"a": [1.5], "b": [2.0]}]],
        [{"a": 1.5, "b": 2.0}],
        1.0,
        True,
    ),
    (
        "optional key of a dict in a list",
        ROWS,
        True,
        [[{"a": [1.5], "b": ["", 2.0]}]],
        [{"a": 1.5}],
        1.0,
        True,
    ),
    (
        "dicts out of order",
        ROWS,
        True,
        [[{"a": [1.0]}, {"a": [2.0]}]],
        [{"a": 2.0}, {"a": 1.0}],
        0.0,
        False,
    ),
    # dicts: a pattern, values compared with Python == by BFCL
    ("int in a dict", DICT, True, [{"k": [3.0]}], {"k": 3}, 0.0, True),
    ("float in a dict", DICT, True, [{"k": [3.0]}], {"k": 3.0}, 1.0, True),
    ("unknown key in a dict", DICT, True, [{"k": [3.0]}], {"k": 3.0, "z": 1.0}, 0.0, False),
    (
        "a literal where a pattern is",
        DICT,
        True,
        [{"k": [3.0, 4.0]}],
        {"k": [3.0, 4.0]},
        0.0,
        False,
    ),
    # empty lists
    ("empty list answer", FLOATS, True, [[]], [], 1.0, True),
    ("empty list for a non-empty one", FLOATS, True, [[1.0]], [], 0.0, False),
    ("empty list for an optional list", FLOATS, False, ["", [1.0]], [], 0.0, True),
    ("optional list omitted", FLOATS, False, ["", [1.0]], OMIT, 1.0, True),
    # bool is not int
    ("bool for an int", INTEGER, True, [1], True, 0.0, False),
    ("int for a bool", BOOLEAN, True, [True], 1, 0.0, False),
    ("bool for a bool", BOOLEAN, True, [False], False, 1.0, True),
    # None
    ("None where BFCL lists it", FLOAT, False, ["", None], None, 1.0, True),
    ("None for a float", FLOAT, True, [1.0], None, 0.0, False),
    ("None in a list of floats", FLOATS, True, [[1.0]], [None], 0.0, False),
    # strings that look like numbers
    ("number for a numeric string", STRING, True, ["12"], 12, 0.0, False),
    ("numeric string for a float", FLOAT, True, [12.0], "12", 0.0, False),
    ("numeric string for a numeric string", STRING, True, ["12"], "12", 1.0, True),
    ("numeric strings in a list of floats", FLOATS, True, [[1.0]], ["1.0"], 0.0, False),
    ("int for a float answer of a string parameter", STRING, True, [2.0], 2, 0.0, False),
    # required by the schema, optional by the answer: BFCL wants it given
    ("required, marked optional, omitted", BOOLEAN, True, [True, ""], OMIT, 0.0, False),
    ("required, marked optional, given", BOOLEAN, True, [True, ""], True, 1.0, True),
    ("not required, marked optional, omitted", BOOLEAN, False, [True, ""], OMIT, 1.0, True),
]
CASE_IDS = [case[0] for case in EDGE_CASES]
# The ground truth alone cannot tell that the parameter is a string: only the schema can.
NEEDS_THE_SCHEMA = {"int for a float answer of a string parameter"}


def _edge(case):
    _, schema, required, options, value, _, _ = case
    entry = entry_for({"p": schema}, ["p"] if required else [])
    answer = [{"f": {"p": options}}]
    return entry, answer, render({} if value is OMIT else {"p": value})


@pytest.mark.parametrize("case", EDGE_CASES, ids=CASE_IDS)
def test_edge_cases_strict_reward(case):
    entry, answer, text = _edge(case)
    expected = case[5]
    got = scores(text, entry, answer)
    assert got["raw + BFCL schema"] == expected
    assert got["converted + tools"] == expected


@pytest.mark.parametrize("case", EDGE_CASES, ids=CASE_IDS)
def test_edge_cases_bfcl_verdict(case):
    """BFCL's own verdict on each case, and the reward never 1 where it is False."""
    require_bfcl()
    entry, answer, text = _edge(case)
    bfcl_ok = bfcl_verdict(text, entry, answer, "simple_python")
    assert bfcl_ok is case[6]
    for mode, score in scores(text, entry, answer).items():
        if mode == "converted, no schema" and case[0] in NEEDS_THE_SCHEMA:
            assert score == 1.0 and not bfcl_ok  # what the tools in extra_info are for
            continue
        assert score <= float(bfcl_ok), mode


def test_without_a_schema_the_ground_truth_decides():
    """No tools: an optional-marked parameter may be omitted and a top-level int stands for a
    float, whatever a schema would say; nested numbers keep their type all the same."""
    answer = [{"f": {"p": [True, ""]}}]
    assert compute_score(render({}), answer) == 1.0
    assert (
        compute_score(render({}), answer, {"tools": entry_for({"p": BOOLEAN}, ["p"])["function"]})
        == 0.0
    )
    assert compute_score(render({"p": 2}), [{"f": {"p": [2.0]}}]) == 1.0
    assert compute_score(render({"p": [2]}), [{"f": {"p": [[2.0]]}}]) == 0.0
    truth = [{"name": "f", "arguments": {"p": 2.0, "q": [2.0]}}]
    assert compute_score(render({"p": 2, "q": [2.0]}), truth) == 1.0
    assert compute_score(render({"p": 2, "q": [2]}), truth) == 0.0
    string_tools = {
        "tools": [{"name": "f", "parameters": {"properties": {"p": STRING, "q": FLOATS}}}]
    }
    assert compute_score(render({"p": 2, "q": [2.0]}), truth, string_tools) == 0.0


# ---------------------------------------------------------------------------- the property
FLOAT_VALUES = st.sampled_from([0.0, 1.0, 2.5, 12.0, -3.0, 100.0, 0.5])
PARAMETERS = {
    "x": FLOAT,
    "xs": FLOATS,
    "grid": GRID,
    "rows": ROWS,
    "d": {"type": "dict", "properties": {"k": FLOAT, "m": FLOATS}},
}


@st.composite
def float_answers(draw) -> dict:
    """A float-typed answer per parameter: a float, a list, a list of lists, dicts in a list, a
    dict; each as BFCL writes it (a list of acceptable values, "" for optional)."""
    chosen = draw(
        st.lists(st.sampled_from(sorted(PARAMETERS)), min_size=1, max_size=3, unique=True)
    )
    values = {
        "x": FLOAT_VALUES,
        "xs": st.lists(FLOAT_VALUES, max_size=3),
        "grid": st.lists(st.lists(FLOAT_VALUES, max_size=2), max_size=2),
        "rows": st.lists(st.fixed_dictionaries({"a": FLOAT_VALUES, "b": FLOAT_VALUES}), max_size=2),
        "d": st.fixed_dictionaries({"k": FLOAT_VALUES, "m": st.lists(FLOAT_VALUES, max_size=2)}),
    }
    answer = {}
    for name in chosen:
        value = draw(values[name])
        if name == "rows":
            value = [{key: [item] for key, item in row.items()} for row in value]
        elif name == "d":
            value = {key: [item] for key, item in value.items()}
        options = [value]
        if draw(st.booleans()):
            options.append("")  # optional
        answer[name] = options
    return answer


def _concrete(name: str, value):
    if name == "rows":
        return [{key: items[0] for key, items in row.items()} for row in value]
    if name == "d":
        return {key: items[0] for key, items in value.items()}
    return value


@st.composite
def mutated(draw, value):
    """``value`` with some numbers changed: int for float, bool, string, None, or dropped."""
    if isinstance(value, float):
        kind = draw(st.sampled_from(["same", "same", "int", "int", "bool", "string", "none"]))
        if kind == "int":
            return int(value) if value.is_integer() else value
        return {"same": value, "bool": bool(value), "string": str(value), "none": None}[kind]
    if isinstance(value, list):
        items = [draw(mutated(item)) for item in value]
        if items and draw(st.integers(0, 9)) == 0:
            items.pop()
        return items
    if isinstance(value, dict):
        return {key: draw(mutated(item)) for key, item in value.items()}
    return value


def test_what_the_strict_reward_accepts_bfcl_accepts():
    """Over nested float-typed answers and mutations of them: reward 1 implies BFCL's 1."""
    require_bfcl()
    seen = set()

    @settings(
        max_examples=300,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(data=st.data())
    def check(data):
        answer_params = data.draw(float_answers())
        properties = {name: PARAMETERS[name] for name in answer_params}
        required = [name for name, options in answer_params.items() if "" not in options]
        required += data.draw(st.lists(st.sampled_from(sorted(answer_params)), max_size=1))
        entry = entry_for(properties, sorted(set(required)))
        answer = [{"f": answer_params}]
        arguments = {}
        for name, options in answer_params.items():
            if "" in options and data.draw(st.integers(0, 3)) == 0:
                continue  # omitted
            arguments[name] = data.draw(mutated(_concrete(name, options[0])))
        text = render(arguments)
        bfcl_ok = bfcl_verdict(text, entry, answer, "simple_python")
        for mode, score in scores(text, entry, answer).items():
            assert score <= float(bfcl_ok), (mode, arguments, answer)
            seen.add((score, bfcl_ok))

    check()
    # not vacuous: both accept, both reject, and the reward stricter than BFCL all occurred
    assert {(1.0, True), (0.0, False), (0.0, True)} <= seen
