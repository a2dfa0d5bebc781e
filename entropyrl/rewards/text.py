"""Caption text normalisation shared by CIDEr-D and the caption reward.

COCO's evaluation runs the Stanford PTB tokenizer (Java) and then drops punctuation tokens. The
project keeps no Java dependency, so this is a pure-Python approximation of the same result:
lower case, clitics split off as PTB does (``dog's`` -> ``dog 's``, ``don't`` -> ``do n't``),
punctuation removed, words joined by single spaces. Candidates and references must go through
the same function, which is what makes the approximation harmless for rewards.
"""

from __future__ import annotations

import re
import unicodedata

# PTB splits these clitics into their own tokens; keeping them as tokens matches COCO n-grams.
_CLITIC = re.compile(r"(?<=\w)(n't|'s|'re|'ve|'ll|'d|'m)\b")
# Anything that is neither a word character, an apostrophe, a hyphen nor whitespace is punctuation.
_PUNCT = re.compile(r"[^\w\s'\-]|_")
# The same for ASCII text, as one C-level translation.
_ASCII_PUNCT = str.maketrans({c: " " for c in map(chr, range(128)) if _PUNCT.fullmatch(c)})
# Hyphens and apostrophes only survive inside a word (t-shirt) or at the start of a clitic.
_CLITICS = frozenset({"n't", "'s", "'re", "'ve", "'ll", "'d", "'m"})


def normalize_caption(text: str) -> str:
    """Lower-cased, punctuation-free, single-spaced caption (PTB-like tokens joined by spaces).

    >>> normalize_caption("A man's T-shirt, and a DOG!")
    "a man 's t-shirt and a dog"
    """
    if not isinstance(text, str):
        raise TypeError(f"caption must be a str, got {type(text).__name__}")
    if not text.isascii():  # NFKC only where it can change something
        text = unicodedata.normalize("NFKC", text).replace("\u2019", "'")
    text = text.lower()
    if "'" in text:
        text = _CLITIC.sub(r" \1", text)
    text = text.translate(_ASCII_PUNCT) if text.isascii() else _PUNCT.sub(" ", text)
    words = []
    for token in text.split():
        if token not in _CLITICS:
            token = token.strip("-'")
        if token:
            words.append(token)
    return " ".join(words)
