"""One scorer protocol: every reward is a `Scorer`, and each verl entry point
(`entropyrl.verl.rewards`, their one home) gives what its scorer gives on the same rows (the entry
points only adapt arguments and results).

The caption reward through a real CHAIR service is compared in tests/verl/test_rewards.py (its
service fixtures); here it runs through verl's entry point without a service (CIDEr-D only) and
through the scorer with an in-process CHAIR scorer.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket

import pytest

from entropyrl.rewards.caption import CAPTION_FIELDS, CaptionReward, caption_ground_truth
from entropyrl.rewards.cider import CiderD
from entropyrl.rewards.code import (
    CodeScorer,
    SandboxFusionScorer,
    score_code,
    score_code_sandbox_fusion,
)
from entropyrl.rewards.function_calling import (
    DETAIL_KEYS,
    FunctionCallingScorer,
    compute_score,
    score_details,
)
from entropyrl.rewards.sandbox import Sandbox, SandboxLimits
from entropyrl.rewards.scorer import Score, Scorer, ScoringFailed, same_length, score_one

REFERENCES = {
    1: ["a dog and a cat on a sofa", "a cat sits next to a dog", "two pets on a couch"],
    2: ["a man riding a bike", "a person on a bicycle in the street", "a cyclist on the road"],
}
CAPTIONS = [(1, "a dog and a cat on a sofa"), (1, "a dog next to a giraffe"), (2, "a cyclist")]
CHAIR_TRUTH = {"1": ["dog", "cat", "couch"], "2": ["person", "bicycle"]}

WEATHER = [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]


def tool_call(arguments: dict, *, think: str = "<think>weather</think>\n") -> str:
    body = json.dumps({"name": "get_weather", "arguments": arguments})
    return f"{think}<tool_call>\n{body}\n</tool_call>"


FC_ROWS = [
    (tool_call({"city": "Paris", "days": 3}), WEATHER, None),
    (tool_call({"city": "Paris", "days": 3}), json.dumps(WEATHER), {"tools": TOOLS}),
    (tool_call({"city": "Paris", "days": 3.0}), WEATHER, {"tools": TOOLS}),  # float for an int
    (tool_call({"city": "Paris", "days": 3}, think=""), WEATHER, None),  # no reasoning block
    (tool_call({"city": "Rome", "days": 3}), WEATHER, {}),
]
ADD_TESTS = json.dumps({"inputs": ["1 2\n", "4 5\n"], "outputs": ["3\n", "9\n"]})
ADD = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
CODE_ROWS = [(ADD, ADD_TESTS), ("```python\nprint(3)\n```", ADD_TESTS), ("no code", ADD_TESTS)]
MATH_ROWS = [(r"so \boxed{\frac12}", "0.5"), (r"\boxed{2}", "0.5"), ("no idea", "3")]
FAST = {"cpu_seconds": 1, "wall_seconds": 30, "memory_limit_mb": 512}


def dead_url() -> str:
    with socket.socket() as probe:  # a port nothing listens on once it is closed
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}/run_code"


def same(a: dict, b: dict) -> bool:
    """Equal dicts, key order included, with NaN equal to NaN."""
    if list(a) != list(b):
        return False
    return all(
        (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))
        or x == y
        for x, y in zip(a.values(), b.values())
    )


@pytest.fixture(scope="module")
def cider() -> CiderD:
    return CiderD.from_references(REFERENCES)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Sandbox:
    limits = SandboxLimits(cpu_seconds=1, wall_seconds=30, memory_mb=512)
    return Sandbox(limits, tmp_root=tmp_path_factory.mktemp("runs"))


# ---------------------------------------------------------------------------- the protocol
def test_every_reward_is_a_scorer(cider, sandbox):
    pytest.importorskip("math_verify")
    from entropyrl.rewards.hybrid import HybridScorer
    from entropyrl.rewards.math_answer import MathScorer

    scorers = [
        CaptionReward(cider),
        FunctionCallingScorer(),
        MathScorer(),
        CodeScorer(sandbox),
        SandboxFusionScorer(dead_url()),
        HybridScorer.from_settings(),
    ]
    for scorer in scorers:
        assert isinstance(scorer, Scorer), type(scorer).__name__
        with pytest.raises(ValueError, match="same length"):
            scorer.score_batch(["a", "b"], ["1"], [None, None])
        assert list(scorer.score_batch([], [], [])) == []
    assert not isinstance(object(), Scorer)
    from entropyrl.rewards.chair_client import ChairClient

    assert not isinstance(ChairClient("http://127.0.0.1:9"), Scorer)  # a CHAIR client, not a reward


def test_score_reads_its_fields_by_name():
    scored = Score(0.5, "half", {"passed": 1, "total": 2})
    assert (scored["score"], scored["reason"], scored["total"]) == (0.5, "half", 2)
    assert scored.as_dict() == {"score": 0.5, "passed": 1, "total": 2}
    assert list(scored.as_dict(("score", "total", "reason"))) == ["score", "total", "reason"]
    with pytest.raises(KeyError):
        scored["route"]
    assert Score(1.0).as_dict() == {"score": 1.0} and Score(1.0).reason == ""
    assert Score(1.0).failure == ""  # a verdict, unless the scorer says it could not judge


def test_a_score_that_is_no_verdict_is_raised_by_verls_adapter():
    from entropyrl.verl.rewards import verl_dict

    judged = Score(0.0, "wrong answer", {"passed": 0})
    assert verl_dict(judged, ("score", "acc", "reason", "passed")) == {
        "score": 0.0,
        "acc": 0.0,
        "reason": "wrong answer",
        "passed": 0,
    }
    unjudged = Score(0.0, "checker down", {"passed": 0}, failure="math check timed out after 45 s")
    with pytest.raises(ScoringFailed, match=r"^math check timed out after 45 s$"):
        verl_dict(unjudged, ("score",))


def test_same_length_names_every_sequence():
    assert same_length(a=[1], b="x", c=(2,)) == 1
    with pytest.raises(ValueError, match=r"^a \(1\), b \(2\) and c \(0\) must have the same"):
        same_length(a=[1], b=[1, 2], c=[])


# ---------------------------------------------------------------------------- function calling
def test_function_calling_entry_points_give_the_scorers_values():
    from entropyrl.verl.rewards import function_calling_score

    texts, truths, infos = (list(column) for column in zip(*FC_ROWS))
    scored = FunctionCallingScorer().score_batch(texts, truths, infos)
    assert [s.score for s in scored] == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert [s.reason for s in scored][:2] == ["ok", "ok"]
    assert scored[3].reason.startswith("format:") and scored[3]["format_ok"] is False
    for (text, truth, info), one in zip(FC_ROWS, scored):
        assert function_calling_score("fc", text, truth, info) == {
            "score": one.score,
            "acc": one.score,
        }
        with pytest.warns(DeprecationWarning, match="FunctionCallingScorer"):
            assert compute_score(text, truth, info) == one.score  # the deprecated path
        assert score_details(text, truth, info) == one.as_dict(DETAIL_KEYS)


# ---------------------------------------------------------------------------- math and code
def test_math_scorer_gives_score_maths_values():
    pytest.importorskip("math_verify")
    from entropyrl.rewards.math_answer import MathScorer, score_math

    texts, truths = (list(column) for column in zip(*MATH_ROWS))
    scored = MathScorer().score_batch(texts, truths, [None] * len(texts))
    assert [s.score for s in scored] == [1.0, 0.0, 0.0]
    for (text, truth), one in zip(MATH_ROWS, scored):
        direct = score_math(text, truth)
        assert (one.score, one.reason, one["extracted"]) == (
            direct.score,
            direct.reason,
            direct.extracted,
        )


def test_code_scorers_give_the_functions_values(sandbox):
    texts, truths = (list(column) for column in zip(*CODE_ROWS))
    scored = CodeScorer(sandbox, "fraction").score_batch(texts, truths, [None] * len(texts))
    assert [s.score for s in scored] == [1.0, 0.5, 0.0]
    for (text, truth), one in zip(CODE_ROWS, scored):
        direct = score_code(text, truth, sandbox=sandbox, mode="fraction")
        assert (one.score, one.reason, one["passed"], one["total"], one["statuses"]) == (
            direct.score,
            direct.reason,
            direct.passed,
            direct.total,
            direct.statuses,
        )


def test_sandbox_fusion_scorer_gives_the_functions_values():
    pytest.importorskip("verl")
    url = dead_url()
    one = score_one(SandboxFusionScorer(url), ADD, ADD_TESTS)
    direct = score_code_sandbox_fusion(ADD, ADD_TESTS, url=url)
    assert (one.score, one.reason, one["passed"], one["total"]) == (
        direct.score,
        direct.reason,
        direct.passed,
        direct.total,
    )
    assert one.score == 0.0 and one.reason.startswith("sandbox fusion unreachable")


# ---------------------------------------------------------------------------- the hybrid router
def test_hybrid_entry_point_gives_the_scorers_values_on_a_mixed_batch(tmp_path):
    pytest.importorskip("math_verify")
    from entropyrl.rewards.hybrid import RESULT_KEYS, HybridScorer
    from entropyrl.verl.rewards import hybrid_score

    settings = {"unknown_ability": "zero", "code_score": "fraction", "tmp_root": str(tmp_path)}
    settings |= FAST
    rows = [(text, truth, {"ability": "math"}) for text, truth in MATH_ROWS]
    rows += [(text, truth, {"ability": "code"}) for text, truth in CODE_ROWS]
    rows.insert(2, ("x", "1", {"ability": "poetry"}))
    texts, truths, infos = (list(column) for column in zip(*rows))
    scored = HybridScorer.from_settings(**settings).score_batch(texts, truths, infos)
    assert [s["route"] for s in scored] == ["math", "math", "none", "math", "code", "code", "code"]
    assert [s.score for s in scored] == [1.0, 0.0, 0.0, 0.0, 1.0, 0.5, 0.0]
    for (text, truth, info), one in zip(rows, scored):
        assert hybrid_score("set", text, truth, info, **settings) == one.as_dict(RESULT_KEYS)


def test_hybrid_hands_each_route_its_rows_at_once():
    from entropyrl.rewards.hybrid import HybridScorer

    class Recording:
        def __init__(self):
            self.calls = []

        def score_batch(self, solutions, ground_truths, extra_infos):
            self.calls.append(list(solutions))
            return [Score(1.0, "ok", {"passed": 2, "total": 2}) for _ in solutions]

    math_rows, code_rows = Recording(), Recording()
    hybrid = HybridScorer(math_rows, lambda: code_rows)
    infos = [{"ability": a} for a in ("code", "math", "code", "math")]
    scored = hybrid.score_batch(["c1", "m1", "c2", "m2"], ["1"] * 4, infos)
    assert math_rows.calls == [["m1", "m2"]] and code_rows.calls == [["c1", "c2"]]
    assert [s["route"] for s in scored] == ["code", "math", "code", "math"]
    assert [(s["passed"], s["total"]) for s in scored] == [(2, 2), (1, 1), (2, 2), (1, 1)]

    def no_code():
        raise AssertionError("the code scorer was built for a batch without code rows")

    assert HybridScorer(math_rows, no_code).score_batch(["m"], ["1"], [{"ability": "math"}])


# ---------------------------------------------------------------------------- captions
def test_caption_entry_point_gives_the_scorers_values(cider, tmp_path, monkeypatch):
    """verl's caption_score (no CHAIR service: CIDEr-D only) and the scorer, row by row."""
    from entropyrl.verl import rewards

    monkeypatch.delenv("ENTROPYRL_CHAIR_URL", raising=False)
    cider_df = tmp_path / "cider_df.json.gz"
    cider.save(cider_df)
    truths = [json.dumps({"image_id": i, "references": REFERENCES[i]}) for i, _ in CAPTIONS]
    texts = [caption for _, caption in CAPTIONS]

    async def through_verl():
        calls = [
            rewards.caption_score("coco", text, truth, {}, cider_df=str(cider_df))
            for text, truth in zip(texts, truths)
        ]
        return await asyncio.gather(*calls)

    rewards._BATCHERS.clear()
    try:
        rows = asyncio.run(through_verl())
        (batcher,) = rewards._BATCHERS.values()
        assert batcher.batches_scored == 1  # three calls, one score_batch
    finally:
        rewards._BATCHERS.clear()
    scored = CaptionReward(CiderD.load(cider_df)).score_batch(texts, truths, [{}] * len(texts))
    assert len(scored) == len(rows) == len(CAPTIONS)
    for row, one in zip(rows, scored):
        assert list(row) == list(CAPTION_FIELDS)
        assert same(row, one.as_dict(CAPTION_FIELDS))
        assert row["chair_ok"] is False and row["chair_fallback"] is False


def test_caption_scorer_rows_are_the_batch_arrays(cider):
    """score_batch (verl's rows) against the array call on the same captions, with CHAIR."""
    scorer_module = pytest.importorskip("chair_server.scorer")
    chair = scorer_module.ChairScorer.from_ground_truth(CHAIR_TRUTH)

    class InProcess:
        def __init__(self):
            self.calls = 0

        def score(self, items):
            self.calls += 1
            return chair.score(items)

    client = InProcess()
    reward = CaptionReward(cider, client, chair_weight=1.0, recall_weight=0.5)
    truths = [{"image_id": i, "references": REFERENCES[i]} for i, _ in CAPTIONS]
    texts = [caption for _, caption in CAPTIONS]
    scored = reward.score_batch(texts, truths, [None] * len(texts))
    assert client.calls == 1
    arrays = reward(texts, [i for i, _ in CAPTIONS], [REFERENCES[i] for i, _ in CAPTIONS])
    for i, one in enumerate(scored):
        assert isinstance(one, Score) and one.reason == ""
        assert one.score == arrays.scores[i] and one["chair_i"] == arrays.chair_i[i]
        assert (one["cider"], one["recall"]) == (arrays.cider[i], arrays.recall[i])
        assert one["chair_ok"] is True and one["chair_fallback"] is False
    assert scored[1]["chair_i"] > 0  # the giraffe is not in image 1
    parsed = [caption_ground_truth(truth) for truth in truths]  # the parsed pair is accepted too
    again = reward.score_batch(texts, parsed, [None] * len(texts))
    assert [one.as_dict() for one in again] == [one.as_dict() for one in scored]
    assert scored.metrics() == arrays.metrics()
