"""Code reward: verl's test formats, answer extraction, comparison, and real runs in the sandbox.

The Sandbox Fusion backend is exercised through verl's own client: against a closed port (the
service is down) and against a small loopback stand-in that speaks the service's /run_code
protocol and executes with the local sandbox, so the request verl sends is checked end to end.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from entropyrl.rewards.code import (
    CodeTests,
    TestFormatError,
    extract_code,
    outputs_match,
    parse_tests,
    score_code,
    score_code_sandbox_fusion,
)
from entropyrl.rewards.sandbox import Sandbox, SandboxLimits

ADD_TESTS = {"inputs": ["1 2\n", "10 -3\n", "0 0\n"], "outputs": ["3\n", "7\n", "0\n"]}
ADD_PROGRAM = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    root = tmp_path_factory.mktemp("code-runs")
    yield Sandbox(SandboxLimits(cpu_seconds=1, wall_seconds=30, memory_mb=512), tmp_root=root)
    assert list(root.iterdir()) == []


# ---------------------------------------------------------------------------- formats
def test_prime_code_stdin_format():
    tests = parse_tests(json.dumps(ADD_TESTS))
    assert tests == CodeTests("stdin", ("1 2\n", "10 -3\n", "0 0\n"), ("3\n", "7\n", "0\n"))
    assert len(tests) == 3


def test_stdin_entries_may_be_lists_of_lines():
    tests = parse_tests({"inputs": [["1", "2"]], "outputs": [["3", "4"]]})
    assert tests.inputs == ("1\n2",) and tests.outputs == ("3\n4",)


def test_prime_code_call_format_json_lines():
    tests = parse_tests(
        {"fn_name": "add", "inputs": ["1\n2", '[1, 2]\n{"a": 3}\n'], "outputs": ["3", "[4]"]}
    )
    assert tests.kind == "call" and tests.fn_name == "add"
    assert tests.inputs == ([1, 2], [[1, 2], {"a": 3}])
    assert tests.outputs == (3, [4])


def test_apps_call_format_with_lists_and_nesting():
    raw = {"input_output": json.dumps({"fn_name": "f", "inputs": [[1, 2]], "outputs": [[3]]})}
    tests = parse_tests(raw)
    assert tests.kind == "call" and tests.inputs == ([1, 2],) and tests.outputs == ([3],)


def test_sandbox_fusion_assert_format():
    tests = parse_tests({"assert_case": ["assert f(1) == 2"]})
    assert tests.kind == "assert" and tests.inputs == ("assert f(1) == 2",)


@pytest.mark.parametrize(
    ("ground_truth", "message"),
    [
        ("not json", "not JSON"),
        (json.dumps([1, 2]), "JSON object"),
        ({"inputs": ["1"]}, "need 'inputs' and 'outputs'"),
        ({"inputs": ["1"], "outputs": []}, "1 inputs but 0 outputs"),
        ({"inputs": [], "outputs": []}, "no test cases"),
        ({"inputs": "1", "outputs": "2"}, "must be lists"),
        ({"inputs": [1], "outputs": ["1"]}, "string or a list of lines"),
        ({"fn_name": "not an identifier", "inputs": ["1"], "outputs": ["1"]}, "identifier"),
        ({"fn_name": "f", "inputs": ["{bad"], "outputs": ["1"]}, "JSON lines"),
        ({"fn_name": "f", "inputs": ["1"], "outputs": ["{bad"]}, "not JSON"),
        ({"assert_case": []}, "empty"),
        ({"assert_case": [1]}, "list of strings"),
        (float("nan"), "JSON object"),
        (None, "JSON object"),
    ],
)
def test_malformed_tests_are_reported(ground_truth, message):
    with pytest.raises(TestFormatError, match=message):
        parse_tests(ground_truth)


# ---------------------------------------------------------------------------- extraction
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("```python\nprint(1)\n```", "print(1)\n"),
        ("first\n```py\nprint(1)\n```\nthen\n```python3\nprint(2)\n```", "print(2)\n"),
        ("```\nprint(3)\n```", "print(3)\n"),
        ("<think>```python\nprint(0)\n```</think>\n```python\nprint(4)\n```", "print(4)\n"),
        ("```cpp\nint main() {}\n```", None),
        ("print(5)", None),
        ("<think>```python\nprint(0)\n```</think> no code", None),
    ],
)
def test_extract_code(text, expected):
    assert extract_code(text) == expected


def test_bare_program_only_when_allowed():
    assert extract_code("print(5)", require_block=False) == "print(5)"
    assert extract_code("   ", require_block=False) is None


@pytest.mark.parametrize(
    ("actual", "expected", "match"),
    [
        ("3\n", "3", True),
        ("3   \n\n", "3\n", True),
        ("1 2\n3 4\n", "1 2\n3 4", True),
        ("0.3333333\n", "0.33333333", True),
        ("1e3\n", "1000", True),
        ("3\n", "4\n", False),
        ("", "0", False),
        ("1 2", "1 2 3", False),
        ("nan", "nan", True),
        ("yes", "YES", False),
    ],
)
def test_outputs_match(actual, expected, match):
    assert outputs_match(actual, expected) is match


# ---------------------------------------------------------------------------- local runs
def test_correct_stdin_program_scores_one(sandbox):
    scored = score_code(ADD_PROGRAM, json.dumps(ADD_TESTS), sandbox=sandbox)
    assert (scored.score, scored.passed, scored.total) == (1.0, 3, 3)
    assert scored.reason == "all tests passed"


def test_wrong_program_stops_at_the_first_failure(sandbox):
    wrong = "```python\na, b = map(int, input().split())\nprint(a * b if a == 1 else a + b)\n```"
    scored = score_code(wrong, ADD_TESTS, sandbox=sandbox)
    assert (scored.score, scored.passed, scored.total) == (0.0, 0, 3)
    assert scored.statuses == ("wrong_answer",)
    assert "test 0: wrong answer" in scored.reason


def test_fraction_mode_runs_every_test(sandbox):
    partial = "```python\na, b = map(int, input().split())\nprint(3)\n```"
    scored = score_code(partial, ADD_TESTS, sandbox=sandbox, mode="fraction")
    assert scored.passed == 1 and scored.total == 3
    assert scored.score == pytest.approx(1 / 3)
    assert scored.statuses == ("passed", "wrong_answer", "wrong_answer")


def test_call_tests_with_a_function_and_with_solution_class(sandbox):
    # Not "add": operator.add comes with the prime_code preamble and would be found.
    tests = {"fn_name": "plus", "inputs": ["1\n2", "[1]\n[2]"], "outputs": ["3", "[1, 2]"]}
    function = "```python\ndef plus(a, b):\n    print('noise')\n    return a + b\n```"
    assert score_code(function, tests, sandbox=sandbox).score == 1.0
    method = "```python\nclass Solution:\n    def plus(self, a: List[int], b):\n        return a + b\n```"
    assert score_code(method, tests, sandbox=sandbox).score == 1.0
    missing = "```python\ndef other(a, b):\n    return a + b\n```"
    scored = score_code(missing, tests, sandbox=sandbox)
    assert scored.score == 0.0 and "not found" in scored.reason


def test_apps_wrapped_expected_output(sandbox):
    tests = {"fn_name": "pair", "inputs": [[1]], "outputs": [[[1, 1]]]}
    program = "```python\ndef pair(x):\n    return (x, x)\n```"
    assert score_code(program, tests, sandbox=sandbox).score == 1.0


def test_assert_tests(sandbox):
    tests = {"assert_case": ["assert double(2) == 4", "assert double(-1) == -2"]}
    good = "```python\ndef double(x):\n    return 2 * x\n```"
    assert score_code(good, tests, sandbox=sandbox).score == 1.0
    bad = "```python\ndef double(x):\n    return x + 2\n```"
    scored = score_code(bad, tests, sandbox=sandbox, mode="fraction")
    assert (scored.passed, scored.statuses) == (1, ("passed", "wrong_answer"))


def test_missing_code_and_bad_tests_score_zero_with_a_reason(sandbox):
    assert score_code("no code here", ADD_TESTS, sandbox=sandbox).reason == (
        "no python code block in the answer"
    )
    scored = score_code(ADD_PROGRAM, "{not json", sandbox=sandbox)
    assert scored.score == 0.0 and scored.reason.startswith("invalid tests")
    bare = "a, b = map(int, input().split())\nprint(a + b)\n"
    assert score_code(bare, ADD_TESTS, sandbox=sandbox, require_code_block=False).score == 1.0


def test_crashing_program(sandbox):
    scored = score_code("```python\nraise SystemExit(3)\n```", ADD_TESTS, sandbox=sandbox)
    assert scored.score == 0.0 and scored.statuses == ("error",)
    scored = score_code("```python\n1/0\n```", ADD_TESTS, sandbox=sandbox)
    assert "ZeroDivisionError" in scored.reason


@pytest.mark.parametrize(
    "body",
    [
        "import os\nwhile True:\n    os.fork()",
        "while True:\n    pass",
        "x = bytearray(8 * 1024**3)",
        "open('/tmp/entropyrl-code-test-outside.txt', 'w').write('3')\nprint(3)",
        "import socket\nsocket.create_connection(('127.0.0.1', 9))\nprint(3)",
    ],
    ids=["fork-bomb", "loop", "alloc", "write-outside", "socket"],
)
def test_hostile_answers_score_zero(sandbox, body):
    scored = score_code(f"```python\n{body}\n```", ADD_TESTS, sandbox=sandbox)
    assert scored.score == 0.0
    assert scored.statuses[0] in ("denied", "cpu_limit", "memory_limit", "killed")


def test_invalid_mode(sandbox):
    with pytest.raises(ValueError, match="mode"):
        score_code(ADD_PROGRAM, ADD_TESTS, sandbox=sandbox, mode="best")


# ---------------------------------------------------------------------------- Sandbox Fusion
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_sandbox_fusion_down_scores_zero_with_the_reason():
    pytest.importorskip("verl")
    url = f"http://127.0.0.1:{free_port()}/run_code"  # nothing listens there
    scored = score_code_sandbox_fusion(ADD_PROGRAM, ADD_TESTS, url=url)
    assert scored.score == 0.0
    assert scored.reason.startswith("sandbox fusion unreachable")
    assert "Connection refused" in scored.reason or "connect" in scored.reason.lower()


class FusionStandIn(BaseHTTPRequestHandler):
    """Speaks Sandbox Fusion's /run_code protocol; runs the code in the local sandbox."""

    sandbox: Sandbox
    requests: list

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        result = type(self).sandbox.run(body["code"], body.get("stdin") or "")
        run = {
            "status": "Finished",
            "return_code": result.returncode,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "execution_time": result.wall_seconds,
        }
        answer = {"status": "Success" if result.ok else "Failed", "run_result": run}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def fusion(sandbox):
    pytest.importorskip("verl")
    handler = type("Handler", (FusionStandIn,), {"sandbox": sandbox, "requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/run_code", handler.requests
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_sandbox_fusion_round_trip_through_verls_client(fusion):
    url, requests = fusion
    scored = score_code_sandbox_fusion(ADD_PROGRAM, json.dumps(ADD_TESTS), url=url)
    assert (scored.score, scored.passed, scored.total) == (1.0, 3, 3)
    assert sorted(r["stdin"] for r in requests) == sorted(ADD_TESTS["inputs"])
    assert all(r["language"] == "python" and r["memory_limit_MB"] == 1024 for r in requests)
    wrong = "```python\nprint(3)\n```"
    scored = score_code_sandbox_fusion(wrong, ADD_TESTS, url=url, mode="fraction")
    assert scored.passed == 1 and scored.score == pytest.approx(1 / 3)
    assert scored.reason == "sandbox fusion: wrong_answer"


def test_sandbox_fusion_call_tests_use_verls_wrapper(fusion):
    url, requests = fusion
    tests = {"fn_name": "add", "inputs": ["1\n2", "[1]\n[2]"], "outputs": ["3", "[1, 2]"]}
    program = "```python\ndef add(a, b):\n    return a + b\n```"
    assert score_code_sandbox_fusion(program, tests, url=url).score == 1.0
    assert all("_SANDBOX_FN_NAME" in r["code"] for r in requests)  # verl built the request
