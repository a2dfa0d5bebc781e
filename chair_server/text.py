"""Caption text -> word tokens exactly as the original CHAIR code sees them.

The original tokenizes with ``nltk.word_tokenize(caption.lower())``: Punkt sentence boundaries
(English model), then NLTK's Treebank-style substitutions on each sentence. Both are restated
here without NLTK (no model download, no run-time data): the boundary decision uses the English
model's abbreviation list, and the substitutions are NLTK 3.10's ``NLTKWordTokenizer`` rules, in
order, each skipped when its trigger characters are absent (a rule that cannot match changes
nothing). What follows from them for CHAIR:

- a period splits off only at a sentence end ("dog." -> "dog", "."; "st." and "e.g." stay);
- slashes, single hyphens and apostrophes inside a word do not split ("forks/spoons",
  "kite-flying", "o'clock", "bench'smid" are one token each); a trailing "'s", "'" and the
  clitics "'ll", "'re", "'ve", "n't", "'m", "'d" split off;
- quotes, brackets, commas and colons (not before a digit), ``;@#$%&*?!``, "--", "..." and
  the Unicode dashes U+2012..U+2015 are tokens of their own.

Before tokenizing, ``normalize`` applies NFKC and drops format and control characters (zero-width
space, soft hyphen, NUL, ...): glued to an object word they would otherwise hide the mention, which
a policy trained against a CHAIR penalty could learn to exploit. ASCII text without control
characters, the form of every published caption file, is left unchanged.
"""

from __future__ import annotations

import re
import string
import unicodedata


def _words(text: str) -> list[str]:
    """Whitespace-separated words of a long literal (keeps word lists compact)."""
    return text.split()


# --- normalisation ---------------------------------------------------------------------------
_ASCII_CONTROLS = {c: None for c in range(32) if not chr(c).isspace()}
_ASCII_CONTROLS[0x7F] = None
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")


def _drop_invisible(match: re.Match) -> str:
    return "".join(c for c in match.group() if c.isspace() or unicodedata.category(c)[0] != "C")


def normalize(caption: str) -> str:
    """NFKC, then without format/control/private-use characters (whitespace is kept)."""
    if not caption.isascii():
        caption = _NON_ASCII.sub(_drop_invisible, unicodedata.normalize("NFKC", caption))
    return caption.translate(_ASCII_CONTROLS)


# --- Punkt sentence boundaries -----------------------------------------------------------------
# Abbreviation types of NLTK's English Punkt model: a period after them ends no sentence.
ABBREVIATIONS = frozenset(
    _words(
        "ct m.j t a.c n.h ms p.a.m dr pa p.m u.k st dec u.s.a lt g.k adm p h.m ga tenn yr sen "
        "n.c j.j d.h s.g inc vs s.p.a a.t n feb sr jan s.a.y n.y col g.f c.o.m.b d ft va r.k "
        "e.f chg r.i a.g minn a.h k n.j m l.f f.j gen i.m.s s.a aug j.p okla m.d.c ltd oct s vt "
        "r.a j.c ariz w.w b.v ore h w.r e.h mrs cie corp w n.v a.d r.j ok e.m w.c ill nov u.s "
        "prof conn u.s.s.r mg f.g ph.d g calif messrs h.f wash tues sw bros u.n l wis mr sep "
        "d.c ave e.l co s.s reps c r.t h.c r wed a.s v fla jr r.h c.v m.b.a rep a.a e c.i.t l.a "
        "b.f j.b d.w j.k ala f w.va sept mich n.m j.r l.p s.c colo fri a.m g.d kan maj ky a.m.e "
        "n.d t.j cos nev"
    )
)
_QUOTES = "\u2018\u2019\u201c\u201d\xab\xbb"
_NON_WORD = rf"(?:[)\";}}\]\*:@\'\({{\[{_QUOTES}!?])"
_MULTI_CHAR = r"(?:\-{2,}|\.{2,}|(?:\.\s){2,}\.)"
_END_CONTEXT = re.compile(rf"[.?!](?=(?P<after_tok>{_NON_WORD}|\s+(?P<next_tok>\S+)))")
_PUNKT_WORD = re.compile(
    rf"({_MULTI_CHAR}|(?=[^\(\"\`{{\[:;&\#\*@\)}}\]\-,])\S+?"
    rf"(?=\s|$|{_NON_WORD}|{_MULTI_CHAR}|,(?=$|\s|{_NON_WORD}|{_MULTI_CHAR}))|\S)"
)
_REALIGN = re.compile(rf"[\"\')\]}}{_QUOTES}]+?(?:\s+|(?=--)|$)", re.MULTILINE)
_NUMERIC = re.compile(r"^-?[\.,]?\d[\d,\.-]*\.?$")
_ELLIPSIS = re.compile(r"\.\.+$")
_INITIAL = re.compile(r"[^\W\d]\.$")
# The usual context, "word. next": a break when the word is no abbreviation.
_PLAIN_END = re.compile(r"([a-z]{2,})\.\s")
_WHITESPACE = tuple(string.whitespace)


def _breaks(context: str) -> bool:
    """Punkt's ``text_contains_sentbreak`` for a candidate's context (lower-cased text: a
    lower-case word is never orthographic evidence of a sentence start)."""
    plain = _PLAIN_END.match(context)
    if plain and plain.group(1) not in ABBREVIATIONS:
        return True
    tokens = [t for line in context.split("\n") for t in _PUNKT_WORD.findall(line)]
    marks = []
    for tok in tokens:
        mark = None
        if tok in (".", "?", "!"):
            mark = "break"
        elif _ELLIPSIS.match(tok):
            mark = "ellipsis"
        elif tok.endswith(".") and not tok.endswith(".."):
            stem = tok[:-1].lower()
            abbreviation = stem in ABBREVIATIONS or stem.split("-")[-1] in ABBREVIATIONS
            mark = "abbr" if abbreviation else "break"
        marks.append(mark)
    for i in range(len(tokens) - 1):
        tok = tokens[i]
        if not tok.endswith("."):
            continue
        kind = _NUMERIC.sub("##number##", tok.lower())
        kind = kind[:-1] if len(kind) > 1 and kind.endswith(".") else kind
        if _INITIAL.match(tok) or kind == "##number##":
            after = tokens[i + 1]
            if after in (";", ":", ",", ".", "!", "?") or after[0].islower():
                marks[i] = "abbr"
    return "break" in marks[:-1]


def sentences(text: str) -> list[str]:
    """Punkt's sentences of a lower-cased text (boundaries realigned past closing quotes)."""
    slices: list[tuple[int, int]] = []
    last_break = 0
    previous: tuple[int, int] | None = None  # word slice before the previous candidate
    previous_match: re.Match | None = None
    candidates: list[tuple[re.Match, int]] = []
    for match in _END_CONTEXT.finditer(text):
        stop = previous[1] if previous else 0
        before = text[stop : match.start()]
        # Punkt's quirk kept: a last whitespace at index 0 counts as none
        space = max(map(before.rfind, _WHITESPACE))
        start = stop + space + 1 if space > 0 else (previous[0] if previous else 0)
        if previous_match is not None and previous[1] <= start:
            candidates.append((previous_match, previous[0]))
        previous_match, previous = match, (start, match.start())
    if previous_match is not None:
        candidates.append((previous_match, previous[0]))
    for match, start in candidates:
        context = text[start : match.start()] + match.group() + match.group("after_tok")
        if _breaks(context):
            slices.append((last_break, match.end()))
            last_break = match.start("next_tok") if match.group("next_tok") else match.end()
    slices.append((last_break, len(text.rstrip())))
    out: list[str] = []
    realign = 0
    for i, (start, stop) in enumerate(slices):
        start += realign
        if i + 1 < len(slices):
            following = slices[i + 1]
            m = _REALIGN.match(text, following[0], following[1])
            if m:
                out.append(text[start : following[0] + len(m.group().rstrip())])
                realign = m.end() - following[0]
                continue
            realign = 0
        if start < stop:
            out.append(text[start:stop])
    return out


# --- NLTKWordTokenizer -------------------------------------------------------------------------
_OPENING = re.compile("([«“‘„]|[`]+)")
_FIRST_QUOTE = re.compile(r'^"')
_BACKTICKS = re.compile(r"(``)")
_QUOTE_AFTER_SPACE = re.compile(r"([ \(\[{<])(\"|\'{2})")
_LEADING_APOSTROPHE = re.compile(r"(?i)(?<!\w)(\')(?!(?:re|ve|ll|m|t|s|d|n)\b)(?=\w)")
_FINAL_PERIOD_QUOTED = re.compile(r'([^\.])(\.)([\]\)}>"\'»”’ ]*)\s*$')
_COMMA = re.compile(r"([:,])([^\d])")
_FINAL_COMMA = re.compile(r"([:,])$")
_ELLIPSIS_DOTS = re.compile(r"\.{2,}")
_SYMBOLS = re.compile(r"[;@#$%&]")
_DASHES = re.compile("[\u2012-\u2015]")
_FINAL_PERIOD = re.compile(r'([^\.])(\.)([\]\)}>"\']*)\s*$')
_QUESTION = re.compile(r"[?!]")
_APOSTROPHE_SPACE = re.compile(r"([^'])' ")
_STAR = re.compile(r"[*]")
_BRACKETS = re.compile(r"[\]\[\(\)\{\}\<\>]")
_CLOSING = re.compile("([»”’])")
_SPACES = re.compile(r"\s+")
_CLITIC = re.compile(r"([^' ])('[sS]|'[mM]|'[dD]|') ")
_CLITIC_LONG = re.compile(r"([^' ])('ll|'LL|'re|'RE|'ve|'VE|n't|N'T) ")
_CONTRACTIONS = [
    re.compile(p)
    for p in (
        r"(?i)\b(can)(not)\b",
        r"(?i)\b(d)('ye)\b",
        r"(?i)\b(gim)(me)\b",
        r"(?i)\b(gon)(na)\b",
        r"(?i)\b(got)(ta)\b",
        r"(?i)\b(lem)(me)\b",
        r"(?i)\b(more)('n)\b",
        r"(?i)\b(wan)(na)(?=\s)",
        r"(?i) ('t)(is)\b",
        r"(?i) ('t)(was)\b",
    )
]
_PAD = r" \g<0> "
_QUOTE_CHARS = frozenset("«“‘„`\"'»”’")
_SYMBOL_CHARS = frozenset(";@#$%&\u2012\u2013\u2014\u2015?!*[](){}<>")


def treebank_tokens(sentence: str) -> list[str]:
    """NLTK's ``NLTKWordTokenizer().tokenize`` of one sentence."""
    text = sentence
    chars = set(text)
    if chars <= _PLAIN_CHARS and _plain(text):
        # words, ", " and a final period: what the rules below do to such a sentence
        text = text.rstrip()
        if text.endswith(".") and text[-2:-1] not in (".", ""):
            text = text[:-1] + " ."
        return text.replace(",", " , ").split()
    quotes = not _QUOTE_CHARS.isdisjoint(chars)
    if quotes:
        text = _OPENING.sub(r" \1 ", text)
        text = _FIRST_QUOTE.sub("``", text)
        text = _BACKTICKS.sub(r" \1 ", text)
        text = _QUOTE_AFTER_SPACE.sub(r"\1 `` ", text)
        text = _LEADING_APOSTROPHE.sub(r"\1 ", text)
    if "." in chars:
        text = _FINAL_PERIOD_QUOTED.sub(r"\1 \2 \3 ", text)
    if "," in chars or ":" in chars:
        text = _COMMA.sub(r" \1 \2", text)
        text = _FINAL_COMMA.sub(r" \1 ", text)
    if "." in chars:
        text = _ELLIPSIS_DOTS.sub(_PAD, text)
    symbols = not _SYMBOL_CHARS.isdisjoint(chars)
    if symbols:
        text = _SYMBOLS.sub(_PAD, text)
        text = _DASHES.sub(_PAD, text)
    if "." in chars:
        text = _FINAL_PERIOD.sub(r"\1 \2\3 ", text)
    if symbols:
        text = _QUESTION.sub(_PAD, text)
    if quotes:
        text = _APOSTROPHE_SPACE.sub(r"\1 ' ", text)
    if symbols:
        text = _STAR.sub(_PAD, text)
        text = _BRACKETS.sub(_PAD, text)
    if "-" in chars:
        text = text.replace("--", " -- ")
    if not quotes and not _maybe_contraction(text):
        return text.split()
    text = " " + text + " "
    if quotes:
        text = _CLOSING.sub(r" \1 ", text)
        text = text.replace("''", " '' ").replace('"', " '' ")
        text = _SPACES.sub(" ", text)
        text = _CLITIC.sub(r"\1 \2 ", text)
        text = _CLITIC_LONG.sub(r"\1 \2 ", text)
    else:
        text = _SPACES.sub(" ", text)
    for pattern in _CONTRACTIONS:
        text = pattern.sub(r" \1 \2 ", text)
    return text.split()


_PLAIN_CHARS = frozenset(string.ascii_lowercase + string.digits + " \n,.-/")


def _plain(text: str) -> bool:
    """Only ", " commas, no "..", "--" or contraction: no rule but the final period applies."""
    return (
        text.count(",") == text.count(", ")
        and ".." not in text
        and "--" not in text
        and not _maybe_contraction(text)
    )


def _maybe_contraction(text: str) -> bool:
    return "nnot" in text or "mme" in text or "nna" in text or "tta" in text


# A sentence end Punkt always takes: "word." (no abbreviation) after whitespace, then whitespace
# and a token that opens no realignment.
_PERIOD_CANDIDATE = re.compile(r"\.(?=\s+\S)")
_PLAIN_BREAK = re.compile(rf"(?<!\S)([a-z]{{2,}})\.(?=\s+[^\s\"\')\]}}{_QUOTES}])")


def _plain_tokens(text: str) -> list[str] | None:
    """Tokens of a text of words, ", " and sentence-final periods; None for any other text."""
    # in such text the only Punkt candidates are periods before whitespace and a token
    ends = [m.end() - 1 for m in _PLAIN_BREAK.finditer(text) if m.group(1) not in ABBREVIATIONS]
    if len(ends) != len(_PERIOD_CANDIDATE.findall(text)):
        return None
    pieces, start = [], 0
    for end in ends:  # each sentence's final period becomes a token
        pieces.append(text[start:end])
        start = end
    last = text[start:].rstrip()
    if last.endswith(".") and last[-2:-1] not in (".", ""):
        last = last[:-1] + " ."
    pieces.append(last)
    return " ".join(pieces).replace(",", " , ").split()


def tokenize(caption: str) -> list[str]:
    """``nltk.word_tokenize(caption.lower())`` after ``normalize``."""
    text = normalize(caption).lower()
    if _PLAIN_CHARS.issuperset(text) and _plain(text):
        tokens = _plain_tokens(text)
        if tokens is not None:
            return tokens
    return [token for sentence in sentences(text) for token in treebank_tokens(sentence)]
