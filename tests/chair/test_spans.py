"""Where each CHAIR mention is: character spans in the caption as sent, from the in-process
scorer, the service over HTTP and the client, and the contract's reading of old answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chair_server import ChairScorer, contract
from chair_server.mentions import MentionExtractor, token_spans
from chair_server.text import normalize, tokenize
from entropyrl.rewards.chair_client import ChairClient
from tests.chair.conftest import IMAGES

EXTRACT = MentionExtractor()
DATA = Path(__file__).parent / "data" / "captions.jsonl"


@pytest.mark.parametrize(
    ("caption", "expected"),
    [
        # plurals and capitals: the span is the word as written
        ("Two Dogs and three CATS.", [("dog", "Dogs"), ("cat", "CATS")]),
        # punctuation stays outside the span
        ("A dog, a cat. A bird!", [("dog", "dog"), ("cat", "cat"), ("bird", "bird")]),
        ('He said "dogs" (and horses).', [("dog", "dogs"), ("horse", "horses")]),
        ("The dog's bowl.", [("dog", "dog"), ("bowl", "bowl")]),
        # two-word objects span both words; "dining table" too, counted as its "table"
        ("Two hot dogs on a Dining Table.", [("hot dog", "hot dogs"), ("table", "Dining Table")]),
        ("dining, table and dining tables", [("table", "table"), ("table", "dining tables")]),
        (
            "A teddy bear and a cell phone.",
            [("teddy bear", "teddy bear"), ("cell phone", "cell phone")],
        ),
        ("The toilet  seat is up.", [("toilet", "toilet  seat")]),
        # repeated mentions: one span each, in caption order
        ("A dog chasing another dog.", [("dog", "dog"), ("dog", "dog")]),
        # synonyms map to their category but keep their own text
        ("Men and puppies.", [("man", "Men"), ("puppy", "puppies")]),
        # characters the normaliser drops or rewrites still map back to the caption as sent
        ("A\x07 DOG\x01S and a caf\u00e9 ﬁsh chair.", [("dog", "DOG\x01S"), ("chair", "chair")]),
        ("Un cafe\u0301 et un chien. A cat.", [("cat", "cat")]),
    ],
)
def test_spans_are_the_mentions_text(caption: str, expected: list[tuple[str, str]]) -> None:
    found, _ = EXTRACT.locate(caption)
    assert [(word, caption[start:end]) for word, _, start, end in found] == expected
    assert [(w, c) for w, c, _, _ in found] == EXTRACT.mentions(caption)


def test_two_equal_mentions_have_distinct_spans() -> None:
    caption = "A dog and a dog and a dog."
    starts = [start for _, _, start, _ in EXTRACT.locate(caption)[0]]
    assert starts == [2, 12, 22]


def test_every_token_of_the_caption_file_maps_to_its_text() -> None:
    """Each token's span, normalised as the tokenizer does, is the token (quotes aside)."""
    captions = [json.loads(line)["caption"] for line in DATA.read_text().splitlines() if line]
    captions += [ref for _, _, refs in IMAGES.values() for ref in refs]
    assert len(captions) > 50
    checked = 0
    for caption in captions:
        tokens = tokenize(caption)
        for token, (start, end) in zip(tokens, token_spans(caption, tokens), strict=True):
            if token in ("``", "''"):
                continue
            assert normalize(caption[start:end]).lower() == token, (caption, token)
            checked += 1
    assert checked > 1000


@pytest.fixture(scope="module")
def scorer(session_gt_file) -> ChairScorer:
    return ChairScorer.from_ground_truth(session_gt_file)


def test_score_one_spans_follow_mentioned_and_hallucinated(scorer: ChairScorer) -> None:
    # image 1001: person, dog, dining table, cup; cat and hot dog are hallucinated
    caption = "A Man, two hot dogs, a dog and a cat; another Cat."
    entry = scorer.score_one(1001, caption)
    mention_text = [caption[a:b] for a, b in entry[contract.MENTION_SPANS_KEY]]
    assert mention_text == ["Man", "hot dogs", "dog", "cat", "Cat"]
    assert entry["mentioned"] == ["person", "hot dog", "dog", "cat", "cat"]
    hallucinated_text = [caption[a:b] for a, b in entry[contract.HALLUCINATED_SPANS_KEY]]
    assert hallucinated_text == ["hot dogs", "cat", "Cat"]
    assert [w for w, _ in entry["hallucinated"]] == ["hot dog", "cat", "cat"]
    assert contract.spans(entry) == [tuple(s) for s in entry[contract.HALLUCINATED_SPANS_KEY]]


def test_service_and_client_send_the_spans(chair_server_url, scorer: ChairScorer) -> None:
    items = [
        {"image_id": 1001, "caption": "A Man, two hot dogs, a dog and a cat; another Cat."},
        {"image_id": 1002, "caption": "The toilet seat, a SINK and sinks."},
        {"image_id": 1003, "caption": "Elephants. Giraffes, a giraffe!"},
        {"image_id": 1004, "caption": "A wall."},
    ]
    served = ChairClient(chair_server_url, strict=True).score(items)
    local = scorer.score(items)
    for entry, mine in zip(served, local, strict=True):
        for key in (contract.MENTION_SPANS_KEY, contract.HALLUCINATED_SPANS_KEY):
            assert entry[key] == mine[key]
    texts = [
        [item["caption"][a:b] for a, b in contract.spans(entry)]
        for entry, item in zip(served, items)
    ]
    assert texts == [["hot dogs", "cat", "Cat"], [], ["Giraffes", "giraffe"], []]


def test_an_answer_without_spans_still_parses() -> None:
    old = {"image_id": 1, "mentioned": ["dog"], "hallucinated": [], "metrics": {"CHAIRi": 0.0}}
    assert ChairClient.is_scored(old)
    assert contract.spans(old) is None
    assert contract.spans(old, contract.MENTION_SPANS_KEY) is None


@pytest.mark.parametrize(
    "bad",
    [
        {"hallucinated": [["dog", "dog"]], "hallucinated_spans": []},
        {"hallucinated": [["dog", "dog"]], "hallucinated_spans": [[3, 1]]},
        {"hallucinated": [["dog", "dog"]], "hallucinated_spans": [[0, True]]},
        {"hallucinated": [["dog", "dog"]], "hallucinated_spans": [[0, 1, 2]]},
        {"hallucinated": [["dog", "dog"]], "hallucinated_spans": "0:3"},
    ],
)
def test_malformed_spans_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError, match="hallucinated_spans"):
        contract.spans(bad)


def test_a_quote_token_spans_its_quote() -> None:
    caption = 'He said "dogs" twice.'
    tokens = tokenize(caption)
    spans = dict(zip(tokens, token_spans(caption, tokens), strict=True))
    assert spans["``"] == (8, 9) and spans["''"] == (13, 14) and spans["dogs"] == (9, 13)
