"""EXPERIMENT=penalty: the reward entry passes ``chair_penalty`` on to the caption reward."""

from __future__ import annotations

import asyncio
import json

import pytest

from entropyrl.rewards.cider import CiderD
from entropyrl.verl import rewards

REFERENCES = {1: ["a dog and a cat on a sofa", "a cat sits next to a dog"]}


def test_a_count_penalty_reaches_the_reward_as_a_count(tmp_path) -> None:
    """One hallucinated mention of two: the count penalty costs 1, the fraction 0.5."""
    from chair_server import launch

    cider_df = tmp_path / "df.json.gz"
    CiderD.from_references(REFERENCES).save(cider_df)
    truth = tmp_path / "truth.json"
    truth.write_text(json.dumps({"1": ["dog", "cat", "couch"]}))
    server = launch.start_server(ground_truth=truth, port=0, restart=False)
    loop = asyncio.new_event_loop()
    rewards._BATCHERS.clear()

    def score(penalty: str) -> float:
        call = rewards.caption_score(
            "coco_caption",
            "a dog next to a giraffe",
            json.dumps({"image_id": 1, "references": REFERENCES[1]}),
            {},
            cider_df=str(cider_df),
            chair_url=server.url,
            chair_weight=1.0,
            chair_penalty=penalty,
        )
        return loop.run_until_complete(call)["score"]

    try:
        fraction, count = score("fraction"), score("count")
    finally:
        server.stop()
        loop.close()
        rewards._BATCHERS.clear()
    assert fraction - count == pytest.approx(0.5)
