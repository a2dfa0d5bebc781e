"""Function-calling data (xLAM, OpenAI-style messages, BFCL) -> verl RLHF parquet.

Every source becomes the same example: chat messages up to the target turn, the tool schemas,
and the expected calls. Prompts carry the tools in the system message exactly as Qwen2.5's chat
template renders them (``# Tools ... <tools></tools>`` plus the ``<tool_call>`` instructions), so
any chat template (Qwen2-VL's has no tool support) produces the prompt a Qwen2.5 model expects,
and verl needs no ``tools=`` argument.

Rows: ``data_source`` (default "function_calling"), ``prompt``, ``ability`` "function_calling",
``reward_model = {"style": "rule", "ground_truth": <JSON string>}`` (``[{"name", "arguments"}]``,
or BFCL possible answers ``[{"func": {"param": [values...]}}]``, ``[]`` = no call expected), and
``extra_info = {"split", "index", "source_id", "source_format", "tools": <JSON string>,
"example_hash"}``, plus for BFCL rows ``"bfcl"``: the JSON string of ``{"id", "category",
"function", "possible_answer"}`` as BFCL ships them (its own schema types and its unmodified
possible answer), which ``bfcl_verdict`` needs to give BFCL's own verdict. ``tools`` is the list
of function definitions ``{"name", "description", "parameters": {"type", "properties",
"required"}}`` (OpenAI's ``{"type": "function", "function": ...}`` wrapper removed; for BFCL in
JSON Schema types, xLAM's flat parameter maps as xLAM wrote them): verl hands ``extra_info`` to
the reward, which follows the schema's ``required`` and declared types from it. Ground truth and
tools are JSON strings because their nested shapes differ from row to row and parquet needs one
type per column: as a struct, pyarrow would merge every row's schemas into one type (each
function gaining every parameter name any row has, as None) and hand lists back as numpy
arrays. ``compute_score`` accepts the string (and the parsed forms).

Rows the reward could never score fairly are rejected with the reason: a ground-truth call with
a parameter its tool's schema does not define, and a BFCL parameter with no acceptable value
(``[]``). Where a BFCL schema marks a parameter required, ``""`` ("may be omitted") is dropped
from its acceptable values, as BFCL's checker rejects a missing required parameter.

Selection and split follow the seed experiment (max_samples 1000, test_size 0.05, seed 42) but
depend only on each example's content: the sha1 of its canonical JSON, salted with the seed, picks
the sample and then the test rows, so shuffling the input file changes nothing.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from entropyrl.core.files import stable_hash, write_parquet
from entropyrl.data.io import InputFileError, RejectLog, progress, read_records
from entropyrl.rewards.function_calling import function_schema

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "FORMATS",
    "FunctionCallingExample",
    "bfcl_category",
    "example_from_bfcl",
    "example_from_messages",
    "example_from_xlam",
    "prepare_function_calling",
    "render_tools_system",
    "select_and_split",
]

FORMATS = ("xlam", "messages", "bfcl")

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant. First think about the request inside <think> </think> tags. "
    "Then call the functions you need, each call in its own <tool_call> </tool_call> block, "
    "or, if none of the functions fits the request, answer in plain text without a tool call."
)

# Qwen2.5's chat template, tool branch (tokenizer_config.json of Qwen/Qwen2.5-*-Instruct): the
# system content, then this header, one ``tool | tojson`` per line, then the footer.
_TOOLS_HEADER = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\n</tool_call>'
)

# BFCL's schema types -> JSON Schema (as BFCL itself maps them for OpenAI-style models).
_BFCL_TYPES = {
    "dict": "object",
    "float": "number",
    "double": "number",
    "tuple": "array",
    "list": "array",
    "any": "string",
    "bool": "boolean",
    "long": "integer",
    "short": "integer",
    "byte": "integer",
    "char": "string",
    "String": "string",
    "Any": "string",
    "HashMap": "object",
    "Hashtable": "object",
    "ArrayList": "array",
    "Array": "array",
    "Queue": "array",
    "Stack": "array",
    "Bigint": "integer",
}


class RowError(ValueError):
    """A row that cannot become an example; the message names the field."""


@dataclass(frozen=True)
class FunctionCallingExample:
    """One prompt: ``messages`` before the target turn, ``tools`` (OpenAI format), answer."""

    source_id: str
    messages: list[dict[str, str]]
    tools: list[dict[str, Any]]
    answer: list[dict[str, Any]]
    # BFCL's own entry (id, category, function, possible_answer) for BFCL's checker; not content.
    bfcl: dict[str, Any] | None = field(default=None, compare=False)

    def content_hash(self) -> int:
        """Order-independent identity of the example (its id is not part of it)."""
        return stable_hash(self.messages, self.tools, self.answer)


# ---------------------------------------------------------------------------- rendering
def render_tools_system(tools: Sequence[Mapping[str, Any]], system_prompt: str) -> str:
    """System content with the tools exactly as Qwen2.5's template renders them."""
    lines = [json.dumps(tool, ensure_ascii=False) for tool in tools]
    return system_prompt + _TOOLS_HEADER + "".join("\n" + line for line in lines) + _TOOLS_FOOTER


def _render_call(call: Mapping[str, Any]) -> str:
    # Qwen2.5 renders an assistant's earlier calls like this in the conversation history.
    arguments = json.dumps(call["arguments"], ensure_ascii=False)
    return f'<tool_call>\n{{"name": "{call["name"]}", "arguments": {arguments}}}\n</tool_call>'


# ---------------------------------------------------------------------------- field helpers
def _json_field(record: Mapping[str, Any], key: str) -> Any:
    if key not in record:
        raise RowError(f"missing field {key!r}")
    value = record[key]
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as error:
            raise RowError(f"field {key!r}: invalid JSON ({error.msg})") from None
    return value


def _as_openai_tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, Mapping):
        raise RowError(f"{where}: a tool must be an object")
    function = tool.get("function") if tool.get("type") == "function" else tool
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise RowError(f"{where}: a tool needs a string 'name'")
    return {"type": "function", "function": dict(function)}


def _tool_list(value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise RowError(f"{where}: must be a non-empty list of tools")
    tools = [_as_openai_tool(tool, f"{where}[{i}]") for i, tool in enumerate(value)]
    names = [tool["function"]["name"] for tool in tools]
    if len(set(names)) != len(names):
        raise RowError(f"{where}: duplicated tool names")
    return tools


def _call(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise RowError(f"{where}: a call must be an object")
    if value.get("type") == "function" and isinstance(value.get("function"), Mapping):
        value = value["function"]  # OpenAI tool_calls entry
    name, arguments = value.get("name"), value.get("arguments", {})
    if not isinstance(name, str) or not name:
        raise RowError(f"{where}.name: must be a non-empty string")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as error:
            raise RowError(f"{where}.arguments: invalid JSON ({error.msg})") from None
    if not isinstance(arguments, dict):
        raise RowError(f"{where}.arguments: must be an object")
    return {"name": name, "arguments": arguments}


def _schema_parameters(function: Mapping[str, Any]) -> set[str] | None:
    """Parameter names a tool schema defines; None when it does not say (no check then).

    Read as the reward reads them (JSON Schema ``properties`` or xLAM's flat map).
    """
    declared = function_schema(function).parameters
    return None if declared is None else set(declared)


def _check_known(calls: list[dict[str, Any]], tools: list[dict[str, Any]]) -> None:
    """Every call names a tool, and every argument is a parameter of that tool's schema."""
    schemas = {tool["function"]["name"]: tool["function"] for tool in tools}
    for call in calls:
        if call["name"] not in schemas:
            raise RowError(f"answer calls {call['name']!r}, which is not among the tools")
        known = _schema_parameters(schemas[call["name"]])
        unknown = sorted(set(call.get("arguments", {})) - known) if known is not None else []
        if unknown:
            raise RowError(
                f"answer gives {call['name']!r} parameter(s) {unknown} that its schema does "
                "not define"
            )


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise RowError(f"{where}: must be a non-empty string")
    return value


# ---------------------------------------------------------------------------- sources
def example_from_xlam(record: Mapping[str, Any]) -> FunctionCallingExample:
    """xLAM function-calling-60k row: ``{"id", "query", "tools": json, "answers": json}``.

    xLAM's tool parameters are a flat ``{param: {type, description, default}}`` map, not JSON
    Schema; they are kept as the data set wrote them (wrapped in the OpenAI tool envelope).
    """
    query = _text(record.get("query"), "query")
    tools = _tool_list(_json_field(record, "tools"), "tools")
    answers = _json_field(record, "answers")
    if not isinstance(answers, list):
        raise RowError("answers: must be a list of calls")
    calls = [_call(answer, f"answers[{i}]") for i, answer in enumerate(answers)]
    _check_known(calls, tools)
    return FunctionCallingExample(
        source_id=str(record.get("id", "")),
        messages=[{"role": "user", "content": query}],
        tools=tools,
        answer=calls,
    )


def example_from_messages(record: Mapping[str, Any]) -> FunctionCallingExample:
    """OpenAI-style ``{"messages": [...], "tools": [...]}``; the last assistant turn is the target.

    Earlier assistant calls and tool results are flattened into text the way Qwen2.5's template
    renders them (``<tool_call>`` in the assistant turn, ``<tool_response>`` in a user turn).
    A target without ``tool_calls`` means no call is expected.
    """
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RowError("messages: must be a non-empty list")
    tools = _tool_list(_json_field(record, "tools"), "tools")
    target_index = max(
        (
            i
            for i, m in enumerate(messages)
            if isinstance(m, Mapping) and m.get("role") == "assistant"
        ),
        default=-1,
    )
    if target_index < 0:
        raise RowError("messages: no assistant turn to learn from")
    target = messages[target_index]
    calls = [
        _call(call, f"messages[{target_index}].tool_calls[{i}]")
        for i, call in enumerate(target.get("tool_calls") or [])
    ]
    _check_known(calls, tools)
    history: list[dict[str, str]] = []
    for i, message in enumerate(messages[:target_index]):
        if not isinstance(message, Mapping):
            raise RowError(f"messages[{i}]: must be an object")
        role, content = message.get("role"), message.get("content") or ""
        if not isinstance(content, str):
            raise RowError(f"messages[{i}].content: only text content is supported")
        if role in ("system", "user"):
            history.append({"role": role, "content": content})
        elif role == "assistant":
            parts = [content] if content else []
            parts += [
                _render_call(_call(call, f"messages[{i}].tool_calls[{j}]"))
                for j, call in enumerate(message.get("tool_calls") or [])
            ]
            history.append({"role": "assistant", "content": "\n".join(parts)})
        elif role == "tool":
            block = f"<tool_response>\n{content}\n</tool_response>"
            if history and history[-1]["role"] == "user" and history[-1].get("_tool"):
                history[-1]["content"] += "\n" + block
            else:
                history.append({"role": "user", "content": block, "_tool": "1"})
        else:
            raise RowError(f"messages[{i}].role: unknown role {role!r}")
    for message in history:
        message.pop("_tool", None)
    if not any(message["role"] == "user" for message in history):
        raise RowError("messages: no user turn before the target")
    return FunctionCallingExample(
        source_id=str(record.get("id", "")), messages=history, tools=tools, answer=calls
    )


def _bfcl_schema(value: Any) -> Any:
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if key == "type" and isinstance(item, str):
                out[key] = _BFCL_TYPES.get(item, item)
            else:
                out[key] = _bfcl_schema(item)
        return out
    if isinstance(value, list):
        return [_bfcl_schema(item) for item in value]
    return value


def _bfcl_possible_answer(
    possible_answer: Any, functions: list[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The answer to train on: checked against the schemas, "" dropped for required params."""
    if not isinstance(possible_answer, list) or not all(
        isinstance(entry, Mapping)
        and len(entry) == 1
        and isinstance(next(iter(entry.values())), Mapping)
        for entry in possible_answer
    ):
        raise RowError("ground_truth: must be a list of {function: {param: [values]}}")
    schemas = {f.get("name"): f for f in functions if isinstance(f, Mapping)}
    answer = []
    for entry in possible_answer:
        ((name, params),) = entry.items()
        if name not in schemas:
            raise RowError(f"answer calls {name!r}, which is not among the tools")
        schema = schemas[name].get("parameters")
        schema = schema if isinstance(schema, Mapping) else {}
        properties = schema.get("properties")
        known = set(properties) if isinstance(properties, Mapping) else None
        required = set(schema.get("required") or ())
        kept = {}
        for param, values in params.items():
            if known is not None and param not in known:
                raise RowError(
                    f"ground_truth: {name!r} parameter {param!r} is not in the function's schema"
                )
            if not isinstance(values, list) or not values:
                raise RowError(
                    f"ground_truth: {name!r} parameter {param!r} has no acceptable value "
                    f"({json.dumps(values)})"
                )
            if param in required:
                values = [v for v in values if v != ""]
                if not values:
                    raise RowError(
                        f"ground_truth: required {name!r} parameter {param!r} may only be omitted"
                    )
            kept[param] = values
        answer.append({name: kept})
    return answer


_BFCL_FILE = re.compile(r"^BFCL_v\d+_(?P<category>.+)\.json$")


def bfcl_category(file_name: str, entry_id: str = "") -> str:
    """BFCL category of a data file (``BFCL_v4_live_simple.json``) or else of an entry id."""
    match = _BFCL_FILE.match(file_name)
    if match:
        return match["category"]
    return re.sub(r"_\d+(-\d+)*$", "", entry_id)


def example_from_bfcl(
    record: Mapping[str, Any], possible_answer: list[Any] | None, *, category: str = ""
) -> FunctionCallingExample:
    """BFCL question line plus its possible answer (None for irrelevance: no call expected)."""
    question = record.get("question")
    if not isinstance(question, list) or not question:
        raise RowError("question: must be a non-empty list of turns")
    if len(question) != 1:
        raise RowError(
            f"question: {len(question)} turns; only single-turn categories are supported"
        )
    turn = question[0]
    if not isinstance(turn, list) or not turn:
        raise RowError("question[0]: must be a non-empty list of messages")
    messages = []
    for i, message in enumerate(turn):
        if not isinstance(message, Mapping) or message.get("role") not in ("system", "user"):
            raise RowError(f"question[0][{i}]: expected a system or user message")
        messages.append(
            {
                "role": message["role"],
                "content": _text(message.get("content"), f"question[0][{i}].content"),
            }
        )
    functions = record.get("function")
    if not isinstance(functions, list) or not functions:
        raise RowError("function: must be a non-empty list of schemas")
    tools = _tool_list([_bfcl_schema(function) for function in functions], "function")
    answer: list[Any] = []
    if possible_answer is not None:
        answer = _bfcl_possible_answer(possible_answer, functions)
    source_id = str(record.get("id", ""))
    return FunctionCallingExample(
        source_id=source_id,
        messages=messages,
        tools=tools,
        answer=answer,
        bfcl={
            "id": source_id,
            "category": category or bfcl_category("", source_id),
            "function": functions,
            "possible_answer": possible_answer,
        },
    )


def _bfcl_answers(input_path: Path, answers_path: Path | None) -> dict[str, Any] | None:
    """id -> possible answer; None for irrelevance categories, which have no answer file."""
    if answers_path is None:
        sibling = input_path.parent / "possible_answer" / input_path.name
        if sibling.is_file():
            answers_path = sibling
        elif "irrelevance" in input_path.name:
            return None
        else:
            raise InputFileError(
                f"{input_path}: no possible-answer file; pass answers=... (looked for {sibling})"
            )
    answers = {}
    for line, record in read_records(answers_path):
        if not isinstance(record, Mapping) or "id" not in record or "ground_truth" not in record:
            raise InputFileError(f"{answers_path}, line {line}: expected {{'id', 'ground_truth'}}")
        answers[str(record["id"])] = record["ground_truth"]
    return answers


# ---------------------------------------------------------------------------- selection
def select_and_split(
    hashes: Sequence[int], *, max_samples: int | None, test_size: float, seed: int
) -> tuple[list[int], list[int]]:
    """Indices (into ``hashes``) of the train and test rows, in a content-defined order.

    ``max_samples`` rows (all when None or <= 0) are those with the smallest seed-salted hash;
    the test part is ``ceil(test_size * n)`` of them (``test_size`` < 1) or ``int(test_size)``
    rows, again by a seed-salted hash. Input order never matters.
    """
    order = sorted(range(len(hashes)), key=lambda i: stable_hash("sample", seed, hashes[i]))
    if max_samples is not None and max_samples > 0:
        order = order[:max_samples]
    n = len(order)
    if test_size < 0:
        raise ValueError(f"test_size must be >= 0, got {test_size}")
    n_test = math.ceil(test_size * n) if test_size < 1 else int(test_size)
    n_test = min(n_test, n)
    by_split_hash = sorted(order, key=lambda i: stable_hash("test", seed, hashes[i]))
    test = set(by_split_hash[:n_test])
    return [i for i in order if i not in test], [i for i in order if i in test]


# ---------------------------------------------------------------------------- converter
def _row(
    example: FunctionCallingExample,
    *,
    split: str,
    index: int,
    fmt: str,
    system_prompt: str,
    data_source: str,
    content_hash: int,
) -> dict[str, Any]:
    messages = [dict(message) for message in example.messages]
    own_system = ""
    if messages and messages[0]["role"] == "system":
        own_system = messages.pop(0)["content"].rstrip() + "\n\n"
    system = {
        "role": "system",
        "content": render_tools_system(example.tools, own_system + system_prompt),
    }
    extra_info = {
        "split": split,
        "index": index,
        "source_id": example.source_id,
        "source_format": fmt,
        "tools": json.dumps([tool["function"] for tool in example.tools], ensure_ascii=False),
        "example_hash": f"{content_hash:040x}",
    }
    if example.bfcl is not None:
        extra_info["bfcl"] = json.dumps(example.bfcl, ensure_ascii=False)
    return {
        "data_source": data_source,
        "prompt": [system, *messages],
        "ability": "function_calling",
        "reward_model": {
            "style": "rule",
            "ground_truth": json.dumps(example.answer, ensure_ascii=False),
        },
        "extra_info": extra_info,
    }


def prepare_function_calling(
    input_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    fmt: str,
    answers_path: str | os.PathLike[str] | None = None,
    max_samples: int | None = 1000,
    test_size: float = 0.05,
    seed: int = 42,
    system_prompt: str = DEFAULT_SYSTEM_PROMPT,
    data_source: str = "function_calling",
) -> dict[str, Any]:
    """Convert one input file into ``out_dir/train.parquet`` and ``out_dir/test.parquet``.

    Rows that cannot be converted, and exact duplicates, are listed in ``out_dir/rejects.jsonl``
    and in the returned summary; the good rows are kept. Raises InputFileError when the input
    file is missing or not JSON / JSON lines.
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    input_path, out_dir = Path(input_path), Path(out_dir)
    records = read_records(input_path)
    answers = None
    if fmt == "bfcl":
        answers = _bfcl_answers(input_path, Path(answers_path) if answers_path else None)
    rejects = RejectLog(source=str(input_path))
    examples: list[FunctionCallingExample] = []
    hashes: list[int] = []
    seen: dict[int, int] = {}
    for line, record in progress(records, desc=f"reading {input_path.name}"):
        try:
            if not isinstance(record, Mapping):
                raise RowError(f"expected a JSON object, got {type(record).__name__}")
            if fmt == "xlam":
                example = example_from_xlam(record)
            elif fmt == "messages":
                example = example_from_messages(record)
            else:
                row_id = str(record.get("id", ""))
                if answers is not None and row_id not in answers:
                    raise RowError(f"id {row_id!r} has no possible answer")
                example = example_from_bfcl(
                    record,
                    None if answers is None else answers[row_id],
                    category=bfcl_category(input_path.name, row_id),
                )
        except RowError as error:
            rejects.add(line, str(error))
            continue
        content_hash = example.content_hash()
        if content_hash in seen:
            rejects.add(line, f"duplicate of line {seen[content_hash]}")
            continue
        seen[content_hash] = line
        examples.append(example)
        hashes.append(content_hash)
    train, test = select_and_split(hashes, max_samples=max_samples, test_size=test_size, seed=seed)
    outputs = {}
    for split, indices in (("train", train), ("test", test)):
        rows = [
            _row(
                examples[i],
                split=split,
                index=position,
                fmt=fmt,
                system_prompt=system_prompt,
                data_source=data_source,
                content_hash=hashes[i],
            )
            for position, i in enumerate(indices)
        ]
        path = out_dir / f"{split}.parquet"
        if rows:
            write_parquet(rows, path)
            outputs[split] = str(path)
        else:
            path.unlink(missing_ok=True)  # never leave a stale split from an earlier run
    rejects_file = rejects.write(out_dir / "rejects.jsonl")
    warnings = []
    if len(train) + len(test) < len(examples):
        warnings.append(
            f"sampled: kept {len(train) + len(test)} of {len(examples)} valid examples "
            f"(--max-samples {max_samples}, those with the smallest hash salted with seed {seed}); "
            "--max-samples 0 keeps them all"
        )
    return {
        "format": fmt,
        "input": str(input_path),
        "rows_read": len(records),
        "rows_valid": len(examples),
        "rows_rejected": len(rejects),
        "train": len(train),
        "test": len(test),
        "outputs": outputs,
        "rejects_file": str(rejects_file) if rejects_file else None,
        "first_rejects": rejects.first(20),
        "warnings": warnings,
    }
