"""The hf rollout's reproducible modes, without Ray: seeded decoding under verl's
`rollout.full_determinism`, and the recording that a later run replays (the replay path itself,
which goes through a named Ray actor, runs in tests/rig/smoke/test_ranks.py)."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from PIL import Image

from entropyrl.rig.cpu import hf_rollout
from entropyrl.rig.cpu.hf_rollout import RECORD_ENV, ReplayStore, prompt_key, read_recording

PARAMS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}


@pytest.fixture(scope="module")
def tokenizer():
    from entropyrl.rig.tokenizer import build_qwen_tokenizer

    return build_qwen_tokenizer(num_ranks=8192)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tokenizer):
    from entropyrl.rig.smoke.assets import _save_checkpoint
    from entropyrl.rig.tiny import TinyModelConfig, build_tiny_qwen2

    folder = tmp_path_factory.mktemp("text") / "model"
    model = build_tiny_qwen2(tokenizer, TinyModelConfig(hidden_size=64), seed=2)
    _save_checkpoint(model, tokenizer, None, folder)
    return folder


def make_server(compose, checkpoint, replica_rank: int = 0, **rollout):
    from omegaconf import OmegaConf

    overrides = [
        f"actor_rollout_ref.model.path={checkpoint}",
        "data.max_prompt_length=64",
        "data.max_response_length=12",
        *[f"actor_rollout_ref.rollout.{k}={v}" for k, v in rollout.items()],
    ]
    config = OmegaConf.create(
        OmegaConf.to_container(compose("chair_mscoco", overrides), resolve=True)
    )
    return hf_rollout.HFRolloutServer(
        config.actor_rollout_ref.rollout, config.actor_rollout_ref.model, replica_rank=replica_rank
    )


def prompts(tokenizer) -> list[list[int]]:
    texts = ("hello", "name three animals", "count to five")
    return [
        tokenizer.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
        for text in texts
    ]


def serve(server, requests: list[list[int]]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """All requests at once (they queue together), as verl's agent loop sends a step's."""

    async def run():
        outputs = await asyncio.gather(
            *[server.generate(ids, dict(PARAMS), f"r{i}") for i, ids in enumerate(requests)]
        )
        return [(tuple(ids), tuple(out.token_ids)) for ids, out in zip(requests, outputs)]

    return asyncio.run(run())


def test_full_determinism_gives_the_same_responses_whatever_the_arrival_order(
    compose, checkpoint, tokenizer
):
    requests = [ids for ids in prompts(tokenizer) for _ in range(4)]  # n = 4 per prompt
    shuffled = list(requests)
    random.Random(1).shuffle(shuffled)
    # Two servers (two runs) with another replica rank: the seed is the request's, not the
    # replica's.
    first = serve(make_server(compose, checkpoint, 0, full_determinism=True), requests)
    second = serve(make_server(compose, checkpoint, 1, full_determinism=True), shuffled)
    assert sorted(first) == sorted(second)
    # The n samples of a prompt are different draws, not one draw repeated.
    for ids in prompts(tokenizer):
        responses = [out for prompt, out in first if list(prompt) == ids]
        assert len(set(responses)) > 1


def test_default_sampling_depends_on_what_is_decoded_together(compose, checkpoint, tokenizer):
    """Why the deterministic mode exists: batched decoding shares one random stream."""
    requests = [ids for ids in prompts(tokenizer) for _ in range(4)]
    shuffled = list(requests)
    random.Random(1).shuffle(shuffled)
    first = serve(make_server(compose, checkpoint), requests)
    second = serve(make_server(compose, checkpoint), shuffled)
    assert sorted(first) != sorted(second)


def test_recording_holds_every_served_response_keyed_by_prompt(
    compose, checkpoint, tokenizer, tmp_path, monkeypatch
):
    path = tmp_path / "rollouts.jsonl"
    monkeypatch.setenv(RECORD_ENV, str(path))
    server = make_server(compose, checkpoint, full_determinism=True)
    asyncio.run(server.set_global_steps(1))
    requests = [ids for ids in prompts(tokenizer) for _ in range(2)]
    served = serve(server, requests)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == len(requests) and {row["step"] for row in rows} == {1}
    recorded = read_recording(path)
    assert set(recorded) == {prompt_key(ids) for ids in prompts(tokenizer)}
    for prompt, tokens in served:
        assert any(list(tokens) == got for got, _ in recorded[prompt_key(list(prompt))])
    for answers in recorded.values():
        for tokens, log_probs in answers:
            assert len(tokens) == len(log_probs) and all(lp <= 0 for lp in log_probs)


def test_replay_store_hands_each_recorded_response_out_once_in_order(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    lines = [
        {"prompt": "a", "step": 1, "token_ids": [1, 2], "log_probs": [-0.1, -0.2]},
        {"prompt": "b", "step": 1, "token_ids": [3], "log_probs": [-0.3]},
        {"prompt": "a", "step": 1, "token_ids": [4], "log_probs": [-0.4]},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    store = ReplayStore(str(path))
    assert store.left() == 3
    assert store.take("a") == ([1, 2], [-0.1, -0.2])
    assert store.take("b") == ([3], [-0.3])
    assert store.take("a") == ([4], [-0.4])
    assert store.take("a") is None and store.take("unknown") is None and store.left() == 0
    path.write_text('{"prompt": "a"}\n')
    with pytest.raises(ValueError, match=":1: not a recorded rollout line"):
        ReplayStore(str(path))


def test_prompt_key_tells_images_apart():
    ids = [1, 2, 3]
    red, blue = Image.new("RGB", (8, 8), (255, 0, 0)), Image.new("RGB", (8, 8), (0, 0, 255))
    assert prompt_key(ids, [red]) == prompt_key(ids, [Image.new("RGB", (8, 8), (255, 0, 0))])
    assert prompt_key(ids, [red]) != prompt_key(ids, [blue]) != prompt_key(ids)
    assert prompt_key(ids) != prompt_key([1, 2, 4])
