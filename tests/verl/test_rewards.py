"""Reward functions as verl loads them (`get_custom_reward_fn` on our composed config)."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from entropyrl.rewards.caption import CAPTION_FIELDS, CaptionReward
from entropyrl.rewards.cider import CiderD
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
        }
        assert row["words"] == len(CAPTIONS[i][1].rstrip(".").split())
        assert row["chair_ok"] is True and row["chair_fallback"] is False
        assert row["score"] == pytest.approx(float(direct.scores[i]))
        assert row["chair_i"] == pytest.approx(float(direct.chair_i[i]))
    assert results[0]["chair_i"] == 0.0
    assert results[1]["chair_i"] > 0  # the giraffe is not in image 1


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
