"""`bfcl_verdict` against BFCL's own evaluation pipeline, on BFCL's shipped data.

Reference: BFCL's `eval_runner` file runners (`ast_file_runner`, `relevance_file_runner`) with
BFCL's registered Qwen FC handler, fed the model results BFCL's inference step stores for a raw
generation (its `_parse_query_response_prompting`), on the entries BFCL's loaders return. The
candidates are the correct answer of each sampled entry and mutations of it (wrong value, type,
name, count, layout). Also checked: the strict reward never accepts what BFCL rejects on the
Python categories, and every sampled Python entry is winnable under both.

Skips when bfcl-eval is not installed (optional extra ``bfcl``, see docs/install.md), and fails
instead in CI (CI=true). `benchmarks/bfcl_agreement.py` runs the looser-than-BFCL count over
every Python AST entry with more mutations (numbers at each depth, omitted parameters).
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from entropyrl.rewards.function_calling import BFCL_QWEN_FC_MODEL, bfcl_verdict, compute_score

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
if IN_CI:
    bfcl_eval = importlib.import_module("bfcl_eval")  # in CI a missing checker is a failure
else:
    bfcl_eval = pytest.importorskip("bfcl_eval")
try:
    from bfcl_eval.eval_checker import eval_runner
    from bfcl_eval.utils import load_dataset_entry, load_ground_truth_entry
except ImportError as error:  # bfcl-eval without the packages its checker imports
    if IN_CI:
        raise
    pytest.skip(f"bfcl-eval's checker is not importable: {error}", allow_module_level=True)

AST_CATEGORIES = (
    "simple_python",
    "multiple",
    "parallel",
    "parallel_multiple",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
    "simple_java",
    "simple_javascript",
)
RELEVANCE_CATEGORIES = ("irrelevance", "live_irrelevance", "live_relevance")
PER_CATEGORY = 6
# BFCL entries whose list-of-dict parameter the strict reward used to reject when correct.
LIST_OF_DICT = ("simple_python_96", "multiple_119", "live_simple_165-98-0")
DATA = Path(bfcl_eval.__file__).parent / "data"
MODEL_DIR_NAME = BFCL_QWEN_FC_MODEL.replace("/", "_")


def _raw_lines(path: Path) -> list[dict]:
    """The entries as the project's converter reads them (the JSON lines BFCL ships)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _is_source_language(category: str) -> bool:
    return "java" in category  # java and javascript: BFCL checks source-code strings


def _value(value, category: str):
    """A value as the model should write it: JSON for Python, source-code text for Java/JS."""
    if not _is_source_language(category) or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def _pattern(item: dict) -> dict:
    """A dict value from its BFCL pattern: first acceptable value per key, "" keys omitted."""
    out = {}
    for key, values in item.items():
        chosen = next((v for v in values if v != ""), None)
        if chosen is not None:
            out[key] = chosen
    return out


def _correct_calls(possible_answer: list, category: str) -> list[dict]:
    calls = []
    for entry in possible_answer:
        ((name, params),) = entry.items()
        arguments = {}
        for param, values in params.items():
            chosen = next((v for v in values if v != ""), None)
            if chosen is None:
                continue  # optional, omitted
            if isinstance(chosen, list) and chosen and all(isinstance(x, dict) for x in chosen):
                chosen = [_pattern(item) for item in chosen]
            elif isinstance(chosen, dict):
                chosen = _pattern(chosen)
            arguments[param] = _value(chosen, category)
        calls.append({"name": name, "arguments": arguments})
    return calls


def _render(calls: list[dict], *, think: bool = True, inline: bool = False) -> str:
    blocks = []
    for call in calls:
        body = json.dumps(call, ensure_ascii=False)
        blocks.append(
            f"<tool_call>{body}</tool_call>" if inline else f"<tool_call>\n{body}\n</tool_call>"
        )
    text = "\n".join(blocks) if blocks else "No function fits this request."
    return ("<think>\nThe user asks for this.\n</think>\n\n" if think else "") + text


def _mutations(calls: list[dict], functions: list[dict], rng: random.Random) -> dict[str, str]:
    """Correct answer plus the usual ways a policy gets it wrong (or differently right)."""
    out = {"correct": _render(calls), "correct, no think": _render(calls, think=False)}
    out["inline layout"] = _render(calls, inline=True)
    out["plain text"] = _render([])
    if not calls:
        return out
    index = rng.randrange(len(calls))
    arguments = calls[index]["arguments"]

    def variant(change) -> list[dict]:
        changed = copy.deepcopy(calls)
        change(changed[index])
        return changed

    out["wrong name"] = _render(variant(lambda c: c.update(name=c["name"] + "_x")))
    out["extra parameter"] = _render(variant(lambda c: c["arguments"].update(zz_extra=1)))
    out["no arguments"] = _render(variant(lambda c: c.update(arguments={})))
    if len(calls) > 1:
        out["dropped call"] = _render(calls[:-1])
        out["reversed calls"] = _render(calls[::-1])
    out["duplicated call"] = _render([*calls, calls[index]])
    if arguments:
        key = rng.choice(sorted(arguments))
        value = arguments[key]
        out["dropped parameter"] = _render(variant(lambda c: c["arguments"].pop(key)))
        if isinstance(value, bool):
            wrong = not value
        elif isinstance(value, (int, float)):
            wrong = value + 1
        elif isinstance(value, str):
            wrong = value + "zq"
            out["case changed"] = _render(
                variant(lambda c: c["arguments"].update({key: value.swapcase()}))
            )
        else:
            wrong = None
        if wrong is not None:
            out["wrong value"] = _render(variant(lambda c: c["arguments"].update({key: wrong})))
        if isinstance(value, int) and not isinstance(value, bool):
            out["integer as float"] = _render(
                variant(lambda c: c["arguments"].update({key: float(value)}))
            )
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out["number as string"] = _render(
                variant(lambda c: c["arguments"].update({key: str(value)}))
            )
    names = {f["name"] for f in functions} - {c["name"] for c in calls}
    if names:
        other = sorted(names)[0]
        out["other function"] = _render(variant(lambda c: c.update(name=other)))
    return out


def _stored_result(handler, raw: str) -> str:
    """What BFCL's inference step stores for a raw completion of a Qwen FC model."""
    response = SimpleNamespace(
        choices=[SimpleNamespace(text=raw)],
        usage=SimpleNamespace(prompt_tokens=0, completion_tokens=0),
    )
    return handler._parse_query_response_prompting(response)["model_responses"]


def _bfcl_pipeline(category, candidates, prompts, answers, score_dir: Path) -> list[bool]:
    """BFCL's own file runner on the candidates; True where BFCL counts the entry correct."""
    handler = eval_runner.get_handler(BFCL_QWEN_FC_MODEL)
    results = [
        {"id": f"{entry_id}::{k}", "result": _stored_result(handler, raw)}
        for k, (entry_id, raw) in enumerate(candidates)
    ]
    if category in RELEVANCE_CATEGORIES:
        eval_runner.relevance_file_runner(
            handler, results, prompts, MODEL_DIR_NAME, category, score_dir
        )
    else:
        answers = [{"id": r["id"], "ground_truth": a} for r, a in zip(results, answers)]
        eval_runner.ast_file_runner(
            handler, results, prompts, answers, category, MODEL_DIR_NAME, score_dir
        )
    (score_file,) = score_dir.rglob(f"*_{category}_score.json")
    lines = [json.loads(line) for line in score_file.read_text().splitlines()]
    failed = {line["id"] for line in lines[1:]}
    assert lines[0]["total_count"] == len(results)
    return [result["id"] not in failed for result in results]


def _sample(category: str) -> tuple[list[dict], list[dict], list[dict]]:
    """(raw entries, BFCL-loaded entries, possible answers) of a fixed sample of a category."""
    raw = _raw_lines(DATA / f"BFCL_v4_{category}.json")
    loaded = {e["id"]: e for e in load_dataset_entry(category, False, False)}
    if category in RELEVANCE_CATEGORIES:
        truth = {}
    else:
        truth = {e["id"]: e["ground_truth"] for e in load_ground_truth_entry(category)}
    rng = random.Random(f"bfcl-{category}")
    picked = rng.sample(raw, min(PER_CATEGORY, len(raw)))
    picked += [e for e in raw if e["id"] in LIST_OF_DICT and e not in picked]
    return picked, [loaded[e["id"]] for e in picked], [truth.get(e["id"]) for e in picked]


@pytest.mark.parametrize("category", AST_CATEGORIES + RELEVANCE_CATEGORIES)
def test_bfcl_verdict_equals_bfcls_own_pipeline(category, tmp_path):
    from entropyrl.data.function_calling import example_from_bfcl

    raw, loaded, answers = _sample(category)
    rng = random.Random(f"mutations-{category}")
    candidates, prompts, truths, labels = [], [], [], []
    for entry, bfcl_entry, answer in zip(raw, loaded, answers):
        if answer is None:  # relevance: a call of the first function, or none
            first = entry["function"][0]
            calls = [{"name": first["name"], "arguments": {}}]
        else:
            calls = _correct_calls(answer, category)
        for label, text in _mutations(calls, entry["function"], rng).items():
            candidates.append((entry["id"], text))
            prompts.append(bfcl_entry)
            truths.append(answer)
            labels.append((entry, answer, label, text))
    reference = _bfcl_pipeline(category, candidates, prompts, truths, tmp_path)
    ours = [bfcl_verdict(text, entry, answer, category) for entry, answer, _, text in labels]
    disagreements = [
        (entry["id"], label)
        for (entry, _, label, _), a, b in zip(labels, ours, reference)
        if a != b
    ]
    assert not disagreements
    assert any(reference) and not all(reference)  # the sample exercises both verdicts

    if _is_source_language(category) or category in RELEVANCE_CATEGORIES:
        return
    looser = []
    for (entry, answer, label, text), bfcl_ok in zip(labels, reference):
        example = example_from_bfcl(entry, answer, category=category)
        tools = {"tools": json.dumps([tool["function"] for tool in example.tools])}
        strict = {
            "ground truth": compute_score(text, example.answer),
            "ground truth + tools": compute_score(text, example.answer, tools),
            "BFCL's answer + tools": compute_score(text, answer, tools),
        }
        looser += [(entry["id"], label, how) for how, s in strict.items() if s > bfcl_ok]
        if label == "correct":
            assert set(strict.values()) == {1.0} and bfcl_ok, entry["id"]
    assert not looser  # the strict reward never accepts what BFCL rejects


def test_list_of_dict_entries_are_correct_under_both():
    for category in ("simple_python", "multiple", "live_simple"):
        answers = {e["id"]: e["ground_truth"] for e in load_ground_truth_entry(category)}
        for entry in _raw_lines(DATA / f"BFCL_v4_{category}.json"):
            if entry["id"] not in LIST_OF_DICT:
                continue
            text = _render(_correct_calls(answers[entry["id"]], category))
            assert bfcl_verdict(text, entry, answers[entry["id"]], category)
            assert compute_score(text, answers[entry["id"]]) == 1.0


def test_bfcl_verdict_rejects_what_it_cannot_judge():
    entry = _raw_lines(DATA / "BFCL_v4_simple_python.json")[0]
    with pytest.raises(ValueError, match="single-turn"):
        bfcl_verdict("x", entry, [], "multi_turn_base")
    with pytest.raises(ValueError, match="function"):
        bfcl_verdict("x", {"id": "a"}, [], "simple_python")
    with pytest.raises(ValueError, match="ground_truth"):
        bfcl_verdict("x", entry, None, "simple_python")
    with pytest.raises(TypeError):
        bfcl_verdict(None, entry, [], "simple_python")


def _response_strategy():
    from hypothesis import strategies as st

    names = st.sampled_from(["f", "get_weather", "db.query"])
    values = st.one_of(
        st.integers(-5, 5), st.sampled_from(["a", "B c", "</x>", "\\n"]), st.booleans()
    )
    calls = st.builds(
        lambda name, args: json.dumps({"name": name, "arguments": args}),
        names,
        st.dictionaries(st.sampled_from(["x", "y"]), values, max_size=2),
    )
    block = st.one_of(
        calls.map(lambda c: f"<tool_call>\n{c}\n</tool_call>"),  # the template
        calls.map(lambda c: f"<tool_call>{c}</tool_call>"),  # inline
        calls.map(lambda c: f"<tool_call>\n{c}</tool_call>"),
        calls.map(lambda c: f"<tool_call>\n {c} \n</tool_call>"),
        calls.map(lambda c: f"<tool_call>\n{c[:-1]}\n</tool_call>"),  # broken JSON
        st.sampled_from(["", "\n", " ", "text", "<|im_end|>", "<tool_call>\n", "</tool_call>"]),
    )
    think = st.sampled_from(
        ["<think>\nwhy\n</think>\n\n", "<think>x</think>", "", "<think></think>"]
    )
    return st.builds(lambda t, parts: t + "".join(parts), think, st.lists(block, max_size=4))


def test_what_the_strict_parser_accepts_bfcl_decodes_to_the_same_calls():
    """No format drift: every response the strict parser accepts, BFCL's Qwen FC decoder reads
    as exactly the same calls (and a response it rejects may still decode under BFCL)."""
    from bfcl_eval.model_handler.local_inference.qwen_fc import QwenFCHandler
    from hypothesis import given, settings

    from entropyrl.rewards.function_calling import ToolCallFormatError, parse_tool_calls

    handler = eval_runner.get_handler(BFCL_QWEN_FC_MODEL)
    accepted = []

    @settings(max_examples=400, deadline=None, derandomize=True)
    @given(text=_response_strategy())
    def check(text):
        try:
            ours = parse_tool_calls(text)
        except ToolCallFormatError:
            return
        stored = _stored_result(handler, text)
        assert QwenFCHandler._extract_tool_calls(stored) == ours
        accepted.append(len(ours))

    check()
    assert accepted and max(accepted) >= 2  # parallel calls were among the accepted
