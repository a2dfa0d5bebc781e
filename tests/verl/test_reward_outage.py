"""The verl caption reward when its CHAIR service dies and comes back: the reward path logs one
line each way, skips the dead service instead of paying retries per batch, and scores again."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import time

import pytest

from entropyrl.rewards.cider import CiderD
from entropyrl.verl import rewards

REFERENCES = {1: ["a dog and a cat on a sofa", "a cat sits next to a dog"]}


def test_reward_path_reports_the_outage_and_recovers(tmp_path, caplog) -> None:
    launch = pytest.importorskip("chair_server.launch")
    caplog.set_level(logging.WARNING, logger="entropyrl.rewards.chair_client")
    cider_df = tmp_path / "cider_df.json.gz"
    CiderD.from_references(REFERENCES).save(cider_df)
    truth = tmp_path / "truth.json"
    truth.write_text(json.dumps({"1": ["dog", "cat", "couch"]}))
    server = launch.start_server(ground_truth=truth, restart=False)
    url, port = server.url, server.port
    loop = asyncio.new_event_loop()  # one loop: one batcher, one client, as in a verl worker
    rewards._BATCHERS.clear()

    def score() -> dict:
        call = rewards.caption_score(
            "coco_caption",
            "a dog next to a giraffe",
            json.dumps({"image_id": 1, "references": REFERENCES[1]}),
            {},
            cider_df=str(cider_df),
            chair_url=url,
            chair_weight=1.0,
            chair_retries=1,
        )
        return loop.run_until_complete(call)

    try:
        assert score()["chair_ok"]
        os.kill(server.pid, signal.SIGKILL)
        server.stop()
        assert score()["chair_fallback"]
        (batcher,) = rewards._BATCHERS.values()
        client = batcher.reward.chair_client
        requests = client.stats["requests"]
        assert score()["chair_fallback"]  # the open circuit: no request, no retry
        assert client.stats["requests"] == requests
        server = launch.start_server(ground_truth=truth, port=port, restart=False)
        deadline = time.monotonic() + 60
        while not (row := score())["chair_ok"]:  # scores come back after the cooldown's probe
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert row["chair_i"] == pytest.approx(0.5)
    finally:
        server.stop()
        loop.close()
        rewards._BATCHERS.clear()
    lines = [r.getMessage() for r in caplog.records if r.name == "entropyrl.rewards.chair_client"]
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"CHAIR service at {url} stopped answering")
    assert lines[1].startswith(f"CHAIR service at {url} answers again")


@pytest.mark.slow
@pytest.mark.xdist_group("wrong_token")
def test_a_token_the_service_refuses_stops_the_run_with_one_line(
    smoke_script, smoke_cache, tmp_path, monkeypatch
) -> None:
    """The reward workers hold a token the CHAIR service refuses (a node whose `ray start` had
    another CHAIR_SERVER_TOKEN): the caption smoke stops at start, before any worker, non-zero,
    with the line that names the node and the token on the driver's stderr
    (`entropyrl.verl.checks.nodes`), instead of training without CHAIR or dying later in
    TransferQueue without the cause."""
    from chair_server import launch

    truth = tmp_path / "truth.json"
    truth.write_text(json.dumps({"1": ["dog"]}))
    monkeypatch.setenv("CHAIR_SERVER_TOKEN", "the-service-token")
    server = launch.start_server(ground_truth=truth, restart=False)
    try:
        run = smoke_script(
            "chair_mscoco.sh",
            tmp_path / "out",
            smoke_cache,
            f"reward.custom_reward_function.reward_kwargs.chair_url={server.url}",
            env={"CHAIR_SERVER_TOKEN": "a-token-of-another-node"},
        )
    finally:
        server.stop()
    assert run.returncode != 0, run.tail()
    # the launch relays the node check's stop, then says the trainer exited
    stops = [
        line
        for line in run.stderr.splitlines()
        if line.startswith("smoke: entropyrl: a node lacks what the run reads there")
    ]
    assert stops, run.tail()
    last = stops[-1]
    assert re.search(
        rf"node \S+ \(\S+\): the CHAIR service at {re.escape(server.url)} refuses the run's "
        r"token \(HTTP 401\): set CHAIR_SERVER_TOKEN to the service's token on this node "
        r"\(before `ray start`\)$",
        last,
    ), last
    assert "validation at step 0" not in run.stderr  # stopped before any step
    assert "smoke check passed" not in run.stdout
