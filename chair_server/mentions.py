"""Caption -> COCO object mentions, with the CHAIR rules precompiled into lookup tables."""

from __future__ import annotations

import re

from chair_server import vocabulary

# Lower-cased words; a hyphenated compound stays one token ("kite-flying" is not a kite), as in
# the NLTK tokenizer the original used. Punctuation and possessives ("dog's") split off.
_WORD = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


def tokenize(caption: str) -> list[str]:
    """Lower-cased word tokens of a caption ("dog." at a sentence end is "dog")."""
    return _WORD.findall(caption.lower())


class MentionExtractor:
    """Finds the vocabulary words of a caption and their categories.

    All tables are built once: surface form -> singular word, (token, token) -> two-word
    expression, word -> category. Extraction is one pass over the tokens with dict look-ups.
    """

    def __init__(self) -> None:
        self.category_of: dict[str, str] = vocabulary.word_to_category()
        self.singular: dict[str, str] = vocabulary.surface_forms(self.category_of)
        self.pairs: dict[tuple[str, str], str | None] = vocabulary.pair_forms()
        self.pair_starts: frozenset[str] = frozenset(first for first, _ in self.pairs)
        self.rule_trigger, self.rule_dropped = vocabulary.TOILET_SEAT_RULE

    def mentions(self, caption: str) -> list[tuple[str, str]]:
        """``[(word, category), ...]`` in caption order; repeated mentions all count.

        ``word`` is the singular vocabulary word ("men" -> "man", "hot dogs" -> "hot dog"),
        ``category`` the COCO category name it counts for ("man" -> "person").
        """
        tokens = tokenize(caption)
        singular, pairs, starts = self.singular, self.pairs, self.pair_starts
        words: list[str] = []
        i, n = 0, len(tokens)
        while i < n:
            token = tokens[i]
            if token in starts and i + 1 < n:
                key = (token, tokens[i + 1])
                if key in pairs:
                    target = pairs[key]
                    if target is not None:
                        words.append(target)
                    i += 2
                    continue
            word = singular.get(token)
            if word is not None:
                words.append(word)
            i += 1
        if self.rule_dropped in words and self.rule_trigger in words:
            words = [w for w in words if w != self.rule_dropped]
        category_of = self.category_of
        return [(w, category_of[w]) for w in words]
