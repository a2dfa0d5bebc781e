"""Strict binary function-calling reward: format, multiset match, BFCL answers, irrelevance."""

from __future__ import annotations

import json

import pytest

from entropyrl.rewards.function_calling import (
    ToolCallFormatError,
    compute_score,
    parse_tool_calls,
    score_details,
    values_equal,
)


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def response(*blocks: str, think: str = "The user wants this.") -> str:
    return f"<think>\n{think}\n</think>\n\n" + "\n".join(blocks)


# xLAM function-calling-60k style: answers as a JSON string of {name, arguments}.
XLAM_TRUTH = json.dumps(
    [
        {"name": "live_giveaways_by_type", "arguments": {"type": "beta"}},
        {"name": "live_giveaways_by_type", "arguments": {"type": "game"}},
    ]
)
# OpenAI messages converted by the project: arguments already decoded.
WEATHER_TRUTH = [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]
# BFCL possible answer: lists of acceptable values, "" = may be omitted.
BFCL_TRUTH = [
    {"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units", "cm", ""]}}
]


def test_parse_tool_calls_real_format():
    text = response(call("f", a=1), call("g"))
    assert parse_tool_calls(text) == [
        {"name": "f", "arguments": {"a": 1}},
        {"name": "g", "arguments": {}},
    ]
    assert parse_tool_calls(response("The answer is 42.")) == []
    assert parse_tool_calls(call("f"), require_think=False) == [{"name": "f", "arguments": {}}]
    assert parse_tool_calls(response(call("f")) + "<|im_end|>") == [{"name": "f", "arguments": {}}]


@pytest.mark.parametrize(
    "text, truth, expected",
    [
        # xLAM parallel calls, both orders
        (
            response(
                call("live_giveaways_by_type", type="beta"),
                call("live_giveaways_by_type", type="game"),
            ),
            XLAM_TRUTH,
            1.0,
        ),
        (
            response(
                call("live_giveaways_by_type", type="game"),
                call("live_giveaways_by_type", type="beta"),
            ),
            XLAM_TRUTH,
            1.0,
        ),
        # duplicated call instead of the second one
        (
            response(
                call("live_giveaways_by_type", type="beta"),
                call("live_giveaways_by_type", type="beta"),
            ),
            XLAM_TRUTH,
            0.0,
        ),
        # missing call
        (response(call("live_giveaways_by_type", type="beta")), XLAM_TRUTH, 0.0),
        # extra call
        (
            response(
                call("get_weather", city="Paris", days=3), call("get_weather", city="Rome", days=3)
            ),
            WEATHER_TRUTH,
            0.0,
        ),
        # 3 == 3.0, but "3" != 3
        (response(call("get_weather", city="Paris", days=3.0)), WEATHER_TRUTH, 1.0),
        (response(call("get_weather", city="Paris", days="3")), WEATHER_TRUTH, 0.0),
        # string compare is exact
        (response(call("get_weather", city="paris", days=3)), WEATHER_TRUTH, 0.0),
        # wrong name, missing and extra argument
        (response(call("get_forecast", city="Paris", days=3)), WEATHER_TRUTH, 0.0),
        (response(call("get_weather", city="Paris")), WEATHER_TRUTH, 0.0),
        (response(call("get_weather", city="Paris", days=3, unit="C")), WEATHER_TRUTH, 0.0),
        # BFCL: optional parameter omitted or given with an acceptable value; wrong value
        (response(call("calculate_triangle_area", base=10, height=5)), BFCL_TRUTH, 1.0),
        (response(call("calculate_triangle_area", base=10, height=5, unit="cm")), BFCL_TRUTH, 1.0),
        (response(call("calculate_triangle_area", base=10.0, height=5)), BFCL_TRUTH, 1.0),
        (response(call("calculate_triangle_area", base=10, height=5, unit="m")), BFCL_TRUTH, 0.0),
        (response(call("calculate_triangle_area", base=10)), BFCL_TRUTH, 0.0),
        (
            response(call("calculate_triangle_area", base=10, height=5, color="red")),
            BFCL_TRUTH,
            0.0,
        ),
        # irrelevance: no call expected
        (response("None of the tools can book a flight."), [], 1.0),
        (response("None of the tools can book a flight."), "[]", 1.0),
        (response(call("get_weather", city="Paris", days=3)), [], 0.0),
        (response("I would call get_weather."), WEATHER_TRUTH, 0.0),
    ],
)
def test_compute_score(text, truth, expected):
    assert compute_score(text, truth) == expected
    assert compute_score(text, truth, {"index": 0}) == expected


def test_nested_arguments():
    truth = [{"name": "book", "arguments": {"guest": {"name": "Ann", "ids": [1, 2]}, "ok": True}}]
    good = response(call("book", guest={"ids": [1.0, 2], "name": "Ann"}, ok=True))
    assert compute_score(good, truth) == 1.0
    assert (
        compute_score(response(call("book", guest={"ids": [2, 1], "name": "Ann"}, ok=True)), truth)
        == 0.0
    )
    assert (
        compute_score(response(call("book", guest={"ids": [1, 2], "name": "Ann"}, ok=1)), truth)
        == 0.0
    )
    assert compute_score(response(call("book", guest={"ids": [1, 2]}, ok=True)), truth) == 0.0
    bfcl = [{"book": {"guest": [{"name": ["Ann", "ann"], "ids": [[1, 2]]}], "ok": [True]}}]
    assert (
        compute_score(response(call("book", guest={"name": "ann", "ids": [1, 2]}, ok=True)), bfcl)
        == 1.0
    )
    assert (
        compute_score(response(call("book", guest={"name": "Bob", "ids": [1, 2]}, ok=True)), bfcl)
        == 0.0
    )


def test_matching_needs_a_perfect_assignment():
    """Greedy matching would pair the first call with the looser spec and fail."""
    truth = [{"f": {"x": [1, 2]}}, {"f": {"x": [1]}}]
    assert compute_score(response(call("f", x=1), call("f", x=2)), truth) == 1.0
    assert compute_score(response(call("f", x=2), call("f", x=2)), truth) == 0.0


BAD_FORMATS = {
    "no think": call("f"),
    "empty think": "<think> </think>" + call("f"),
    "unclosed think": "<think>reasoning " + call("f"),
    "text before call": response("Sure! " + call("f")),
    "trailing text": response(call("f")) + "\nDone.",
    "unclosed tag": response('<tool_call>\n{"name": "f", "arguments": {}}\n'),
    "nested open": response('<tool_call>{"name": "f", <tool_call>"arguments": {}}</tool_call>'),
    "stray close": response('{"name": "f", "arguments": {}}</tool_call>'),
    "json comment": response('<tool_call>{"name": "f", // call f\n"arguments": {}}</tool_call>'),
    "block comment": response('<tool_call>{"name": "f", /* x */ "arguments": {}}</tool_call>'),
    "single quotes": response("<tool_call>{'name': 'f', 'arguments': {}}</tool_call>"),
    "trailing comma": response('<tool_call>{"name": "f", "arguments": {},}</tool_call>'),
    "two objects": response(
        '<tool_call>{"name": "f", "arguments": {}} {"name": "g", "arguments": {}}</tool_call>'
    ),
    "NaN": response('<tool_call>{"name": "f", "arguments": {"x": NaN}}</tool_call>'),
    "duplicated key": response(
        '<tool_call>{"name": "f", "arguments": {"x": 1, "x": 2}}</tool_call>'
    ),
    "arguments as string": response('<tool_call>{"name": "f", "arguments": "{}"}</tool_call>'),
    "extra key": response('<tool_call>{"name": "f", "arguments": {}, "id": 1}</tool_call>'),
    "no name": response('<tool_call>{"arguments": {}}</tool_call>'),
    "a list": response('<tool_call>[{"name": "f", "arguments": {}}]</tool_call>'),
    "second think": response(call("f")) + "<think>more</think>",
}


@pytest.mark.parametrize("case", sorted(BAD_FORMATS))
def test_malformed_output_scores_zero_with_a_reason(case):
    text = BAD_FORMATS[case]
    with pytest.raises(ToolCallFormatError) as info:
        parse_tool_calls(text)
    assert isinstance(info.value, ValueError) and str(info.value)
    details = score_details(text, [{"name": "f", "arguments": {}}])
    assert details["score"] == 0.0 and details["format_ok"] is False
    assert details["reason"].startswith("format: ")
    assert compute_score(text, [{"name": "f", "arguments": {}}]) == 0.0


def test_details_of_a_mismatch():
    details = score_details(response(call("f", a=1)), [{"name": "f", "arguments": {"a": 2}}])
    assert details == {
        "score": 0.0,
        "format_ok": True,
        "num_calls": 1,
        "reason": "calls ['f'] do not match the ground truth",
    }


@pytest.mark.parametrize(
    "truth, match",
    [
        ("not json", "invalid JSON"),
        ([{"name": "f"}], "ground_truth\\[0\\]"),
        ([{"f": {"x": 1}}], "BFCL"),
        ([{"name": "f", "arguments": "{bad"}], "arguments"),
        (5, "list of calls"),
    ],
)
def test_bad_ground_truth_is_an_error(truth, match):
    with pytest.raises(ValueError, match=match):
        compute_score(response(call("f")), truth)


def test_values_equal():
    assert values_equal(1, 1.0) and values_equal({"a": [1]}, {"a": [1.0]})
    assert not values_equal(True, 1) and not values_equal("1", 1) and not values_equal(None, 0)
    assert not values_equal(float("nan"), float("nan"))


def test_tags_survive_qwen_decoding():
    """<tool_call> and <think> are ordinary text for the project's Qwen tokenizer."""
    tokenizer_module = pytest.importorskip("entropyrl.local.tokenizer")
    try:
        tokenizer = tokenizer_module.build_qwen_tokenizer(8192)
    except Exception as error:  # the tokenizer build has its own tests
        pytest.skip(f"tokenizer not buildable here: {error}")
    text = response(call("get_weather", city="Paris", days=3))
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    decoded = tokenizer.decode(ids, skip_special_tokens=True)
    assert decoded == text
    assert compute_score(decoded, WEATHER_TRUTH) == 1.0


def test_ground_truth_as_numpy_array():
    """verl hands parquet list columns over as numpy object arrays."""
    import numpy as np

    truth = np.array(WEATHER_TRUTH, dtype=object)
    assert compute_score(response(call("get_weather", city="Paris", days=3)), truth) == 1.0
