"""Code reward: run a candidate program against its tests, locally or on Sandbox Fusion.

Test formats are the ones verl's code rewards read (`verl.utils.reward_score.prime_code` and
`.sandbox_fusion`), given as a dict or its JSON string:

- standard input / output: ``{"inputs": ["1 2\\n", ...], "outputs": ["3\\n", ...]}``; an entry
  may also be a list of lines;
- function call: the same plus ``"fn_name"``; each input is the arguments, one JSON value per
  line (prime_code's layout) or already a list, each output the JSON of the return value; the
  function is a global or a method of ``Solution`` (LeetCode style);
- assertions (Sandbox Fusion): ``{"assert_case": ["assert f(1) == 2", ...]}``, each appended to
  the program and passed when the program then exits 0.

Comparison follows prime_code in spirit: stdout matches when the lines match after trailing
whitespace is stripped, or token by token with numbers equal to 1e-6; a call matches when the
JSON of the result equals the expected value (or its only element, APPS stores outputs wrapped
in a list).

`CodeScorer` (local sandbox) and `SandboxFusionScorer` are the reward as a `Scorer`
(`entropyrl.rewards.scorer`); `score_code` and `score_code_sandbox_fusion` score one response.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from entropyrl.rewards.sandbox import Sandbox
from entropyrl.rewards.scorer import ResponseScorer, Score

__all__ = [
    "CODE_SCORE_MODES",
    "CodeScore",
    "CodeScorer",
    "CodeTests",
    "SandboxFusionScorer",
    "TestFormatError",
    "extract_code",
    "outputs_match",
    "parse_tests",
    "score_code",
    "score_code_sandbox_fusion",
]

CODE_SCORE_MODES = ("all", "fraction")
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = {"", "python", "python3", "py", "py3"}


class TestFormatError(ValueError):
    """The tests of a row are not in one of the supported formats."""

    __test__ = False  # not a pytest class


@dataclass(frozen=True)
class CodeTests:
    """Normalised tests. kind: "stdin" | "call" | "assert"."""

    kind: str
    inputs: tuple[Any, ...]
    outputs: tuple[Any, ...]
    fn_name: str | None = None
    source: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __len__(self) -> int:
        return len(self.inputs)


@dataclass(frozen=True)
class CodeScore:
    """Score in [0, 1], tests passed of those run, and why the first failure failed."""

    score: float
    passed: int
    total: int
    reason: str
    statuses: tuple[str, ...] = ()


def parse_tests(ground_truth: Any) -> CodeTests:
    """verl's code test formats (dict or JSON string) -> CodeTests; TestFormatError if not one."""
    data = ground_truth
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    if isinstance(data, str):
        data = _loads(data, "tests are not JSON")
    if isinstance(data, Mapping) and "input_output" in data and "inputs" not in data:
        return parse_tests(data["input_output"])  # APPS rows keep the tests under this key
    if not isinstance(data, Mapping):
        raise TestFormatError(f"tests must be a JSON object, got {type(data).__name__}")
    asserts = data.get("assert_case")
    if asserts is not None:
        if not _is_list(asserts) or not all(isinstance(case, str) for case in asserts):
            raise TestFormatError("assert_case must be a list of strings")
        if not asserts:
            raise TestFormatError("assert_case is empty")
        return CodeTests("assert", tuple(asserts), (None,) * len(asserts), source=data)
    if "inputs" not in data or "outputs" not in data:
        raise TestFormatError("tests need 'inputs' and 'outputs' (or 'assert_case')")
    inputs, outputs = data["inputs"], data["outputs"]
    if not _is_list(inputs) or not _is_list(outputs):
        raise TestFormatError("'inputs' and 'outputs' must be lists")
    if len(inputs) != len(outputs):
        raise TestFormatError(f"{len(inputs)} inputs but {len(outputs)} outputs")
    if not inputs:
        raise TestFormatError("no test cases")
    fn_name = data.get("fn_name")
    if fn_name:
        if not isinstance(fn_name, str) or not fn_name.isidentifier():
            raise TestFormatError(f"fn_name must be an identifier, got {fn_name!r}")
        arguments = tuple(_call_arguments(value) for value in inputs)
        expected = tuple(_call_expected(value) for value in outputs)
        return CodeTests("call", arguments, expected, fn_name, source=data)
    return CodeTests(
        "stdin",
        tuple(_lines(value, "input") for value in inputs),
        tuple(_lines(value, "output") for value in outputs),
        source=data,
    )


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


def _lines(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    if _is_list(value) and all(isinstance(line, str) for line in value):
        return "\n".join(value)
    raise TestFormatError(f"a stdin test {what} must be a string or a list of lines")


def _loads(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise TestFormatError(f"{what} ({error.msg})") from None


def _call_arguments(value: Any) -> list[Any]:
    if _is_list(value):
        return list(value)
    if isinstance(value, str):
        lines = [line for line in value.split("\n") if line.strip()]
        return [_loads(line, "call arguments are not JSON lines") for line in lines]
    raise TestFormatError("call arguments must be JSON lines or a list")


def _call_expected(value: Any) -> Any:
    return _loads(value, "expected return value is not JSON") if isinstance(value, str) else value


def extract_code(text: str, *, require_block: bool = True) -> str | None:
    """The last fenced Python block of a response (the answer after any </think>).

    Without a fenced block: None, or the whole answer when `require_block` is False (a bare
    program). A block tagged with another language does not count.
    """
    answer = text.rsplit("</think>", 1)[-1]
    blocks = [body for tag, body in _FENCE.findall(answer) if tag.lower() in _PYTHON_TAGS]
    if blocks:
        return blocks[-1]
    if require_block or not answer.strip():
        return None
    return answer


def outputs_match(actual: str, expected: str, *, tolerance: float = 1e-6) -> bool:
    """Lines equal after trailing whitespace, else tokens equal with numbers within tolerance."""
    got = [line.rstrip() for line in actual.strip().splitlines()]
    want = [line.rstrip() for line in expected.strip().splitlines()]
    if got == want:
        return True
    got_tokens, want_tokens = actual.split(), expected.split()
    if len(got_tokens) != len(want_tokens) or not got_tokens:
        return False
    for a, b in zip(got_tokens, want_tokens):
        if a == b:
            continue
        try:
            x, y = float(a), float(b)
        except ValueError:
            return False
        if not math.isclose(x, y, rel_tol=tolerance, abs_tol=tolerance):
            return False
    return True


def call_result_matches(result: Any, expected: Any) -> bool:
    """prime_code's rule: equal, or equal to the only element of a wrapped expected list."""
    if result == expected:
        return True
    return isinstance(expected, list) and len(expected) == 1 and result == expected[0]


def _program_and_tests(
    solution: str, ground_truth: Any, mode: str, require_code_block: bool
) -> tuple[str, CodeTests] | CodeScore:
    """The answer's program and the parsed tests, or the zero score that says which is missing."""
    if mode not in CODE_SCORE_MODES:
        raise ValueError(f"mode must be one of {CODE_SCORE_MODES}, got {mode!r}")
    try:
        tests = parse_tests(ground_truth)
    except TestFormatError as error:
        return CodeScore(0.0, 0, 0, f"invalid tests: {error}")
    code = extract_code(solution, require_block=require_code_block)
    if code is None:
        return CodeScore(0.0, 0, len(tests), "no python code block in the answer")
    return code, tests


def score_code(
    solution: str,
    ground_truth: Any,
    *,
    sandbox: Sandbox,
    mode: str = "all",
    require_code_block: bool = True,
) -> CodeScore:
    """Run the response's program on every test in the local sandbox.

    mode "all": 1.0 when every test passes, else 0.0 (stops at the first failure);
    "fraction": passed / total over all tests.
    """
    program = _program_and_tests(solution, ground_truth, mode, require_code_block)
    if isinstance(program, CodeScore):
        return program
    code, tests = program
    passed, statuses, first_failure = 0, [], ""
    for index in range(len(tests)):
        ok, status, why = _run_one(sandbox, code, tests, index)
        statuses.append(status)
        if ok:
            passed += 1
            continue
        first_failure = first_failure or f"test {index}: {why}"
        if mode == "all":
            break
    total = len(tests)
    score = float(passed == total) if mode == "all" else passed / total
    reason = "all tests passed" if passed == total else first_failure
    return CodeScore(score, passed, total, reason, tuple(statuses))


def _run_one(sandbox: Sandbox, code: str, tests: CodeTests, index: int) -> tuple[bool, str, str]:
    """(passed, status, why) for test `index`."""
    if tests.kind == "stdin":
        result = sandbox.run(code, tests.inputs[index])
        if not result.ok:
            return False, result.status, result.reason()
        if outputs_match(result.stdout, tests.outputs[index]):
            return True, "passed", ""
        return False, "wrong_answer", f"wrong answer: got {_clip(result.stdout)!r}"
    if tests.kind == "assert":
        result = sandbox.run(code + "\n\n" + tests.inputs[index] + "\n")
        if result.ok:
            return True, "passed", ""
        if result.status == "error" and "AssertionError" in result.stderr:
            return False, "wrong_answer", "assertion failed"
        return False, result.status, result.reason()
    result = sandbox.run(code, mode="call", fn_name=tests.fn_name, arguments=tests.inputs[index])
    if not result.ok:
        return False, result.status, result.reason()
    lines = result.stdout.strip().splitlines()
    if not lines:
        return False, "error", "no return value"
    try:
        value = json.loads(lines[-1])
    except json.JSONDecodeError:
        return False, "wrong_answer", f"unreadable result {_clip(lines[-1])!r}"
    if call_result_matches(value, tests.outputs[index]):
        return True, "passed", ""
    return False, "wrong_answer", f"wrong answer: returned {_clip(json.dumps(value))}"


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def score_code_sandbox_fusion(
    solution: str,
    ground_truth: Any,
    *,
    url: str,
    mode: str = "all",
    memory_limit_mb: int = 1024,
    timeout: int = 10,
    concurrent_semaphore: Any = None,
    require_code_block: bool = True,
) -> CodeScore:
    """Score through a Sandbox Fusion service with verl's own client.

    The tests go to the service in verl's format unchanged; an unreachable service scores 0
    with the client's error as the reason (it never raises for that).
    """
    program = _program_and_tests(solution, ground_truth, mode, require_code_block)
    if isinstance(program, CodeScore):
        return program
    code, tests = program
    try:
        from verl.utils.reward_score import sandbox_fusion
    except ImportError as error:  # a configuration error, not a property of the answer
        raise RuntimeError(f"backend 'sandbox_fusion' needs verl installed ({error})") from error
    fraction, metadata = sandbox_fusion.compute_score(
        url,
        concurrent_semaphore,
        memory_limit_mb,
        f"```python\n{code}\n```",
        dict(tests.source),
        continuous=False,
        timeout=timeout,
    )
    metadata = [entry for entry in metadata or [] if isinstance(entry, Mapping)]
    statuses = tuple(str(entry.get("status", entry.get("error", "unknown"))) for entry in metadata)
    total = len(tests)
    passed = round(float(fraction) * total)
    api_errors = [entry.get("api_request_error") for entry in metadata]
    api_errors = [error for error in api_errors if error]
    if api_errors:
        reason = f"sandbox fusion unreachable or failing: {_clip(str(api_errors[0]), 300)}"
    elif passed == total:
        reason = "all tests passed"
    else:
        failed = next((s for s in statuses if s != "success"), "failed")
        reason = f"sandbox fusion: {failed}"
    score = float(passed == total) if mode == "all" else passed / total
    if api_errors:
        score = 0.0
    return CodeScore(score, passed, total, reason, statuses)


def _as_score(scored: CodeScore) -> Score:
    details = {"passed": scored.passed, "total": scored.total, "statuses": scored.statuses}
    return Score(scored.score, scored.reason, details)


def _scored_by(function: Any, scorer: Any, solution: str, ground_truth: Any) -> Score:
    """`function` (`score_code` or `score_code_sandbox_fusion`) on one response, with the
    scorer's fields as its keywords, as a `Score`."""
    options = {field.name: getattr(scorer, field.name) for field in fields(scorer)}
    scored: CodeScore = function(solution, ground_truth, **options)
    details = {"passed": scored.passed, "total": scored.total, "statuses": scored.statuses}
    return Score(scored.score, scored.reason, details)


@dataclass(frozen=True)
class CodeScorer(ResponseScorer):
    """The code reward as a `Scorer`, on the local sandbox: `score_code` on each response.

    The ground truth is the row's tests (a format above); the extra info is not read. Each
    `Score` has the reason of the first failure and the details ``passed``, ``total`` (tests)
    and ``statuses`` (one per test run). `mode` and `require_code_block` as in `score_code`.
    """

    sandbox: Sandbox
    mode: str = "all"
    require_code_block: bool = True

    def score_response(
        self, solution: str, ground_truth: Any, extra_info: Mapping[str, Any] | None
    ) -> Score:
        return _scored_by(score_code, self, solution, ground_truth)


@dataclass(frozen=True)
class SandboxFusionScorer(ResponseScorer):
    """The code reward as a `Scorer`, on a Sandbox Fusion service (`url`, its ``/run_code``):
    `score_code_sandbox_fusion` on each response, details as `CodeScorer`'s.

    `memory_limit_mb` and `timeout` (seconds) go to the service with each program;
    `concurrent_semaphore` bounds verl's client's requests in flight (None: unbounded).
    """

    url: str
    mode: str = "all"
    require_code_block: bool = True
    memory_limit_mb: int = 1024
    timeout: int = 10
    concurrent_semaphore: Any = None

    def score_response(
        self, solution: str, ground_truth: Any, extra_info: Mapping[str, Any] | None
    ) -> Score:
        return _scored_by(score_code_sandbox_fusion, self, solution, ground_truth)
