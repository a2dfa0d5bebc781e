"""Singular of a caption token, as the original CHAIR code computes it.

The original calls ``pattern.en.singularize`` (pattern 3.6) on every token. pattern is no
dependency here; its noun rules are restated below, checked in the same order: uninflected and
uncountable words (``x.endswith(word)`` over the lists, so any tail of "scissors" or "luggage"
stays as it is), -ie words, irregular plurals, then suffix rules. Its misses are part of the
metric and kept ("tennis" -> "tenni", so "tennis racket" is never one expression; "kine" -> "cow"),
with the one documented exception applied by the caller (``vocabulary.SINGULAR_EXCEPTIONS``).
"""

from __future__ import annotations

import re


def _words(text: str) -> list[str]:
    """Whitespace-separated words of a long literal (keeps word lists compact)."""
    return text.split()


_PREPOSITIONS = frozenset(
    _words(
        "about before during of till above behind except off to across below for on under "
        "after beneath from onto until among beside in out unto around besides into over upon "
        "at between near since with athwart betwixt beyond but by"
    )
)
_UNCHANGED = _words(
    "bison debris headquarters pincers trout bream diabetes herpes pliers tuna breeches djinn "
    "high-jinks proceedings whiting britches eland homework rabies wildebeest carp elk innings "
    "salmon chassis flounder jackanapes scissors christmas gallows mackerel series clippers "
    "georgia measles shears cod graffiti mews species contretemps mumps swine corps news swiss "
    # uncountable
    "advice equipment happiness luggage software bread fruit information mathematics progress "
    "understanding butter furniture ketchup mayonnaise research water cheese garbage knowledge "
    "meat rice electricity gravel love mustard sand"
)
# every tail of an unchanged word: pattern returns a word unchanged when a listed word ends with it
_UNCHANGED_TAILS = frozenset(w[i:] for w in _UNCHANGED for i in range(len(w)))
_IE_PLURALS = frozenset(
    w + "s"
    for w in _words(
        "alergie cutie hoagie newbie softie veggie auntie doggie hottie nightie sortie weenie "
        "beanie eyrie indie oldie stoolie yuppie birdie freebie junkie ^pie sweetie zombie bogie "
        "goonie laddie pixie techie bombie groupie laramie quickie ^tie collie hankie lingerie "
        "reverie toughie cookie hippie meanie rookie valkyrie"
    )
)
_IE_LENGTHS = sorted({len(w) for w in _IE_PLURALS})
_IRREGULAR = dict(
    pair.split(":")
    for pair in _words(
        "atlantes:atlas atlases:atlas axes:axe beeves:beef brethren:brother children:child "
        "corpora:corpus corpuses:corpus ephemerides:ephemeris feet:foot ganglia:ganglion "
        "geese:goose genera:genus genii:genie graffiti:graffito helves:helve kine:cow "
        "leaves:leaf loaves:loaf men:man mongooses:mongoose monies:money moves:move "
        "mythoi:mythos numena:numen occipita:occiput octopodes:octopus opera:opus opuses:opus "
        "our:my oxen:ox penes:penis penises:penis people:person sexes:sex "
        "soliloquies:soliloquy teeth:tooth testes:testis trilbys:trilby turves:turf zoa:zoon"
    )
)
# no irregular plural ends with another, so the first tail found is pattern's first match
_IRREGULAR_LENGTHS = sorted({len(w) for w in _IRREGULAR})
_RULES = [
    (re.compile(pattern), replacement)
    for pattern, replacement in (
        (r"(?i)(.)ae$", r"\1a"),
        (r"(?i)(.)itis$", r"\1itis"),
        (r"(?i)(.)eaux$", r"\1eau"),
        (r"(?i)(quiz)zes$", r"\1"),
        (r"(?i)(matr)ices$", r"\1ix"),
        (r"(?i)(ap|vert|ind)ices$", r"\1ex"),
        (r"(?i)^(ox)en", r"\1"),
        (r"(?i)(alias|status)es$", r"\1"),
        (r"(?i)([octop|vir])i$", r"\1us"),
        (r"(?i)(cris|ax|test)es$", r"\1is"),
        (r"(?i)(shoe)s$", r"\1"),
        (r"(?i)(o)es$", r"\1"),
        (r"(?i)(bus)es$", r"\1"),
        (r"(?i)([m|l])ice$", r"\1ouse"),
        (r"(?i)(x|ch|ss|sh)es$", r"\1"),
        (r"(?i)(m)ovies$", r"\1ovie"),
        (r"(?i)(.)ombies$", r"\1ombie"),
        (r"(?i)(s)eries$", r"\1eries"),
        (r"(?i)([^aeiouy]|qu)ies$", r"\1y"),
        (r"([aeo]l)ves$", r"\1f"),
        (r"([^d]ea)ves$", r"\1f"),
        (r"arves$", "arf"),
        (r"erves$", "erve"),
        (r"([nlw]i)ves$", r"\1fe"),
        (r"(?i)([lr])ves$", r"\1f"),
        (r"([aeo])ves$", r"\1ve"),
        (r"(?i)(sive)s$", r"\1"),
        (r"(?i)(tive)s$", r"\1"),
        (r"(?i)(hive)s$", r"\1"),
        (r"(?i)([^f])ves$", r"\1fe"),
        (r"(?i)(^analy)ses$", r"\1sis"),
        (r"(?i)((a)naly|(b)a|(d)iagno|(p)arenthe|(p)rogno|(s)ynop|(t)he)ses$", r"\1\2sis"),
        (r"(?i)(.)opses$", r"\1opsis"),
        (r"(?i)(.)yses$", r"\1ysis"),
        (r"(?i)(h|d|r|o|n|b|cl|p)oses$", r"\1ose"),
        (r"(?i)(fruct|gluc|galact|lact|ket|malt|rib|sacchar|cellul)ose$", r"\1ose"),
        (r"(?i)(.)oses$", r"\1osis"),
        (r"(?i)([ti])a$", r"\1um"),
        (r"(?i)(n)ews$", r"\1ews"),
        (r"(?i)s$", ""),
    )
]


def singularize(token: str) -> str:
    """pattern.en's singular of a lower-cased token."""
    if "-" in token:
        parts = token.split("-")
        if parts[1] in _PREPOSITIONS:
            return singularize(parts[0]) + "-" + "-".join(parts[1:])
    if token.endswith("'"):
        return singularize(token[:-1]) + "'s"
    if token in _UNCHANGED_TAILS:
        return token
    for n in _IE_LENGTHS:
        if token[-n:] in _IE_PLURALS and len(token) >= n:
            return token
    for n in _IRREGULAR_LENGTHS:
        tail = token[-n:]
        if len(token) >= n and tail in _IRREGULAR:
            return token[:-n] + _IRREGULAR[tail]
    for pattern, replacement in _RULES:
        if pattern.search(token):
            return pattern.sub(replacement, token)
    return token
