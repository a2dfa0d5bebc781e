"""Caption by caption against the original CHAIR code, restated in ``original_chair.py``.

The mention decisions (word and category of every mention, in order) must equal the original's
for every caption, once the one documented difference (``vocabulary.SINGULAR_EXCEPTIONS``) is
applied to the original too; tokens must equal NLTK's for text that normalisation leaves alone.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chair_server import vocabulary
from chair_server.mentions import MentionExtractor
from chair_server.singular import singularize
from chair_server.text import tokenize

HERE = Path(__file__).resolve().parent


def _load_original():
    spec = importlib.util.spec_from_file_location(
        "chair_original_reference", HERE / "original_chair.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


ORIGINAL = _load_original()
PURE = ORIGINAL.OriginalChair()
WITH_CHOICE = ORIGINAL.OriginalChair(vocabulary.SINGULAR_EXCEPTIONS)
EXTRACT = MentionExtractor()
CAPTIONS = [
    json.loads(line)["caption"]
    for line in (HERE / "data" / "captions.jsonl").read_text(encoding="utf-8").splitlines()
]


def test_vocabulary_is_the_original_effective_vocabulary() -> None:
    live = {
        word
        for word in PURE.mscoco_objects
        if word and word == word.lower() and not word.startswith(" ") and len(word.split()) <= 2
    }
    mine = vocabulary.word_to_category()
    assert set(mine) == live
    assert all(mine[word] == PURE.inverse_synonym_dict[word] for word in live)
    pairs = {k: v for k, v in PURE.double_word_dict.items() if len(k.split()) == 2}
    assert set(vocabulary.TWO_WORD_EXPRESSIONS) == set(pairs)
    for pair, target in pairs.items():
        assert vocabulary.TWO_WORD_EXPRESSIONS[pair] == (target if target in live else None), pair


@pytest.mark.parametrize("index", range(len(CAPTIONS)))
def test_shipped_captions_match_the_original(index: int) -> None:
    caption = CAPTIONS[index]
    assert tokenize(caption) == ORIGINAL.word_tokenize(caption.lower())
    assert EXTRACT.mentions(caption) == WITH_CHOICE.mentions(caption)


def test_shipped_captions_differ_from_the_pure_original_only_by_the_documented_choice() -> None:
    differing = [c for c in CAPTIONS if EXTRACT.mentions(c) != PURE.mentions(c)]
    assert 0 < len(differing) < len(CAPTIONS) // 4
    choice_words = set(vocabulary.SINGULAR_EXCEPTIONS)
    for caption in differing:
        assert choice_words.intersection(tokenize(caption)), caption


def test_singularizer_matches_the_original_on_every_shipped_token() -> None:
    tokens = {t for c in CAPTIONS for t in tokenize(c)}
    tokens |= {t + suffix for t in list(tokens) for suffix in ("s", "es", "'")}
    tokens |= set(vocabulary.word_to_category()) | set(ORIGINAL.IRREGULAR)
    assert {t: singularize(t) for t in tokens} == {t: ORIGINAL.singularize(t) for t in tokens}


# Random captions from vocabulary words, their plurals and every kind of mark the rules treat.
WORDS = sorted({w for w in vocabulary.word_to_category() for w in w.split()})
FILLERS = str.split(
    "a the with on and seat glasses track plate home hot baby tennis sports motor wine bus ties "
    "canoes sheeps knive st e.g mr no. 3 2. 3,500 o'clock bench'smid forks/spoons kite-flying "
    "dog's dogs' isn't cannot gonna 't is"
)
MARKS = [",", ".", ". ", "(", ")", "'", '"', "--", "...", ";", ":", "!", "?", "/", "-", "\n\n"]
MARKS += ["\u2019", "\u201c", "\u201d", "\u2014", "*", "&"]
PLURAL = st.sampled_from(["", "s", "es"])


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(st.sampled_from(WORDS + FILLERS), PLURAL, st.sampled_from(MARKS + [" "] * 12)),
        max_size=30,
    )
)
def test_random_captions_match_the_original(parts) -> None:
    caption = "".join(word + suffix + mark for word, suffix, mark in parts)
    caption = caption[:1].upper() + caption[1:]
    assert tokenize(caption) == ORIGINAL.word_tokenize(caption.lower())
    assert EXTRACT.mentions(caption) == WITH_CHOICE.mentions(caption)
