"""Caption -> mentions: one hand-computed case per CHAIR rule, tokenizer rule and vocabulary quirk
of the original code, plus the input normalisation."""

from __future__ import annotations

import pytest

from chair_server import ChairScorer, vocabulary
from chair_server.mentions import MentionExtractor
from chair_server.singular import singularize
from chair_server.text import normalize, tokenize

EXTRACT = MentionExtractor()


@pytest.mark.parametrize(
    ("caption", "expected"),
    [
        # tokenization: case, sentence-final period, possessive; hyphenated compounds stay whole
        ("A Dog.", [("dog", "dog")]),
        ("The dog's bowl.", [("dog", "dog"), ("bowl", "bowl")]),
        ("Kids are kite-flying.", [("kid", "person")]),
        # the original's singularizer: its word is what counts ("people" -> "person")
        ("Two men and three women.", [("man", "person"), ("woman", "person")]),
        ("Knives, mice and vases.", [("knife", "knife"), ("mouse", "mouse"), ("vase", "vase")]),
        ("People on skis.", [("person", "person"), ("ski", "skis")]),
        ("Some scissors.", [("scissors", "scissors")]),
        ("Puppies and ponies.", [("puppy", "dog"), ("pony", "horse")]),
        # two-word compounds are one object, not the object inside them
        ("A hot dog.", [("hot dog", "hot dog")]),
        (
            "Two teddy bears by a stop sign.",
            [("teddy bear", "teddy bear"), ("stop sign", "stop sign")],
        ),
        ("Two wine glasses and a wine glass.", [("wine glass", "wine glass")] * 2),
        ("A cell phone and a phone.", [("cell phone", "cell phone"), ("phone", "cell phone")]),
        # compounds that must not count
        ("A batter at home plate.", []),
        ("The train on the train tracks.", [("train", "train")]),
        # baby/adult animals, passenger vehicles
        (
            "A baby elephant and an adult giraffe.",
            [("elephant", "elephant"), ("giraffe", "giraffe")],
        ),
        ("Baby animals.", []),
        ("A baby.", [("baby", "person")]),
        ("A passenger jet and passenger trains.", [("jet", "airplane"), ("train", "train")]),
        ("A passenger.", [("passenger", "person")]),
        # bow tie is one tie; bow alone is a tie (false friend kept for parity)
        ("A man in a bow tie.", [("man", "person"), ("tie", "tie")]),
        # toilet seat is the toilet; a seat next to a toilet is dropped; a seat alone is a chair
        ("The toilet seat is up.", [("toilet", "toilet")]),
        ("The seat of the toilet.", [("toilet", "toilet")]),
        ("A seat and a stool.", [("seat", "chair"), ("stool", "chair")]),
        # repeated mentions all count
        ("A dog chasing another dog.", [("dog", "dog"), ("dog", "dog")]),
        ("", []),
    ],
)
def test_rules(caption: str, expected: list[tuple[str, str]]) -> None:
    assert EXTRACT.mentions(caption) == expected


@pytest.mark.parametrize(
    ("caption", "tokens"),
    [
        # no split inside a word at a slash, an inner apostrophe or a hyphen
        ("Forks/spoons here", ["forks/spoons", "here"]),
        ("At 3 o'clock", ["at", "3", "o'clock"]),
        ("A bench'smid dog", ["a", "bench'smid", "dog"]),
        ("A kite-flying boy", ["a", "kite-flying", "boy"]),
        # only a trailing 's (and the other clitics) splits
        ("The dog's bowl isn't here", ["the", "dog", "'s", "bowl", "is", "n't", "here"]),
        ("The dogs' bowls", ["the", "dogs", "'", "bowls"]),
        # a period splits at a sentence end only; abbreviations keep theirs
        ("A dog. A cat.", ["a", "dog", ".", "a", "cat", "."]),
        ("Near st. james, e.g. a dog.", ["near", "st.", "james", ",", "e.g", ".", "a", "dog", "."]),
        ("A dog.the cat", ["a", "dog.the", "cat"]),
        # commas split unless a digit follows; quotes, brackets and dashes are tokens
        ("Dogs,cats and 3,500 birds", ["dogs", ",", "cats", "and", "3,500", "birds"]),
        (
            'A "dog" (a cat)--a cow',
            ["a", "``", "dog", "''", "(", "a", "cat", ")", "--", "a", "cow"],
        ),
        ("A 'dog' here", ["a", "'", "dog", "'", "here"]),
        ("A dog\u2014a cat\u2026", ["a", "dog", "\u2014", "a", "cat", "..."]),
        ("Cannot, gonna", ["can", "not", ",", "gon", "na"]),
    ],
)
def test_tokenizer_follows_nltk_rules(caption: str, tokens: list[str]) -> None:
    assert tokenize(caption) == tokens


@pytest.mark.parametrize(
    ("caption", "expected"),
    [
        # split only where the original splits: these words are no mention
        ("Forks/spoons and tables/shelves.", []),
        ("A bench'smid-sized dog.", [("dog", "dog")]),
        ("It is 3 o'clock.", []),
        # the original list's live and dead entries
        ("A knive.", [("knive", "knife")]),
        ("A cheesecake, an iPhone and a hair dryer.", []),
        (
            "A hair drier and a hairdryer.",
            [("hair drier", "hair drier"), ("hairdryer", "hair drier")],
        ),
        ("A motor bike.", []),  # joined as a pair whose entry is dead: not even the bike counts
        (
            "A motor cycle and a motorbike.",
            [("motor cycle", "motorcycle"), ("motorbike", "motorcycle")],
        ),
        ("The stove top oven.", [("stove", "oven"), ("oven", "oven")]),
        # the original's singularizer decides
        ("Two sheeps.", [("sheep", "sheep")]),
        ("Tennis rackets.", [("racket", "tennis racket")]),
        ("Sports balls.", [("ball", "sports ball")]),
        ("Kine.", [("cow", "cow")]),
        ("Wine glasses.", [("wine glass", "wine glass")]),
        # the documented difference: counted as a WordNet lemmatizer counts them
        ("A bus, two busses and a minibus.", [("bus", "bus"), ("bus", "bus"), ("minibus", "bus")]),
        ("Men in ties and a bow ties.", [("man", "person"), ("tie", "tie"), ("tie", "tie")]),
        ("Canoes, collies and doggies.", [("canoe", "boat"), ("collie", "dog"), ("doggie", "dog")]),
    ],
)
def test_original_vocabulary_quirks(caption: str, expected: list[tuple[str, str]]) -> None:
    assert EXTRACT.mentions(caption) == expected


@pytest.mark.parametrize(
    "hidden",
    [
        "a dog\u200b.",  # zero-width space
        "a do\u00adg.",  # soft hyphen
        "a dog\x00.",  # NUL
        "a \uff44\uff4f\uff47.",  # full-width letters
        "a dog\u2060\ufeff.",  # word joiner, byte-order mark
        "a d\U000e0041og\ue000.",  # tag and private-use characters
    ],
)
def test_invisible_and_compatibility_characters_do_not_hide_a_mention(hidden: str) -> None:
    assert EXTRACT.mentions(hidden) == [("dog", "dog")]


def test_normalize_leaves_plain_text_alone() -> None:
    text = "A man's dog, e.g. a puppy.\n\nTwo cats\t(three?) -- 'yes'."
    assert normalize(text) is text or normalize(text) == text
    assert normalize("caf\u00e9 \u2019s \u201cdog\u201d") == "caf\u00e9 \u2019s \u201cdog\u201d"


def test_singularizer_follows_the_original() -> None:
    cases = {
        "dogs": "dog", "buses": "bus", "bus": "bu", "ties": "ty", "glasses": "glass",
        "glass": "glas", "tennis": "tenni", "knives": "knife", "mice": "mouse", "people": "person",
        "women": "woman", "oxen": "ox", "kine": "cow", "scissors": "scissors", "sheep": "sheep",
        "sheeps": "sheep", "doggies": "doggies", "ponies": "pony", "calves": "calf",
        "luggage": "luggage", "dogs'": "dog's", "mothers-in-law": "mother-in-law",
    }  # fmt: skip
    assert {word: singularize(word) for word in cases} == cases


def test_exceptions_are_forms_the_original_misses() -> None:
    words = vocabulary.word_to_category()
    for token, word in vocabulary.SINGULAR_EXCEPTIONS.items():
        assert singularize(token) not in words, token
        assert word in words, word


def test_vocabulary_shape() -> None:
    ids = [cid for cid, _ in vocabulary.COCO_CATEGORIES]
    assert len(ids) == 80 and len(set(vocabulary.CATEGORY_NAMES)) == 80
    assert set(range(1, 91)) - set(ids) == {12, 26, 29, 30, 45, 66, 68, 69, 71, 83}
    assert list(vocabulary.SYNONYMS) == list(vocabulary.CATEGORY_NAMES)
    words = vocabulary.word_to_category()
    assert 380 <= len(words) <= 450
    for target in vocabulary.TWO_WORD_EXPRESSIONS.values():
        assert target is None or target in words


def test_scorer_exposes_mentions_and_accepts_aliases_in_ground_truth(gt_file) -> None:
    scorer = ChairScorer.from_ground_truth(gt_file)
    assert scorer.mentions("Two dogs.") == [("dog", "dog")]
    aliases = ChairScorer.from_ground_truth({"1": ["hair dryer", "iPhone", "cheesecake"]})
    assert aliases.ground_truth() == {1: ["cake", "cell phone", "hair drier"]}


def test_singular_cache_starts_over_when_full(monkeypatch) -> None:
    from chair_server import mentions

    monkeypatch.setattr(mentions, "CACHE_LIMIT", 20)
    extractor = MentionExtractor()
    caption = " ".join(f"w{i}" for i in range(50)) + " dogs, buses. ,,"
    for _ in range(3):  # the cache starts over several times within and between the calls
        assert extractor.analyse(caption) == ([("dog", "dog"), ("bus", "bus")], 52)
