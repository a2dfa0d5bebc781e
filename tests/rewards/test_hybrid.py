"""The hybrid reward through its verl entry point (`entropyrl.verl.rewards.hybrid_score`):
routing by ability in every shape verl hands it over, token-id responses, the fixed result keys,
each route with real cases (math-verify, the local sandbox), and the calls it cannot score."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

pytest.importorskip("math_verify")

from entropyrl.rewards.hybrid import (
    RESULT_KEYS,
    HybridScorer,
    compute_score,
    resolve_ability,
    solution_text,
)
from entropyrl.rewards.scorer import ScoringFailed
from entropyrl.verl.rewards import hybrid_score

TESTS = json.dumps({"inputs": ["1 2\n", "4 5\n"], "outputs": ["3\n", "9\n"]})
PROGRAM = "Here it is:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```"
FAST = {"cpu_seconds": 1, "wall_seconds": 30, "memory_limit_mb": 512}


@pytest.mark.parametrize(
    ("extra_info", "keyword", "route"),
    [
        ({"ability": "math"}, None, "math"),
        ({"ability": "CODE "}, None, "code"),
        ({"ability": np.array("code", dtype=object)}, None, "code"),
        ({"ability": np.array(["math"])}, None, "math"),
        ({"ability": [["coding"]]}, None, "code"),
        ({"ability": b"mathematics"}, None, "math"),
        (np.array({"ability": "code"}, dtype=object), None, "code"),
        ({"split": "train"}, "math", "math"),
        (None, np.array("programming"), "code"),
        ({"ability": "math"}, "code", "math"),  # the row's extra_info wins over the keyword
    ],
)
def test_ability_in_every_shape(extra_info, keyword, route):
    assert resolve_ability(extra_info, keyword) == route


@pytest.mark.parametrize(
    ("extra_info", "message"),
    [
        ({}, "no ability"),
        (None, "no ability"),
        ({"ability": None}, "no ability"),
        ({"ability": float("nan")}, "no ability"),
        ({"ability": "poetry"}, "unknown ability 'poetry'"),
        ({"ability": ["math", "code"]}, "must be a string"),
        ({"ability": 3}, "must be a string"),
    ],
)
def test_missing_or_unknown_ability_is_a_clear_error(extra_info, message):
    with pytest.raises(ValueError, match=message):
        resolve_ability(extra_info)
    with pytest.raises(ValueError, match=message):
        hybrid_score("src", r"\boxed{1}", "1", extra_info)


def test_unknown_ability_can_score_zero_instead():
    result = hybrid_score("src", r"\boxed{1}", "1", {"ability": "poetry"}, unknown_ability="zero")
    assert result["score"] == 0.0 and result["route"] == "none"
    assert "unknown ability" in result["reason"]
    assert tuple(result) == RESULT_KEYS


def test_math_route():
    right = hybrid_score("gsm", r"The answer is \boxed{\frac12}", "0.5", {"ability": "math"})
    assert right == {
        "score": 1.0,
        "route": "math",
        "backend": "math-verify",
        "reason": "correct",
        "passed": 1,
        "total": 1,
    }
    wrong = hybrid_score("gsm", r"\boxed{2}", "0.5", {"ability": "math"})
    assert (wrong["score"], wrong["reason"]) == (0.0, "wrong answer")
    missing = hybrid_score("gsm", "no idea", "0.5", {"ability": "math"})
    assert (missing["score"], missing["reason"]) == (0.0, "no answer found")
    nan = hybrid_score("gsm", r"\boxed{1}", np.array(float("nan")), {"ability": "math"})
    assert nan["score"] == 0.0 and "NaN" in nan["reason"]


def test_code_route(tmp_path):
    runs = str(tmp_path)
    right = hybrid_score("apps", PROGRAM, TESTS, {"ability": "code"}, tmp_root=runs, **FAST)
    assert (right["score"], right["passed"], right["total"]) == (1.0, 2, 2)
    assert (right["route"], right["backend"]) == ("code", "local")
    wrong = hybrid_score(
        "apps", "```python\nprint(3)\n```", TESTS, {"ability": "code"}, tmp_root=runs, **FAST
    )
    assert wrong["score"] == 0.0 and wrong["reason"].startswith("test 1: wrong answer")
    partial = hybrid_score(
        "apps",
        "```python\nprint(3)\n```",
        TESTS,
        {"ability": "code"},
        code_score="fraction",
        tmp_root=runs,
        **FAST,
    )
    assert partial["score"] == 0.5
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "body",
    [
        "import os\nwhile True:\n    os.fork()",
        "while True:\n    pass",
        "x = ' ' * (8 * 1024**3)",
        "import os\nprint(open(f'/proc/{os.getppid()}/environ').read())",
        "import socket\nsocket.socket().connect(('127.0.0.1', 9))",
    ],
    ids=["fork-bomb", "loop", "alloc", "environ", "socket"],
)
def test_hostile_code_scores_zero(tmp_path, body):
    response = f"```python\n{body}\n```"
    result = hybrid_score(
        "apps", response, TESTS, {"ability": "code"}, tmp_root=str(tmp_path), **FAST
    )
    assert result["score"] == 0.0 and result["route"] == "code"
    assert result["reason"].startswith("test 0:")
    assert list(tmp_path.iterdir()) == []


def test_wrong_route_scores_zero_with_a_reason(tmp_path):
    as_math = hybrid_score("apps", PROGRAM, TESTS, {"ability": "math"})
    assert as_math["score"] == 0.0 and "wrong route" in as_math["reason"]
    as_code = hybrid_score("gsm", r"\boxed{3}", "3", {"ability": "code"}, tmp_root=str(tmp_path))
    assert as_code["score"] == 0.0 and as_code["reason"].startswith("invalid tests")


def test_every_route_returns_the_same_keys(tmp_path):
    """verl builds its extra-info columns from the first sample's keys."""
    results = [
        hybrid_score("a", r"\boxed{1}", "1", {"ability": "math"}),
        hybrid_score("b", PROGRAM, TESTS, {"ability": "code"}, tmp_root=str(tmp_path), **FAST),
        hybrid_score("c", "x", "1", {"ability": "?"}, unknown_ability="zero"),
    ]
    for result in results:
        assert tuple(result) == RESULT_KEYS
        assert isinstance(result["score"], float) and math.isfinite(result["score"])


def test_verl_keyword_arguments_are_accepted():
    result = hybrid_score(
        data_source="gsm",
        solution_str=r"\boxed{4}",
        ground_truth="4",
        extra_info={"ability": "math", "num_turns": 2, "rollout_reward_scores": {}},
        reward_router_address=None,
        reward_model_tokenizer=None,
    )
    assert result["score"] == 1.0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"unknown_ability": "ignore"}, "unknown_ability"),
        ({"code_backend": "docker"}, "code_backend"),
        ({"code_score": "max"}, "code_score"),
    ],
)
def test_invalid_settings_raise(changes, message):
    with pytest.raises(ValueError, match=message):
        hybrid_score("a", "x", "1", {"ability": "math"}, **changes)


def test_sandbox_fusion_backend_needs_a_url_and_survives_a_dead_service():
    pytest.importorskip("verl")
    with pytest.raises(ValueError, match="sandbox_fusion_url"):
        hybrid_score("a", PROGRAM, TESTS, {"ability": "code"}, code_backend="sandbox_fusion")
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = {
        "code_backend": "sandbox_fusion",
        "sandbox_fusion_url": f"http://127.0.0.1:{port}/run_code",
    }
    # No verdict on the response: raised (and reported), not trained on as a 0
    with pytest.raises(ScoringFailed, match=r"^sandbox fusion unreachable or failing: "):
        hybrid_score("a", PROGRAM, TESTS, {"ability": "code"}, **settings)
    (scored,) = HybridScorer.from_settings(**settings).score_batch(
        [PROGRAM], [TESTS], [{"ability": "code"}]
    )  # the scorer (the local runner's call) keeps its 0 and says why
    assert (scored.score, scored["backend"]) == (0.0, "sandbox_fusion")
    assert scored.failure == scored.reason and scored.reason.startswith("sandbox fusion")
    # the deprecated path scores it 0 as before
    with pytest.warns(DeprecationWarning, match="pkg://entropyrl.verl.rewards, hybrid_score"):
        old = compute_score("a", PROGRAM, TESTS, {"ability": "code"}, **settings)
    assert old["score"] == 0.0 and old["reason"].startswith("sandbox fusion unreachable")


def test_a_sandbox_that_cannot_start_a_program_raises(tmp_path):
    """A crash of the sandbox itself (its run folder cannot be made) is no verdict on the
    response: it propagates, for the entry point to report."""
    with pytest.raises(FileNotFoundError):
        hybrid_score("a", PROGRAM, TESTS, {"ability": "code"}, tmp_root=str(tmp_path / "gone"))


def test_a_route_scorer_that_cannot_judge_marks_the_score(tmp_path):
    """The math route's timeout reason (`score_math_safely`) and any route scorer's own
    `Score.failure` make the hybrid score no verdict; a wrong answer stays a verdict."""
    from entropyrl.rewards.scorer import ResponseScorer, Score

    class Gives(ResponseScorer):
        def __init__(self, score: Score) -> None:
            self.given = score

        def score_response(self, solution, ground_truth, extra_info):
            return self.given

    def code():
        raise AssertionError("no code row")

    timed_out = Score(0.0, "math check timed out after 45 s")
    told = Score(0.0, "checker down", failure="checker down")
    wrong = Score(0.0, "wrong answer")
    infos = [{"ability": "math"}]
    for given, failure in ((timed_out, timed_out.reason), (told, "checker down"), (wrong, "")):
        (scored,) = HybridScorer(Gives(given), code).score_batch(["x"], ["1"], infos)
        assert (scored.score, scored.failure, scored["route"]) == (0.0, failure, "math")


# ---------------------------------------------------------------------------- token ids
@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    module = pytest.importorskip("entropyrl.rig.tokenizer")
    tokenizer = module.build_qwen_tokenizer(num_ranks=8192)
    path = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(str(path))
    return str(path), tokenizer


def test_token_ids_in_any_nesting_are_decoded(tokenizer_path):
    torch = pytest.importorskip("torch")
    path, tokenizer = tokenizer_path
    text = r"The answer is \boxed{\frac{1}{2}}"
    ids = tokenizer.encode(text, add_special_tokens=False)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for given in (
        ids,
        [ids],
        [[ids[:3]], ids[3:]],
        np.array(ids),
        np.array([ids]),
        torch.tensor(ids),
        [*ids, end],  # special tokens are skipped, as verl decodes
    ):
        assert solution_text(given, path) == text
    result = hybrid_score("gsm", torch.tensor([ids]), "0.5", {"ability": "math"}, tokenizer=path)
    assert result["score"] == 1.0
    assert solution_text(ids, tokenizer) == text  # a tokenizer object works too


def test_token_ids_without_a_tokenizer_or_of_the_wrong_type():
    with pytest.raises(ValueError, match="tokenizer"):
        solution_text([1, 2, 3])
    with pytest.raises(TypeError, match="token ids"):
        solution_text([1.5, 2.0])
    assert solution_text(np.array(["plain text"])) == "plain text"
    assert solution_text(b"bytes") == "bytes"
