"""The caption reward says which response tokens carry each hallucinated mention: the scorer
verl's caption_score runs, and the local runner's captioning task, over the real CHAIR service."""

from __future__ import annotations

import json

import pytest
import torch

from chair_server.launch import start_server
from entropyrl.core.token_credit import hallucinated_token_mask
from entropyrl.rewards.caption import CAPTION_FIELDS, TOKEN_POSITIONS_KEY, CaptionReward
from entropyrl.rewards.chair_client import ChairClient
from entropyrl.rewards.cider import CiderD

CORPUS = {
    1: ["a dog runs on the grass", "a brown dog running in a field"],
    2: ["a cat sleeps on a sofa", "a cat lying on a couch"],
}
GROUND_TRUTH = {"1": ["dog"], "2": ["cat", "couch"]}
# (image, caption, its hallucinated words as written)
ROWS = [
    (1, "Two Dogs and two hot dogs, a cat.", ["hot dogs", "cat"]),
    (2, "A cat on a couch with a dog; another Dog!", ["dog", "Dog"]),
    (1, "A dog on the grass.", []),
    (999, "A dog and a cat.", None),  # an image the service does not know: unscored
]


def decoded(tokenizer, ids, positions) -> list[str]:
    return tokenizer.decode([ids[i] for i in positions]).split()


@pytest.fixture(scope="module")
def chair_url(tmp_path_factory):
    path = tmp_path_factory.mktemp("chair") / "gt.json"
    path.write_text(json.dumps(GROUND_TRUTH))
    with start_server(ground_truth=path) as server:
        yield server.url


def test_verl_scorer_gives_the_hallucinated_tokens(chair_url, small_tokenizer) -> None:
    reward = CaptionReward(
        CiderD.from_references(CORPUS),
        ChairClient(chair_url, strict=True),
        chair_weight=1.0,
        tokenizer=small_tokenizer,
    )
    captions = [caption for _, caption, _ in ROWS]
    truths = [{"image_id": i, "references": CORPUS.get(i, ["x"])} for i, _, _ in ROWS]
    result = reward.score_batch(captions, truths, [{}] * len(ROWS))
    assert reward.fields == (*CAPTION_FIELDS, TOKEN_POSITIONS_KEY)
    for (_, caption, words), score in zip(ROWS, result, strict=True):
        row = score.as_dict(reward.fields)  # what verl stores as the reward's extra info
        positions = row[TOKEN_POSITIONS_KEY]
        if words is None:
            assert positions is None and row["chair_ok"] is False
            continue
        ids = small_tokenizer(caption, add_special_tokens=False)["input_ids"]
        assert decoded(small_tokenizer, ids, positions) == " ".join(words).split()
        assert positions == sorted(set(positions)) and all(0 <= p < len(ids) for p in positions)


def test_response_ids_fix_the_positions(chair_url, small_tokenizer) -> None:
    """With the response's own ids (end of turn and padding after the text) the positions
    index them; ids that decode to another text are refused."""
    reward = CaptionReward(
        CiderD.from_references(CORPUS), ChairClient(chair_url), tokenizer=small_tokenizer
    )
    caption = "A cat on a couch with a dog."
    ids = small_tokenizer(caption, add_special_tokens=False)["input_ids"]
    ids = [*ids, small_tokenizer.eos_token_id, small_tokenizer.pad_token_id]
    result = reward([caption], [2], [CORPUS[2]], response_ids=[ids])
    (positions,) = result.hallucinated_positions
    assert decoded(small_tokenizer, ids, positions) == ["dog"]
    with pytest.raises(ValueError, match="decode"):
        reward(["A cat on a couch."], [2], [CORPUS[2]], response_ids=[ids])


def test_without_a_tokenizer_there_are_spans_but_no_positions(chair_url) -> None:
    reward = CaptionReward(CiderD.from_references(CORPUS), ChairClient(chair_url))
    caption = ROWS[0][1]
    result = reward([caption], [1], [CORPUS[1]])
    assert reward.fields == CAPTION_FIELDS and result.hallucinated_positions is None
    assert [caption[a:b] for a, b in result.hallucinated_spans[0]] == ["hot dogs", "cat"]
    assert result[0].details[TOKEN_POSITIONS_KEY] is None


def test_local_task_fills_the_reward_positions(tmp_path, small_tokenizer) -> None:
    from entropyrl.rig.local.captioning import CaptionTask
    from entropyrl.rig.synthetic import PARTNERS, build_synthetic_coco

    world = build_synthetic_coco(
        tmp_path / "world", num_train=4, num_test=1, image_size=28, seed=5, write_images=False
    )
    image = world.by_id(world.train[0].image_id)
    present = image.categories[0]
    absent = next(name for name in PARTNERS if name not in image.categories)
    texts = [
        f"a {present} and two {absent}s.",
        f"a {present}.",
        f"{absent.capitalize()}, {absent}, a {present}!",
    ]
    items = [image.image_id] * len(texts)
    with start_server(coco=world.root) as server:
        reward = CaptionReward(
            CiderD.from_references(world.train_references()), ChairClient(server.url)
        )
        task = CaptionTask(world, small_tokenizer, None, reward)
        eos, pad = small_tokenizer.eos_token_id, small_tokenizer.pad_token_id
        rows = [small_tokenizer(t, add_special_tokens=False)["input_ids"] + [eos] for t in texts]
        width = max(map(len, rows)) + 1
        responses = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        with_ids = task.reward(texts, items, responses=responses)
        from_text = task.reward(texts, items)
    assert with_ids.hallucinated_positions == from_text.hallucinated_positions
    want = [[f"{absent}s"], [], [absent.capitalize(), absent]]  # the comma is no mention
    for row, positions, words in zip(rows, with_ids.hallucinated_positions, want, strict=True):
        assert decoded(small_tokenizer, row, positions) == words
    # what the runner's token mechanisms build from them
    hallucinated, scored = hallucinated_token_mask(with_ids.hallucinated_positions, mask)
    assert scored.all() and hallucinated.sum(dim=1).tolist() == [
        len(p) for p in with_ids.hallucinated_positions
    ]
