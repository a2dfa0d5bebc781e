"""Every mention's span, on generated captions: plurals, capitals, two-word objects, accents
(precomposed and combining), ligatures, quotes, punctuation and odd whitespace. The span's own
text reads as the mention, spans are ordered and disjoint, and they follow `mentions`."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from chair_server.mentions import MentionExtractor

EXTRACT = MentionExtractor()

WORDS = [
    "dog", "Dogs", "CAT", "cats", "a", "the", "and", "on", "hot dog", "hot dogs", "teddy bear",
    "dining table", "Dining Tables", "table", "toilet", "seat", "men", "man", "puppies",
    "café", "cafe\u0301", "ﬁsh", "naïve", "bird", "birds", "cell phone", "home plate", "two",
]  # fmt: skip
GLUE = [" ", "  ", ", ", ". ", "! ", ' "', '" ', " (", ") ", "\t", "'s "]

captions = st.lists(st.tuples(st.sampled_from(WORDS), st.sampled_from(GLUE)), max_size=12).map(
    lambda parts: "".join(word + glue for word, glue in parts)
)


@settings(max_examples=400, deadline=None)
@given(caption=captions)
def test_each_span_reads_as_its_mention(caption):
    found, _ = EXTRACT.locate(caption)
    assert [(w, c) for w, c, _, _ in found] == EXTRACT.mentions(caption)
    end_before = 0
    for word, category, start, end in found:
        assert end_before <= start < end <= len(caption)
        end_before = end
        inside = EXTRACT.mentions(caption[start:end])
        assert [category] == [c for _, c in inside], (caption, caption[start:end], word)


def test_a_combining_accent_stays_with_its_letter():
    caption = "Un cafe\u0301 dog"
    ((word, _, start, end),) = EXTRACT.locate(caption)[0]
    assert (word, caption[start:end]) == ("dog", "dog")
    assert start == caption.index("dog")
