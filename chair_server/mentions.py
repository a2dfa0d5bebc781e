"""Caption -> COCO object mentions: the original CHAIR algorithm with precompiled tables.

Per caption, as the original ``caption_to_words``: NLTK-style tokens (``text.tokenize``), each
singularized (``singular.singularize``, memoised, with ``vocabulary.SINGULAR_EXCEPTIONS`` first),
a left-to-right scan in which a two-word expression wins over its first word and consumes its
second, the toilet/seat rule, and a filter by the vocabulary.

``MentionExtractor.locate`` also says where each mention is: its character span in the caption
as given (before normalisation and lower-casing), found by aligning the tokens with the
normalised text and mapping that text's characters back to the caption's.
"""

from __future__ import annotations

import threading
import unicodedata

from chair_server import vocabulary
from chair_server.singular import singularize
from chair_server.text import normalize, tokenize

# a mention: (word, category, first token, token after the last)
Found = tuple[str, int, int]

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
        # two-word synonyms the original's pair scan lacks ("dining table": it counts "table"):
        # (first word, counted word) -> the synonym, for the span only
        self._wider: dict[tuple[str, str], str] = {
            (first, last): name
            for name in self.category_of
            if name.count(" ") == 1
            for first, last in [name.split()]
            if (first, last) not in self.pairs
        }
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
        found, length, _ = self._find(caption)
        category_of = self.category_of
        return [(w, category_of[w]) for w, _, _ in found], length

    def locate(self, caption: str) -> tuple[list[tuple[str, str, int, int]], int]:
        """``([(word, category, start, end), ...], number of words)``: ``analyse`` with each
        mention's character span, ``caption[start:end]`` its text ("Dogs", "hot dog"; end
        exclusive, into ``caption`` as given; a two-word object spans both words, "dining table"
        too, which the original counts as "table")."""
        found, length, tokens = self._find(caption)
        if not found:
            return [], length
        spans = token_spans(caption, tokens)
        category_of, wider = self.category_of, self._wider
        out, free = [], 0  # free: the first token no earlier mention holds
        for w, first, last in found:
            if first > free and last - first == 1:
                name = wider.get((self.singular(tokens[first - 1]), w))
                if name is not None and category_of[name] == category_of[w]:
                    first -= 1  # "dining table" counts as "table" and spans both words
            out.append((w, category_of[w], spans[first][0], spans[last - 1][1]))
            free = last
        return out, length

    def _find(self, caption: str) -> tuple[list[Found], int, list[str]]:
        """``([(word, first token, token after the last), ...], words, tokens)``."""
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
            return [], length, tokens
        starts = self.pair_starts.intersection(hits)
        if starts and self._has_pair(words, starts):
            found = self._scan(words, hits)
        else:
            if starts:
                hits = self._single.intersection(hits)
            found = [(w, i, i + 1) for i, w in enumerate(words) if w in hits]
        # the original tests the scanned words; both rule words are vocabulary words
        scanned = {w for w, _, _ in found}
        if self.rule_dropped in scanned and self.rule_trigger in scanned:
            found = [m for m in found if m[0] != self.rule_dropped]
        return found, length, tokens

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

    def _scan(self, words: list, hits: set[str]) -> list[Found]:
        """The original's left-to-right scan, visiting only vocabulary and pair-start words:
        a two-word expression wins over its first word and consumes its second."""
        single, pairs, starts = self._single, self.pairs, self.pair_starts
        found: list[Found] = []
        n, next_free = len(words), 0
        for i, word in [(i, w) for i, w in enumerate(words) if w in hits]:
            if i < next_free:
                continue
            if word in starts and i + 1 < n:
                key = (word, words[i + 1])
                if key in pairs:
                    target = pairs[key]
                    if target is not None:
                        found.append((target, i, i + 2))
                    next_free = i + 2
                    continue
            if word in single:
                found.append((word, i, i + 1))
        return found


# tokens the tokenizer writes for a double quote of the text
_QUOTE_TOKENS = frozenset(("``", "''"))


def token_spans(caption: str, tokens: list[str]) -> list[tuple[int, int]]:
    """``[(start, end), ...]``: where each of ``tokenize(caption)``'s tokens lies in ``caption``.

    The tokens are found left to right in the normalised lower-cased text they were cut from
    (only whitespace lies between them; a double quote may come back as ``` `` ``` or
    ``''``), then mapped back through ``normal_origins``. A token not found (none is known)
    gets the empty span at the current position rather than a wrong one further on.
    """
    text = normalize(caption).lower()
    origin_start, origin_end = normal_origins(caption, text)
    spans: list[tuple[int, int]] = []
    position, size = 0, len(text)
    for token in tokens:
        while position < size and text[position].isspace():
            position += 1
        if text.startswith(token, position):
            stop = position + len(token)
        elif token in _QUOTE_TOKENS and text.startswith('"', position):
            stop = position + 1
        else:
            found = text.find(token, position)
            if found < 0:
                spans.append((origin_start[position], origin_start[position]))
                continue
            position, stop = found, found + len(token)
        spans.append((origin_start[position], origin_end[stop - 1]))
        position = stop
    return spans


def normal_origins(caption: str, text: str) -> tuple[list[int], list[int]]:
    """For each character of ``text`` (``normalize(caption).lower()``), the start and end in
    ``caption`` of the characters it came from; one more entry each for the end of the text.

    Normalisation works on runs that start at a character of combining class 0 (a letter and
    its accents compose together), each run normalised alone. Where that does not add up to
    the text's length (a composition across runs, as Hangul jamo), characters are placed in
    proportion: approximate, on text no caption file holds.
    """
    size = len(text)
    if caption.isascii() and len(caption) == size:
        return [*range(size + 1)], [*range(1, size + 1), size]
    runs: list[tuple[int, int]] = []
    for i, char in enumerate(caption):
        if not runs or unicodedata.combining(char) == 0:
            runs.append((i, i + 1))
        else:
            runs[-1] = (runs[-1][0], i + 1)
    starts: list[int] = []
    ends = []
    for first, last in runs:
        piece = len(normalize(caption[first:last]).lower())
        starts += [first] * piece
        ends += [last] * piece
    if len(starts) != size:
        scale = len(caption) / max(size, 1)
        starts = [min(int(j * scale), len(caption)) for j in range(size)]
        ends = [min(max(int((j + 1) * scale), a + 1), len(caption)) for j, a in enumerate(starts)]
    return [*starts, len(caption)], [*ends, len(caption)]
