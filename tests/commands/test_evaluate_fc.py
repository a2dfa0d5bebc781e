"""Function-calling evaluation: strict and BFCL accuracy side by side, by hand-counted rows."""

from __future__ import annotations

import json

import pytest

from entropyrl.commands.eval import fc as evaluate

FUNCTION = {
    "name": "area",
    "description": "Area of a rectangle.",
    "parameters": {
        "type": "dict",
        "properties": {"width": {"type": "integer"}, "unit": {"type": "string"}},
        "required": ["width"],
    },
}
POSSIBLE = [{"area": {"width": [3], "unit": ["cm", ""]}}]
ENTRY = json.dumps(
    {
        "id": "simple_python_0",
        "category": "simple_python",
        "function": [FUNCTION],
        "possible_answer": POSSIBLE,
    }
)


def call_named(name: str, arguments: dict, *, think: bool = True) -> str:
    block = "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"
    return ("<think>t</think>\n" if think else "") + block


def call(arguments: dict, *, think: bool = True) -> str:
    return call_named("area", arguments, think=think)


ROWS = [
    # (response, strict, BFCL)
    (call({"width": 3}), True, True),
    (call({"width": 3, "unit": "CM"}), False, True),  # BFCL lower-cases strings
    (call({"width": 3}, think=False), False, True),  # BFCL needs no reasoning block
    (call({"width": 3.0}), False, False),  # integer written as a float: both reject
    (call({"width": 4}), False, False),
]


def _rows(source: str = "bfcl_simple_python") -> list[dict]:
    return [
        {
            "response": text,
            "ground_truth": json.dumps(POSSIBLE),
            "data_source": source,
            "bfcl": ENTRY,
        }
        for text, _, _ in ROWS
    ]


def test_strict_and_bfcl_accuracy_counted_by_hand():
    pytest.importorskip("bfcl_eval")
    available, why = evaluate.bfcl_available()
    if not available:
        pytest.skip(why)
    plain = {
        "response": call({"width": 3}),
        "ground_truth": json.dumps(POSSIBLE),
        "data_source": "test",
    }
    result = evaluate.score_rows([*_rows(), plain], name="EGPO")
    assert result["n"] == 6 and result["accuracy"] == pytest.approx(2 / 6)
    assert result["bfcl"]["n"] == 5  # only rows that carry BFCL's entry
    assert result["bfcl"]["accuracy"] == pytest.approx(3 / 5)
    assert result["bfcl"]["by_source"] == {"bfcl_simple_python": {"n": 5, "accuracy": 0.6}}
    for (text, strict, bfcl), row in zip(ROWS, _rows()):
        entry = json.loads(row["bfcl"])
        from entropyrl.rewards.function_calling import bfcl_verdict, compute_score

        assert compute_score(text, POSSIBLE) == float(strict)
        assert bfcl_verdict(text, entry, POSSIBLE, "simple_python") is bfcl
    table = evaluate.comparison_table([("EGPO", result)])
    assert "| **overall** | 6 | 33.33 |" in table
    assert "BFCL accuracy" in table and "| bfcl_simple_python | 5 | 60.00 |" in table


def test_without_the_checker_bfcl_accuracy_is_left_out_with_a_note(monkeypatch, tmp_path):
    monkeypatch.setattr(evaluate, "bfcl_available", lambda: (False, "bfcl-eval missing"))
    result = evaluate.score_rows(_rows())
    assert "bfcl" not in result and "bfcl-eval missing" in result["bfcl_note"]
    assert result["accuracy"] == pytest.approx(1 / 5)
    with pytest.raises(SystemExit, match="bfcl-eval missing"):
        evaluate.score_rows(_rows(), bfcl="require")
    assert "bfcl_note" not in evaluate.score_rows(_rows(), bfcl="off")
    generations = tmp_path / "gen.jsonl"
    generations.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    out = tmp_path / "r.json"
    assert evaluate.main(["score", "--generations", str(generations), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["accuracy"] == pytest.approx(0.2)
    assert "BFCL accuracy" not in evaluate.comparison_table([("A", result)])


@pytest.mark.parametrize(
    "bfcl, match",
    [("{not json", "not JSON"), (json.dumps({"category": "simple_python"}), "'function'")],
)
def test_a_broken_bfcl_entry_is_an_error_naming_the_row(bfcl, match):
    rows = [{"response": "x", "ground_truth": "[]", "bfcl": bfcl}]
    with pytest.raises(ValueError, match=f"row 1.*{match}"):
        evaluate.score_rows(rows)


def test_the_evaluation_follows_the_rows_tool_schema_as_training_does():
    """A schema that requires what the ground truth marks optional: omitting it scores 0 in the
    evaluation as in the training reward (the generations file carries the row's tools)."""
    schema = {
        "name": "get_prime_factors",
        "description": "Prime factors of a number.",
        "parameters": {
            "type": "object",
            "properties": {"number": {"type": "integer"}, "formatted": {"type": "boolean"}},
            "required": ["number", "formatted"],
        },
    }
    truth = json.dumps([{"get_prime_factors": {"number": [450], "formatted": [True, ""]}}])
    omitted = call_named("get_prime_factors", {"number": 450})
    row = {"response": omitted, "ground_truth": truth, "data_source": "test"}
    assert evaluate.score_rows([row], bfcl="off")["accuracy"] == 1.0
    row["tools"] = json.dumps([schema])
    assert evaluate.score_rows([row], bfcl="off")["accuracy"] == 0.0
    row["response"] = call_named("get_prime_factors", {"number": 450, "formatted": True})
    assert evaluate.score_rows([row], bfcl="off")["accuracy"] == 1.0
