"""Function-calling converters: formats, rejects, content-defined split, atomic output."""

from __future__ import annotations

import json
import random

import pyarrow.parquet as pq
import pytest

from entropyrl.data.function_calling import (
    DEFAULT_SYSTEM_PROMPT,
    prepare_function_calling,
    render_tools_system,
    select_and_split,
)
from entropyrl.data.io import InputFileError
from entropyrl.rewards.function_calling import compute_score


def read_rows(path):
    return pq.read_table(path).to_pylist()


def answer_for(ground_truth: str) -> str:
    """A response that should earn 1.0 for this ground truth (first acceptable BFCL value)."""
    calls = []
    for entry in json.loads(ground_truth):
        if set(entry) == {"name", "arguments"}:
            calls.append(entry)
        else:
            ((name, params),) = entry.items()
            arguments = {k: v[0] for k, v in params.items() if v[0] != ""}
            calls.append({"name": name, "arguments": arguments})
    blocks = "".join(f"<tool_call>\n{json.dumps(c)}\n</tool_call>\n" for c in calls)
    return "<think>reasoning</think>\n" + (blocks or "No tool fits.")


def test_qwen25_tool_system_message():
    """The exact text Qwen2.5-Instruct's chat template renders for a system message + tools."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"a": 1}}}]
    expected = (
        "SYS\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "f", "parameters": {"a": 1}}}\n</tools>\n\n'
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )
    assert render_tools_system(tools, "SYS") == expected


def test_xlam(xlam_file, tmp_path):
    out = tmp_path / "out"
    summary = prepare_function_calling(xlam_file, out, fmt="xlam", max_samples=0, test_size=0.1)
    assert summary["rows_read"] == 35 and summary["rows_valid"] == 30
    assert summary["rows_rejected"] == 5 and (summary["train"], summary["test"]) == (27, 3)
    assert summary["warnings"] == []  # all kept: nothing to say
    reasons = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert [r["line"] for r in reasons] == [11, 12, 13, 14, 35]
    text = " | ".join(r["reason"] for r in reasons)
    for fragment in (
        "'tools': invalid JSON",
        "'nope'",
        "query",
        "JSON object",
        "duplicate of line 4",
    ):
        assert fragment in text
    assert summary["first_rejects"][0].startswith(f"{xlam_file}:11: ")
    train = read_rows(out / "train.parquet")
    row = train[0]
    assert row["data_source"] == "function_calling" and row["ability"] == "function_calling"
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert row["prompt"][0]["content"].startswith(DEFAULT_SYSTEM_PROMPT + "\n\n# Tools")
    assert row["reward_model"]["style"] == "rule"
    assert row["extra_info"]["split"] == "train" and row["extra_info"]["source_format"] == "xlam"
    assert json.loads(row["extra_info"]["tools"])[0]["name"] == "get_weather"  # no OpenAI wrapper
    assert [r["extra_info"]["index"] for r in train] == list(range(27))
    all_rows = train + read_rows(out / "test.parquet")
    assert sorted(int(r["extra_info"]["source_id"]) for r in all_rows) == list(range(30))
    for r in all_rows:
        truth = r["reward_model"]["ground_truth"]
        assert compute_score(answer_for(truth), truth) == 1.0


def test_split_ignores_input_order_and_depends_on_seed(tmp_path, writers):
    rows = writers.xlam_rows(40)
    shuffled = rows[:]
    random.Random(1).shuffle(shuffled)
    a = writers.lines(tmp_path / "a.jsonl", rows)
    b = writers.lines(tmp_path / "b.jsonl", shuffled)
    for path, out in ((a, "oa"), (b, "ob")):
        prepare_function_calling(path, tmp_path / out, fmt="xlam", max_samples=20, test_size=0.25)
    for split in ("train", "test"):
        assert read_rows(tmp_path / "oa" / f"{split}.parquet") == read_rows(
            tmp_path / "ob" / f"{split}.parquet"
        )
    assert len(read_rows(tmp_path / "oa" / "test.parquet")) == 5
    prepare_function_calling(a, tmp_path / "oc", fmt="xlam", max_samples=20, test_size=0.25, seed=7)

    def ids(folder):
        return {
            r["extra_info"]["source_id"] for r in read_rows(tmp_path / folder / "train.parquet")
        }

    assert ids("oa") != ids("oc")


def test_select_and_split_counts():
    hashes = list(range(1000, 1100))
    train, test = select_and_split(hashes, max_samples=50, test_size=0.05, seed=42)
    assert (len(train), len(test)) == (47, 3) and not set(train) & set(test)
    train2, test2 = select_and_split(hashes[::-1], max_samples=50, test_size=0.05, seed=42)
    assert [hashes[::-1][i] for i in train2] == [hashes[i] for i in train]
    assert [hashes[::-1][i] for i in test2] == [hashes[i] for i in test]
    train, test = select_and_split(hashes, max_samples=None, test_size=10, seed=42)
    assert (len(train), len(test)) == (90, 10)


def test_messages(messages_file, tmp_path):
    out = tmp_path / "out"
    summary = prepare_function_calling(
        messages_file, out, fmt="messages", max_samples=0, test_size=0
    )
    assert summary["rows_valid"] == 13 and summary["rows_rejected"] == 1
    assert "no assistant turn" in summary["first_rejects"][0]
    assert not (out / "test.parquet").exists()
    rows = read_rows(out / "train.parquet")
    multi = next(r for r in rows if len(r["prompt"]) > 2)
    assert [m["role"] for m in multi["prompt"]] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert multi["prompt"][0]["content"].startswith(
        "You answer briefly.\n\n" + DEFAULT_SYSTEM_PROMPT
    )
    assert multi["prompt"][2]["content"] == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    )
    assert multi["prompt"][3]["content"] == '<tool_response>\n{"temp": 3}\n</tool_response>'
    no_call = [r for r in rows if r["reward_model"]["ground_truth"] == "[]"]
    assert len(no_call) == 1
    for r in rows:
        truth = r["reward_model"]["ground_truth"]
        assert compute_score(answer_for(truth), truth) == 1.0


def test_bfcl(bfcl_dir, tmp_path):
    summary = prepare_function_calling(
        bfcl_dir / "BFCL_v4_simple.json", tmp_path / "s", fmt="bfcl", test_size=0
    )
    assert summary["rows_valid"] == 8 and "no possible answer" in summary["first_rejects"][0]
    rows = read_rows(tmp_path / "s" / "train.parquet")
    tool = json.loads(rows[0]["extra_info"]["tools"])[0]
    assert tool["parameters"]["type"] == "object"
    assert tool["parameters"]["properties"]["height"]["type"] == "number"
    for r in rows:
        truth = r["reward_model"]["ground_truth"]
        assert compute_score(answer_for(truth), truth) == 1.0
    summary = prepare_function_calling(
        bfcl_dir / "BFCL_v4_irrelevance.json", tmp_path / "i", fmt="bfcl", test_size=0
    )
    assert summary["rows_valid"] == 4
    rows = read_rows(tmp_path / "i" / "train.parquet")
    assert all(r["reward_model"]["ground_truth"] == "[]" for r in rows)
    with pytest.raises(InputFileError, match="possible-answer"):
        (bfcl_dir / "BFCL_v4_other.json").write_text((bfcl_dir / "BFCL_v4_simple.json").read_text())
        prepare_function_calling(bfcl_dir / "BFCL_v4_other.json", tmp_path / "o", fmt="bfcl")


def test_malformed_and_missing_input(tmp_path):
    with pytest.raises(InputFileError, match="file not found"):
        prepare_function_calling(tmp_path / "nope.jsonl", tmp_path / "out", fmt="xlam")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\n\n{"id": 2,\n')
    with pytest.raises(InputFileError, match=r"bad\.jsonl, line 3"):
        prepare_function_calling(bad, tmp_path / "out", fmt="xlam")
    array = tmp_path / "bad.json"
    array.write_text('[{"id": 1},\n {"id": 2} oops]')
    with pytest.raises(InputFileError, match=r"bad\.json, line 2"):
        prepare_function_calling(array, tmp_path / "out", fmt="xlam")
    assert not (tmp_path / "out").exists()


def test_outputs_are_atomic(xlam_file, tmp_path, monkeypatch):
    out = tmp_path / "out"
    prepare_function_calling(xlam_file, out, fmt="xlam", max_samples=10, test_size=2)
    before = (out / "train.parquet").read_bytes()

    def broken(table, where, **kwargs):
        with open(where, "wb") as handle:
            handle.write(b"PAR1 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", broken)
    with pytest.raises(OSError, match="disk full"):
        prepare_function_calling(xlam_file, out, fmt="xlam", max_samples=20, test_size=2)
    assert (out / "train.parquet").read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == [
        "rejects.jsonl",
        "test.parquet",
        "train.parquet",
    ]


def test_verl_reads_the_parquet(xlam_file, tmp_path):
    """verl's own RLHFDataset loads the rows with the project's offline Qwen tokenizer."""
    rl_dataset = pytest.importorskip("verl.utils.dataset.rl_dataset")
    tokenizer_module = pytest.importorskip("entropyrl.rig.tokenizer")
    from omegaconf import OmegaConf

    prepare_function_calling(xlam_file, tmp_path / "out", fmt="xlam", max_samples=6, test_size=0)
    tokenizer = tokenizer_module.build_qwen_tokenizer(8192)
    config = OmegaConf.create(
        {
            "max_prompt_length": 4096,
            "filter_overlong_prompts": True,
            "cache_dir": str(tmp_path / "c"),
        }
    )
    dataset = rl_dataset.RLHFDataset(
        data_files=[str(tmp_path / "out" / "train.parquet")], tokenizer=tokenizer, config=config
    )
    assert len(dataset) == 6
    row = dataset[0]
    prompt = tokenizer.apply_chat_template(
        row["raw_prompt"], tokenize=False, add_generation_prompt=True
    )
    assert prompt.startswith("<|im_start|>system\n" + DEFAULT_SYSTEM_PROMPT + "\n\n# Tools\n")
    assert "</tool_call><|im_end|>\n<|im_start|>user\n" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_bfcl_rows_the_reward_cannot_score_are_rejected_with_a_reason(bfcl_dir, tmp_path, writers):
    """An empty acceptable list and a parameter outside the schema are data errors; a required
    parameter loses its "" (BFCL rejects a missing required parameter); good rows are kept."""
    function = {
        "name": "area",
        "parameters": {
            "type": "dict",
            "properties": {"base": {"type": "integer"}, "unit": {"type": "string"}},
            "required": ["base"],
        },
    }
    truths = {
        "simple_0": [{"area": {"base": [3], "unit": ["cm", ""]}}],  # good
        "simple_1": [{"area": {"base": [], "unit": ["cm"]}}],  # no acceptable value
        "simple_2": [{"area": {"base": [3], "color": ["red"]}}],  # not in the schema
        "simple_3": [{"area": {"base": [4, ""], "unit": [""]}}],  # required "" dropped
        "simple_4": [{"area": {"base": [""]}}],  # required, may only be omitted
        "simple_5": [{"volume": {"base": [3]}}],  # unknown function
    }
    questions = [
        {
            "id": key,
            "question": [[{"role": "user", "content": f"Question {key}?"}]],
            "function": [function],
        }
        for key in truths
    ]
    answers = [{"id": key, "ground_truth": truth} for key, truth in truths.items()]
    root = tmp_path / "bfcl"
    writers.lines(root / "BFCL_v4_simple_python.json", questions)
    writers.lines(root / "possible_answer" / "BFCL_v4_simple_python.json", answers)
    out = tmp_path / "out"
    summary = prepare_function_calling(
        root / "BFCL_v4_simple_python.json", out, fmt="bfcl", test_size=0
    )
    assert (summary["rows_valid"], summary["rows_rejected"]) == (2, 4)
    reasons = {
        r["line"]: r["reason"]
        for r in map(json.loads, (out / "rejects.jsonl").read_text().splitlines())
    }
    assert "'base' has no acceptable value ([])" in reasons[2]
    assert "'color' is not in the function's schema" in reasons[3]
    assert "required 'area' parameter 'base' may only be omitted" in reasons[5]
    assert "'volume', which is not among the tools" in reasons[6]
    rows = {r["extra_info"]["source_id"]: r for r in read_rows(out / "train.parquet")}
    assert set(rows) == {"simple_0", "simple_3"}
    truth = rows["simple_3"]["reward_model"]["ground_truth"]
    assert json.loads(truth) == [{"area": {"base": [4], "unit": [""]}}]
    assert compute_score(answer_for(truth), truth) == 1.0
    omitted = (
        "<think>r</think>\n<tool_call>\n"
        + json.dumps({"name": "area", "arguments": {}})
        + "\n</tool_call>"
    )
    assert compute_score(omitted, truth) == 0.0
    # BFCL's own entry travels with the row, unmodified, for BFCL's checker.
    entry = json.loads(rows["simple_3"]["extra_info"]["bfcl"])
    assert entry == {
        "id": "simple_3",
        "category": "simple_python",
        "function": [function],
        "possible_answer": truths["simple_3"],
    }


@pytest.mark.parametrize("fmt", ["xlam", "messages"])
def test_answers_with_parameters_outside_the_schema_are_rejected(fmt, tmp_path, writers):
    if fmt == "xlam":
        tool = {
            "name": "get_weather",
            "parameters": {"city": {"type": "str"}, "type": {"type": "str"}},
        }
        rows = [
            {
                "id": i,
                "query": f"Weather {i}?",
                "tools": json.dumps([tool]),
                "answers": json.dumps([{"name": "get_weather", "arguments": arguments}]),
            }
            for i, arguments in enumerate([{"city": "Oslo", "type": "now"}, {"town": "Oslo"}])
        ]
    else:
        tool = {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
        rows = [
            {
                "messages": [
                    {"role": "user", "content": f"Weather {i}?"},
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": json.dumps(a)},
                            }
                        ],
                    },
                ],
                "tools": [tool],
            }
            for i, a in enumerate([{"city": "Oslo"}, {"town": "Oslo"}])
        ]
    path = writers.lines(tmp_path / "in.jsonl", rows)
    summary = prepare_function_calling(path, tmp_path / "out", fmt=fmt, test_size=0)
    assert (summary["rows_valid"], summary["rows_rejected"]) == (1, 1)
    assert "parameter(s) ['town'] that its schema does not define" in summary["first_rejects"][0]


@pytest.mark.parametrize(
    "name, entry_id, category",
    [
        ("BFCL_v4_live_simple.json", "live_simple_165-98-0", "live_simple"),
        ("BFCL_v4_simple_python.json", "simple_python_96", "simple_python"),
        ("data.json", "live_parallel_multiple_3-2-1", "live_parallel_multiple"),
        ("data.json", "multiple_119", "multiple"),
    ],
)
def test_bfcl_category(name, entry_id, category):
    from entropyrl.data.function_calling import bfcl_category

    assert bfcl_category(name, entry_id) == category


def test_a_sample_says_so(xlam_file, tmp_path, capsys):
    """`prepare fc` keeps --max-samples examples (the seed experiment's 1000 by default) and says,
    on stderr, how many of how many it kept and how to keep all."""
    from entropyrl.cli import main

    assert (
        main(
            [
                "prepare",
                "fc",
                "--format",
                "xlam",
                "--input",
                str(xlam_file),
                "--out",
                str(tmp_path / "o"),
                "--max-samples",
                "10",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert (
        "warning: sampled: kept 10 of 30 valid examples (--max-samples 10, those with the "
        "smallest hash salted with seed 42); --max-samples 0 keeps them all"
    ) in err
