"""The share of caption tokens inside hallucinated mentions, beside CHAIR_i."""

from __future__ import annotations

import pytest

from chair_server.scorer import ChairScorer
from entropyrl.evaluation.caption_metrics import (
    HALLUCINATED_SPANS_KEY,
    caption_values,
    hallucinated_token_counts,
)


def offsets_of(tokenizer):
    def offsets(caption):
        return tokenizer(caption, return_offsets_mapping=True)["offset_mapping"]

    return offsets


def test_counts_by_hand():
    # "a hot dog." tokens: "a" [0,1), " hot" [1,5), " dog" [5,9), "." [9,10); span "hot dog" [2,9)
    offsets = [(0, 1), (1, 5), (5, 9), (9, 10), (0, 0)]
    assert hallucinated_token_counts([(2, 9)], offsets) == (2.0, 4.0)
    assert hallucinated_token_counts([], offsets) == (0.0, 4.0)
    assert hallucinated_token_counts([(0, 10)], offsets) == (4.0, 4.0)
    assert hallucinated_token_counts([(2, 9)], []) == (0.0, 0.0)


def test_token_share_with_the_qwen_tokenizer(small_tokenizer):
    caption = "A dog and a cat on a sofa."
    spans = [(caption.index("cat"), caption.index("cat") + 3)]
    scorer = ChairScorer.from_ground_truth({"1": ["dog"]})
    entry = {**scorer.score_one(1, caption), HALLUCINATED_SPANS_KEY: spans}
    values = caption_values([entry], [["a dog."]], token_offsets=offsets_of(small_tokenizer))
    marked, tokens = values["hallucinated_tokens"][1]
    ids = small_tokenizer(caption)["input_ids"]
    # the loop: token i covers the characters its decoding adds to the decoded prefix
    start, end = spans[0]
    want = 0
    for i in range(len(ids)):
        a, b = (len(small_tokenizer.decode(ids[:k])) for k in (i, i + 1))
        want += a < end and start < b
    assert (marked, tokens) == (float(want), float(len(ids))) and marked >= 1
    assert "hallucinated_tokens" not in caption_values([entry], [["a dog."]])


def test_entries_without_spans_are_refused(small_tokenizer):
    """An entry from a service too old to send spans (the key absent) is refused."""
    scorer = ChairScorer.from_ground_truth({"1": ["dog"]})
    entry = {k: v for k, v in scorer.score_one(1, "a cat").items() if k != HALLUCINATED_SPANS_KEY}
    with pytest.raises(ValueError, match=HALLUCINATED_SPANS_KEY):
        caption_values([entry], [["a dog."]], token_offsets=offsets_of(small_tokenizer))
