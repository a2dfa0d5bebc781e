"""Caption -> COCO object mentions: the original CHAIR algorithm with precompiled tables.

Per caption, as the original ``caption_to_words``: NLTK-style tokens (``text.tokenize``), each
singularized (``singular.singularize``, memoised, with ``vocabulary.SINGULAR_EXCEPTIONS`` first),
a left-to-right scan in which a two-word expression wins over its first word and consumes its
second, the toilet/seat rule, and a filter by the vocabulary.
"""

from __future__ import annotations

import threading

from chair_server import vocabulary
from chair_server.singular import singularize
from chair_server.text import tokenize

# distinct tokens remembered by the singular cache before it starts over (a few MB at most)
CACHE_LIMIT = 1 << 17


class MentionExtractor:
    """Finds the vocabulary words of a caption and their categories.

    Tables built once: word -> category, (word, word) -> two-word expression, token -> singular
    word (filled as tokens are met). A C-level set intersection finds the few words of a caption
    that matter; the pair scan then only visits those positions.
    """

    def __init__(self) -> None:
        self.category_of: dict[str, str] = vocabulary.word_to_category()
        self.names: dict[str, str] = vocabulary.name_to_category()
        self.pairs: dict[tuple[str, str], str | None] = vocabulary.pair_table()
        self.pair_starts: frozenset[str] = frozenset(first for first, _ in self.pairs)
        self._single = frozenset(w for w in self.category_of if " " not in w)
        self._lookup_keys = self._single | self.pair_starts
        self.rule_trigger, self.rule_dropped = vocabulary.TOILET_SEAT_RULE
        # token -> singular word, and the tokens without a letter or digit; replaced together
        # (never cleared in place) so a reader always holds a consistent pair
        self._tables = self._new_tables()
        self._lock = threading.Lock()

    @staticmethod
    def _new_tables() -> tuple[dict[str, str], set[str]]:
        return dict(vocabulary.SINGULAR_EXCEPTIONS), set()

    def singular(self, token: str) -> str:
        """The word the original compares with the vocabulary for ``token`` (lower case)."""
        cache, punctuation = self._tables
        word = cache.get(token)
        return word if word is not None else self._miss(token, cache, punctuation)

    def _miss(self, token: str, cache: dict[str, str], punctuation: set[str]) -> str:
        word = singularize(token)
        if not any(c.isalnum() for c in token):
            punctuation.add(token)
        cache[token] = word
        if len(cache) > CACHE_LIMIT:
            with self._lock:
                if self._tables[0] is cache:
                    self._tables = self._new_tables()
        return word

    def mentions(self, caption: str) -> list[tuple[str, str]]:
        """``[(word, category), ...]`` in caption order; repeated mentions all count.

        ``word`` is the singular vocabulary word ("men" -> "man", "hot dogs" -> "hot dog"),
        ``category`` the COCO category name it counts for ("man" -> "person"). Two-word
        expressions that are no object ("home plate", "train track", "baby animal") yield
        nothing, and seats are dropped when the caption also mentions a toilet.
        """
        return self.analyse(caption)[0]

    def analyse(self, caption: str) -> tuple[list[tuple[str, str]], int]:
        """``(mentions, number of words)`` of a caption (punctuation tokens are not words)."""
        tokens = tokenize(caption)
        cache, punctuation = self._tables
        words = list(map(cache.get, tokens))
        if None in words:
            miss = self._miss
            words = [
                w if w is not None else miss(t, cache, punctuation) for w, t in zip(words, tokens)
            ]
        length = len(tokens) - sum(map(punctuation.__contains__, tokens))
        hits = self._lookup_keys.intersection(words)
        if not hits:
            return [], length
        starts = self.pair_starts.intersection(hits)
        if starts and self._has_pair(words, starts):
            found = self._scan(words, hits)
        else:
            if starts:
                hits = self._single.intersection(hits)
            found = [w for w in words if w in hits]
        # the original tests the scanned words; both rule words are vocabulary words
        if self.rule_dropped in found and self.rule_trigger in found:
            found = [w for w in found if w != self.rule_dropped]
        category_of = self.category_of
        return [(w, category_of[w]) for w in found], length

    def _has_pair(self, words: list, starts: set[str]) -> bool:
        """Whether a two-word expression occurs (C-level ``count``/``index`` find the starts)."""
        pairs, last = self.pairs, len(words) - 1
        for word in starts:
            i = -1
            for _ in range(words.count(word)):
                i = words.index(word, i + 1)
                if i < last and (word, words[i + 1]) in pairs:
                    return True
        return False

    def _scan(self, words: list, hits: set[str]) -> list[str]:
        """The original's left-to-right scan, visiting only vocabulary and pair-start words:
        a two-word expression wins over its first word and consumes its second."""
        single, pairs, starts = self._single, self.pairs, self.pair_starts
        found: list[str] = []
        n, next_free = len(words), 0
        for i, word in [(i, w) for i, w in enumerate(words) if w in hits]:
            if i < next_free:
                continue
            if word in starts and i + 1 < n:
                key = (word, words[i + 1])
                if key in pairs:
                    target = pairs[key]
                    if target is not None:
                        found.append(target)
                    next_free = i + 2
                    continue
            if word in single:
                found.append(word)
        return found
