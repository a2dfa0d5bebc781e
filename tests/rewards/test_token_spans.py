"""Character spans -> response token positions through the Qwen tokenizer's offsets."""

from __future__ import annotations

import pytest
import torch

from chair_server import ChairScorer, contract
from entropyrl.rewards.token_spans import (
    hallucinated_positions,
    overlapping_tokens,
    response_offsets,
    text_offsets,
)

# ground truth of image 1: a person only, so every other object is hallucinated
SCORER = ChairScorer.from_ground_truth({"1": ["person"]})


def reference_positions(tokenizer, ids: list[int], spans) -> list[int]:
    """The loop: token i covers the characters its decoding adds to the decoded prefix."""
    out = []
    for i in range(len(ids)):
        a, b = (len(tokenizer.decode(ids[:k], skip_special_tokens=True)) for k in (i, i + 1))
        if any(a < end and start < b for start, end in spans):
            out.append(i)
    return out


def test_overlap_by_hand() -> None:
    # "a hot dog." as "a" [0,1) " hot" [1,5) " dog" [5,9) "." [9,10) and a special token
    offsets = torch.tensor([[0, 1], [1, 5], [5, 9], [9, 10], [10, 10]])
    assert overlapping_tokens(torch.tensor([[2, 9]]), offsets).tolist() == [0, 1, 1, 0, 0]
    assert overlapping_tokens(torch.tensor([[6, 9]]), offsets).tolist() == [0, 0, 1, 0, 0]
    assert overlapping_tokens(torch.zeros(0, 2, dtype=torch.long), offsets).tolist() == [0] * 5
    assert hallucinated_positions([(6, 9), (0, 1)], offsets.tolist()) == [0, 2]
    assert hallucinated_positions([], offsets.tolist()) == []
    with pytest.raises(ValueError, match="spans"):
        hallucinated_positions([(5, 2)], offsets.tolist())


CAPTIONS = [
    # plurals, capitals, punctuation
    ("Two Dogs, three cats. A bird!", ["Dogs", "cats", "bird"]),
    # two-word objects: both words' tokens ("dining table" too, counted as its "table")
    (
        "Two hot dogs on a dining table with a teddy bear.",
        ["hot dogs", "dining table", "teddy bear"],
    ),
    # repeated mentions: each occurrence
    ("A dog chasing another dog, and a third DOG.", ["dog", "dog", "DOG"]),
    # a man is no hallucination here; quotes and brackets around a mention
    ('A man holds "umbrellas" (and a kite).', ["umbrellas", "kite"]),
    ("A man and a woman.", []),
]


@pytest.mark.parametrize(("caption", "words"), CAPTIONS)
def test_positions_are_the_hallucinated_words(small_tokenizer, caption: str, words) -> None:
    spans = contract.spans(SCORER.score_one(1, caption))
    assert [caption[a:b] for a, b in spans] == words
    ids = small_tokenizer(caption, add_special_tokens=False)["input_ids"]
    positions = hallucinated_positions(spans, text_offsets(small_tokenizer, caption))
    assert positions == reference_positions(small_tokenizer, ids, spans)
    # the marked tokens spell the mentions (BPE's leading spaces aside) and nothing else
    marked = small_tokenizer.decode([ids[i] for i in positions])
    assert marked.split() == " ".join(words).split()
    text, offsets = response_offsets(small_tokenizer, ids)
    assert text == caption and hallucinated_positions(spans, offsets) == positions


def test_a_leading_space_token_belongs_to_its_word(small_tokenizer) -> None:
    caption = "a dog."
    ids = small_tokenizer(caption, add_special_tokens=False)["input_ids"]
    assert [small_tokenizer.decode([i]) for i in ids] == ["a", " dog", "."]
    spans = contract.spans(SCORER.score_one(1, caption))
    assert hallucinated_positions(spans, text_offsets(small_tokenizer, caption)) == [1]


def test_positions_count_from_the_first_response_token(small_tokenizer) -> None:
    """A chat-template prompt (special tokens included) before the response, an end-of-turn
    and padding after it: positions index the response, specials are never marked."""
    caption = "A cat and two hot dogs."
    prompt = small_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Describe the image."}],
        add_generation_prompt=True,
        tokenize=False,
    )
    prompt_ids = small_tokenizer(prompt, add_special_tokens=False)["input_ids"]
    response = small_tokenizer(caption, add_special_tokens=False)["input_ids"]
    tail = [small_tokenizer.eos_token_id, small_tokenizer.pad_token_id]
    text, offsets = response_offsets(
        small_tokenizer, prompt_ids + response + tail, response_start=len(prompt_ids)
    )
    assert text == caption and len(offsets) == len(response) + 2
    spans = contract.spans(SCORER.score_one(1, text))
    positions = hallucinated_positions(spans, offsets)
    assert positions == reference_positions(small_tokenizer, response + tail, spans)
    assert small_tokenizer.decode([response[i] for i in positions]).split() == [
        "cat",
        "hot",
        "dogs",
    ]


def test_a_sampled_tokenisation_maps_through_its_own_decoding(small_tokenizer) -> None:
    """Ids the tokenizer would not produce for the text (a sampled response spelling "dog"
    letter by letter): the decoded prefixes give each token its characters."""
    pieces = ["A", " d", "o", "g", " and", " a", " man", "."]
    ids = [small_tokenizer.convert_tokens_to_ids(small_tokenizer.tokenize(p))[0] for p in pieces]
    text, offsets = response_offsets(small_tokenizer, ids)
    assert text == "A dog and a man."
    assert small_tokenizer(text, add_special_tokens=False)["input_ids"] != ids
    spans = contract.spans(SCORER.score_one(1, text))
    assert hallucinated_positions(spans, offsets) == [1, 2, 3]
