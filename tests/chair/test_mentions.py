"""Caption -> mentions: one hand-computed case per CHAIR rule, plus a check against a plain
word-level implementation of the original algorithm (singularize, pair scan, toilet rule)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chair_server import ChairScorer, vocabulary
from chair_server.mentions import PUNCTUATION, MentionExtractor

EXTRACT = MentionExtractor()


@pytest.mark.parametrize(
    ("caption", "expected"),
    [
        # tokenization: case, sentence-final period, possessive; hyphenated compounds stay whole
        ("A Dog.", [("dog", "dog")]),
        ("The dog's bowl.", [("dog", "dog"), ("bowl", "bowl")]),
        ("Kids are kite-flying.", [("kid", "person")]),
        # explicit plural table (no singularizer misses)
        ("Two men and three women.", [("man", "person"), ("woman", "person")]),
        (
            "Buses, knives, mice and vases.",
            [("bus", "bus"), ("knife", "knife"), ("mouse", "mouse"), ("vase", "vase")],
        ),
        ("People on skis.", [("people", "person"), ("skis", "skis")]),
        ("Some scissors.", [("scissors", "scissors")]),
        ("Puppies and ponies.", [("puppy", "dog"), ("pony", "horse")]),
        # two-word compounds are one object, not the object inside them
        ("A hot dog.", [("hot dog", "hot dog")]),
        (
            "Two teddy bears by a stop sign.",
            [("teddy bear", "teddy bear"), ("stop sign", "stop sign")],
        ),
        ("Two wine glasses.", [("wine glass", "wine glass")]),
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


def test_vocabulary_shape() -> None:
    ids = [cid for cid, _ in vocabulary.COCO_CATEGORIES]
    assert len(ids) == 80 and len(set(vocabulary.CATEGORY_NAMES)) == 80
    assert set(range(1, 91)) - set(ids) == {12, 26, 29, 30, 45, 66, 68, 69, 71, 83}
    assert list(vocabulary.SYNONYMS) == list(vocabulary.CATEGORY_NAMES)
    words = vocabulary.word_to_category()
    assert 380 <= len(words) <= 450
    # every non-null pair target is a vocabulary word
    for target in vocabulary.TWO_WORD_EXPRESSIONS.values():
        assert target is None or target in words


def test_scorer_exposes_mentions(gt_file) -> None:
    scorer = ChairScorer.from_ground_truth(gt_file)
    assert scorer.mentions("Two dogs.") == [("dog", "dog")]


# --- reference: the original algorithm, word by word ----------------------------------------
WORDS = vocabulary.word_to_category()
SINGLE = sorted(w for w in WORDS if " " not in w)
PAIR_WORDS = sorted({p for expr in vocabulary.TWO_WORD_EXPRESSIONS for p in expr.split()})
FILLERS = [
    "a",
    "the",
    "with",
    "on",
    "and",
    "seat",
    "glasses",
    "track",
    "plate",
    "home",
    "hot",
    "baby",
    "kite-flying",
    "dog-",
    "'s",
]
FILLERS += [",", ".", "(", "’", "--"]
_REFERENCE_TOKEN = re.compile(rf"[^\s{re.escape(PUNCTUATION)}]+|[{re.escape(PUNCTUATION)}]")


REFERENCE_SINGULAR: dict[str, str] = {}
for _word in SINGLE + PAIR_WORDS:
    for _form in (_word, *vocabulary.plural_forms(_word)):
        REFERENCE_SINGULAR.setdefault(_form, _word)
for _word in SINGLE + PAIR_WORDS:
    REFERENCE_SINGULAR[_word] = _word


def reference_mentions(caption: str) -> list[tuple[str, str]]:
    """Singularize every token, scan pairs left to right, apply the toilet rule, filter."""
    singular = REFERENCE_SINGULAR
    tokens = _REFERENCE_TOKEN.findall(caption.lower().replace("--", " . "))
    words = [singular.get(t, t) for t in tokens]
    out, i = [], 0
    while i < len(words):
        pair = " ".join(words[i : i + 2])
        if pair in vocabulary.TWO_WORD_EXPRESSIONS:
            out.append(vocabulary.TWO_WORD_EXPRESSIONS[pair] or pair)
            i += 2
        else:
            out.append(words[i])
            i += 1
    if "toilet" in out and "seat" in out:
        out = [w for w in out if w != "seat"]
    vocab = set(WORDS)
    return [(w, WORDS[w]) for w in out if w in vocab]


TOKENS = st.sampled_from(SINGLE + PAIR_WORDS + FILLERS)
INFLECT = st.booleans()
GLUE = st.booleans()


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(TOKENS, INFLECT, GLUE), max_size=25))
def test_matches_word_level_reference(tokens) -> None:
    caption = ""
    for token, plural, glue in tokens:
        word = vocabulary.plural_forms(token)[0] if plural and token.isalpha() else token
        caption += ("" if glue else " ") + (word.upper() if glue and plural else word)
    assert EXTRACT.mentions(caption) == reference_mentions(caption)


@pytest.mark.parametrize(
    ("caption", "expected"),
    [
        ("A hot, dog.", [("dog", "dog")]),  # punctuation breaks a two-word expression
        ("Up in the air. Plane spotting.", [("plane", "airplane")]),
        ("A hot dog—and a cat", [("hot dog", "hot dog"), ("cat", "cat")]),
        ("A “dog” and a (cat).", [("dog", "dog"), ("cat", "cat")]),
        ("A dog--a cat", [("dog", "dog"), ("cat", "cat")]),
        ("The passenger train track.", [("train", "train")]),
    ],
)
def test_punctuation(caption: str, expected: list[tuple[str, str]]) -> None:
    assert EXTRACT.mentions(caption) == expected
