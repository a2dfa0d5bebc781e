"""Reward functions as verl loads them (`get_custom_reward_fn` on our composed config): their
one home, and every one reporting the calls that fail (`entropyrl.verl.failures.reward_failures`)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import math
import socket
from pathlib import Path

import pytest

from entropyrl.rewards.caption import CAPTION_FIELDS, CaptionReward
from entropyrl.rewards.cider import CiderD
from entropyrl.rewards.hybrid import RESULT_KEYS
from entropyrl.verl import rewards

REFERENCES = {
    1: ["a dog and a cat on a sofa", "a cat sits next to a dog", "two pets on a couch"],
    2: ["a man riding a bike", "a person on a bicycle in the street", "a cyclist on the road"],
}
CAPTIONS = [
    (1, "a dog and a cat on a sofa"),
    (1, "a dog next to a giraffe"),
    (2, "a man riding a bike"),
    (2, "a person with a surfboard on a bicycle"),
    (1, "two pets"),
    (2, "a cyclist"),
]


@pytest.fixture(scope="module")
def cider_df(tmp_path_factory):
    path = tmp_path_factory.mktemp("cider") / "cider_df.json.gz"
    CiderD.from_references(REFERENCES).save(path)
    return path


@pytest.fixture(scope="module")
def chair_service(tmp_path_factory):
    launch = pytest.importorskip("chair_server.launch")
    truth = tmp_path_factory.mktemp("chair") / "truth.json"
    truth.write_text(json.dumps({"1": ["dog", "cat", "couch"], "2": ["person", "bicycle"]}))
    server = launch.start_server(ground_truth=truth, timeout=120.0)
    yield server
    server.stop()


def load_caption_reward(compose, cider_df, chair_url, **kwargs):
    from verl.trainer.ppo.reward import get_custom_reward_fn

    prefix = "reward.custom_reward_function.reward_kwargs"
    overrides = [f"{prefix}.cider_df={cider_df}", f"{prefix}.chair_url={chair_url}"]
    overrides += [f"{prefix}.{key}={value}" for key, value in kwargs.items()]
    return get_custom_reward_fn(compose("chair_mscoco", overrides))


def ground_truth(image_id: int) -> str:
    return json.dumps({"image_id": image_id, "references": REFERENCES[image_id]})


async def score_all(fn):
    return await asyncio.gather(
        *[
            fn(
                data_source="coco_caption",
                solution_str=caption,
                ground_truth=ground_truth(image_id),
                extra_info={},
            )
            for image_id, caption in CAPTIONS
        ]
    )


def test_caption_reward_batches_one_chair_call(compose, cider_df, chair_service):
    from entropyrl.rewards.chair_client import ChairClient

    rewards._BATCHERS.clear()
    fn = load_caption_reward(
        compose, cider_df, chair_service.url, chair_weight=1.0, recall_weight=0.5
    )
    results = asyncio.run(score_all(fn))
    batchers = list(rewards._BATCHERS.values())
    assert len(batchers) == 1 and batchers[0].batches_scored == 1  # six captions, one call
    reward = CaptionReward(
        CiderD.load(cider_df),
        ChairClient(chair_service.url),
        chair_weight=1.0,
        recall_weight=0.5,
    )
    direct = reward(
        [c for _, c in CAPTIONS],
        [i for i, _ in CAPTIONS],
        [REFERENCES[i] for i, _ in CAPTIONS],
    )
    # The scorer verl's entry point runs, on the same rows: the same dicts, to the last key.
    scored = reward.score_batch(
        [c for _, c in CAPTIONS], [ground_truth(i) for i, _ in CAPTIONS], [{}] * len(CAPTIONS)
    )
    assert results == [one.as_dict(CAPTION_FIELDS) for one in scored]
    for i, row in enumerate(results):
        assert set(row) == {
            "score",
            "cider",
            "chair_i",
            "chair_s",
            "recall",
            "hallucinated",
            "words",
            "chair_ok",
            "chair_fallback",
            "hallucinated_spans",
        }
        assert row["words"] == len(CAPTIONS[i][1].rstrip(".").split())
        # each hallucinated mention's [start, end) in the caption, as a JSON string
        spans = json.loads(row["hallucinated_spans"])
        assert len(spans) == row["hallucinated"]
        assert all(0 <= a < b <= len(CAPTIONS[i][1]) for a, b in spans)
        assert row["chair_ok"] is True and row["chair_fallback"] is False
        assert row["score"] == pytest.approx(float(direct.scores[i]))
        assert row["chair_i"] == pytest.approx(float(direct.chair_i[i]))
    assert results[0]["chair_i"] == 0.0
    assert results[1]["chair_i"] > 0  # the giraffe is not in image 1
    [(start, end)] = json.loads(results[1]["hallucinated_spans"])
    assert CAPTIONS[1][1][start:end].startswith("giraffe")


def test_caption_reward_without_service_falls_back_to_cider(compose, cider_df):
    rewards._BATCHERS.clear()
    fn = load_caption_reward(
        compose,
        cider_df,
        "http://127.0.0.1:9",  # discard port: nothing listens
        chair_weight=1.0,
        chair_retries=0,
        chair_timeout=0.5,
    )
    results = asyncio.run(score_all(fn))
    cider = CiderD.load(cider_df)
    for (image_id, caption), row in zip(CAPTIONS, results):
        assert row["chair_ok"] is False
        assert row["chair_fallback"] is True  # unreachable: counted as the fallback
        assert math.isnan(row["chair_i"])
        assert row["score"] == pytest.approx(cider.score(caption, REFERENCES[image_id]))


def test_caption_reward_needs_cider_df():
    with pytest.raises(ValueError, match="cider_df"):
        asyncio.run(rewards.caption_score("coco", "a dog", ground_truth(1)))


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"references": ["x"]}, "image_id"),
        ({"image_id": 1}, "references"),
        ({"image_id": 1, "references": []}, "references"),
        ("not json", "JSON"),
        (42, "image_id"),
    ],
)
def test_caption_ground_truth_errors_name_the_field(value, field):
    with pytest.raises(ValueError, match=field):
        rewards.caption_ground_truth(value)


def test_caption_ground_truth_forms():
    assert rewards.caption_ground_truth(ground_truth(2)) == (2, REFERENCES[2])
    assert rewards.caption_ground_truth({"image_id": "7", "captions": "a b"}) == (7, ["a b"])


def test_batcher_propagates_errors_to_every_waiter():
    class Broken:
        def score_batch(self, solutions, ground_truths, extra_infos):
            raise RuntimeError("scorer down")

    batcher = rewards.CaptionBatcher(Broken(), batch_window_s=0.01, max_batch=2)

    async def run():
        return await asyncio.gather(
            *[batcher.score("a", (1, ["b"])) for _ in range(3)], return_exceptions=True
        )

    outcomes = asyncio.run(run())
    assert all(isinstance(o, RuntimeError) for o in outcomes)


def test_function_calling_reward_as_verl_loads_it(compose):
    from verl.trainer.ppo.reward import get_custom_reward_fn

    fn = get_custom_reward_fn(compose("egpo_function_calling"))
    truth = json.dumps([{"name": "get_weather", "arguments": {"city": "Paris"}}])
    good = '<think>need weather</think><tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    bad = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    assert (
        fn(data_source="fc", solution_str=good, ground_truth=truth, extra_info={})["score"] == 1.0
    )
    assert fn(data_source="fc", solution_str=bad, ground_truth=truth, extra_info={})["score"] == 0.0


def test_the_client_reads_the_token_variable_the_service_reads(monkeypatch) -> None:
    from entropyrl.verl.rewards import chair_token

    monkeypatch.delenv("CHAIR_SERVER_TOKEN", raising=False)
    assert chair_token() is None
    monkeypatch.setenv("CHAIR_SERVER_TOKEN", "s3cret")
    assert chair_token() == "s3cret"
    monkeypatch.setenv("CHAIR_SERVER_TOKEN", "")
    assert chair_token() is None


# ---------------------------------------------------------------------------- one home, all reported
PLANTED = Path(__file__).parent / "planted" / "failing_scorers.py"
ENTRY_POINTS = ("caption_score", "function_calling_score", "hybrid_score")
RECIPES = {
    "chair_mscoco": "caption_score",
    "egpo_function_calling": "function_calling_score",
    "grpo_function_calling": "function_calling_score",
    "egpo_ratio_mixed": "hybrid_score",
}
FAILED = "reward call failed: "  # the line `reward_failures.report` logs for each failure


def planted():
    spec = importlib.util.spec_from_file_location("planted_failing_scorers", PLANTED)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dead_url() -> str:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}/run_code"


@pytest.fixture
def caplog(caplog, monkeypatch):
    """The failures logged, each message seen afresh (a process logs each message once)."""
    from entropyrl.verl.failures import reward_failures

    monkeypatch.setattr(reward_failures, "_logged", set())
    caplog.set_level(logging.ERROR, logger="entropyrl.verl.failures.reward_failures")
    return caplog


def failures_logged(caplog) -> list[str]:
    return [
        r.getMessage().removeprefix(FAILED)
        for r in caplog.records
        if r.name == "entropyrl.verl.failures.reward_failures" and r.getMessage().startswith(FAILED)
    ]


@pytest.mark.parametrize(("recipe", "name"), sorted(RECIPES.items()))
def test_every_recipe_names_an_entry_point_of_the_one_home(compose, recipe, name):
    from verl.trainer.ppo.reward import get_custom_reward_fn

    config = compose(recipe)
    reward = config.reward.custom_reward_function
    assert (reward.path, reward.name) == ("pkg://entropyrl.verl.rewards", name)
    assert name in ENTRY_POINTS and name in rewards.__all__
    assert callable(get_custom_reward_fn(config))  # verl finds it where the recipe says


def test_the_mixed_recipes_reward_as_verl_loads_it(compose, tmp_path):
    pytest.importorskip("math_verify")
    from verl.trainer.ppo.reward import get_custom_reward_fn

    prefix = "reward.custom_reward_function.reward_kwargs"
    fn = get_custom_reward_fn(compose("egpo_ratio_mixed", [f"+{prefix}.tmp_root={tmp_path}"]))
    program = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    tests = json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]})
    math_row = fn(
        data_source="gsm",
        solution_str=r"\boxed{4}",
        ground_truth="4",
        extra_info={"ability": "math"},
    )
    code_row = fn(
        data_source="apps", solution_str=program, ground_truth=tests, extra_info={"ability": "code"}
    )
    assert (math_row["score"], math_row["route"]) == (1.0, "math")
    assert (code_row["score"], code_row["route"], code_row["passed"]) == (1.0, "code", 1)


def test_every_entry_point_is_reported():
    # verl awaits a coroutine function and runs a plain one in an executor: each keeps its kind
    for name in ENTRY_POINTS:
        function = getattr(rewards, name)
        assert function.__name__ == name
        assert hasattr(function, "__wrapped__"), f"{name} is not wrapped in `reported`"


@pytest.mark.parametrize(
    ("name", "arguments", "settings", "cause"),
    [
        ("function_calling_score", ("<tool_call>", object()), {}, "ValueError: ground_truth must"),
        # a crash of the code sandbox: its run folder cannot be made
        ("hybrid_score", ("```python\nprint(1)\n```", "{}"), {}, "FileNotFoundError: "),
        # Sandbox Fusion does not answer: no verdict, reported instead of scored 0 in silence
        (
            "hybrid_score",
            ("```python\nprint(1)\n```", "{}"),
            {"dead": True},
            "ScoringFailed: sandbox",
        ),
        ("hybrid_score", (r"\boxed{1}", "1"), {"ability": "poetry"}, "ValueError: unknown ability"),
    ],
    ids=["fc-broken-row", "hybrid-sandbox-crash", "hybrid-service-down", "hybrid-unknown-ability"],
)
def test_a_failed_call_is_reported_with_its_cause(
    caplog, tmp_path, name, arguments, settings, cause
):
    caplog.set_level(logging.ERROR, logger="entropyrl.verl.failures.reward_failures")
    settings = dict(settings)  # the parameter is shared by every run of this test in a process
    solution, truth = arguments
    info = {"ability": settings.pop("ability", "code" if name == "hybrid_score" else None)}
    if name == "hybrid_score":
        truth = json.dumps({"inputs": ["\n"], "outputs": ["1\n"]}) if truth == "{}" else truth
        settings = (
            {"code_backend": "sandbox_fusion", "sandbox_fusion_url": dead_url()}
            if settings.pop("dead", False)
            else {"tmp_root": str(tmp_path / "gone")}
        )
    with pytest.raises(Exception) as raised:
        getattr(rewards, name)("set", solution, truth, info, **settings)
    assert [line.startswith(cause) for line in failures_logged(caplog)] == [True], raised.value


def test_the_caption_reward_reports_a_broken_row_and_a_missing_file(caplog, tmp_path):
    with pytest.raises(ValueError, match="ground_truth is not JSON"):
        asyncio.run(rewards.caption_score("coco", "a dog", "{not json", {}, cider_df="x.json.gz"))
    gone = tmp_path / "gone.json.gz"
    with pytest.raises(FileNotFoundError):
        asyncio.run(rewards.caption_score("coco", "a dog", ground_truth(1), {}, cider_df=str(gone)))
    rewards._BATCHERS.clear()
    logged = failures_logged(caplog)
    assert logged[0].startswith("ValueError: ground_truth is not JSON")
    assert logged[1].startswith("FileNotFoundError: ")


@pytest.mark.parametrize("kind", ["cannot-judge", "crashes"])
def test_a_planted_failing_scorer_is_reported_by_every_entry_point(caplog, cider_df, kind):
    """The scorer behind each entry point replaced by one that fails: the call raises, and what
    it raised is reported with its cause, never returned as a score."""
    module = planted()
    error = rewards.ScoringFailed if kind == "cannot-judge" else OSError

    def scorer(name: str):
        cause = f"the planted {kind} scorer behind {name}"
        return (
            module.CannotJudge(cause) if kind == "cannot-judge" else module.Crashes(OSError(cause))
        )

    keys = {"function_calling_score": ("score", "acc"), "hybrid_score": RESULT_KEYS}
    for name, fields in keys.items():  # built as the real ones are
        entry = rewards.per_response(name, lambda _name=name, **_: scorer(_name), fields)
        with pytest.raises(error, match=f"behind {name}"):
            entry("set", "x", "1", {})
    settings = {"cider_df": str(cider_df), "chair_url": None}

    async def caption_call():
        batcher = caption_batcher(settings)  # the batcher the entry point will use
        batcher.reward = scorer("caption_score")
        return await rewards.caption_score("coco", "a dog", ground_truth(1), {}, **settings)

    rewards._BATCHERS.clear()
    try:
        with pytest.raises(error, match="behind caption_score"):
            asyncio.run(caption_call())
    finally:
        rewards._BATCHERS.clear()
    assert failures_logged(caplog) == [
        f"{error.__name__}: the planted {kind} scorer behind {name}"
        for name in ("function_calling_score", "hybrid_score", "caption_score")
    ]


def caption_batcher(settings):
    return rewards.caption_batcher(
        cider_df=settings["cider_df"],
        chair_url=None,
        chair_weight=0.0,
        recall_weight=0.0,
        chair_timeout=30.0,
        chair_retries=2,
        batch_window_s=0.05,
        max_batch=256,
    )


@pytest.mark.slow
@pytest.mark.ray
def test_the_trainer_reads_the_hybrid_rewards_failures_with_their_cause(tmp_path):
    """On Ray, as in a run: reward calls on a worker fail (Sandbox Fusion down, the sandbox
    cannot start), the job's book holds them with their node, and the trainer's accounting of
    the step names them instead of "no reward call reported a failure"."""
    ray = pytest.importorskip("ray")
    from entropyrl.verl.failures import lost_samples, reward_failures

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:

        @ray.remote(num_cpus=0)
        def reward_worker(settings: dict) -> str:
            from entropyrl.verl.rewards import hybrid_score

            tests = json.dumps({"inputs": ["\n"], "outputs": ["1\n"]})
            try:
                hybrid_score(
                    "set", "```python\nprint(1)\n```", tests, {"ability": "code"}, **settings
                )
            except Exception as error:
                return type(error).__name__
            return "scored"

        down = {"code_backend": "sandbox_fusion", "sandbox_fusion_url": dead_url()}
        crash = {"tmp_root": str(tmp_path / "gone")}
        outcomes = ray.get([reward_worker.remote(s) for s in (down, down, crash)])
        assert outcomes == ["ScoringFailed", "ScoringFailed", "FileNotFoundError"]
        failures = reward_failures.drain()
        assert reward_failures.drain() == []  # each failure is counted once
    finally:
        ray.shutdown()
    counts = {failure.message.split(":")[0]: count for failure, count in failures}
    assert counts == {"ScoringFailed": 2, "FileNotFoundError": 1}
    assert all(failure.node and failure.kind == reward_failures.ERROR for failure, _ in failures)
    verdict = lost_samples.account(
        where="step 1", expected=20, received=17, failures=failures, max_fraction=0.15
    )
    assert verdict.stop is None and verdict.metrics["rollout/reward_failures"] == 3
    assert "; reward calls failed: " in verdict.warning
    assert "2x ScoringFailed: sandbox fusion unreachable or failing: " in verdict.warning
    assert "no reward call reported a failure" not in verdict.warning
    over = lost_samples.account(
        where="step 1", expected=20, received=17, failures=failures, max_fraction=0.0
    )
    assert "1x FileNotFoundError: " in over.stop
