"""The original CHAIR caption parser, restated rule by rule (for tests and the fidelity benchmark).

Rohrbach et al.'s ``utils/chair.py`` turns a caption into COCO object mentions with::

    words = nltk.word_tokenize(caption.lower())
    words = [pattern.en.singularize(w) for w in words]
    # left-to-right two-word scan, the toilet/seat rule, then a filter by synonyms.txt

Neither NLTK nor pattern is a dependency of this project (and NLTK's sentence splitter needs a
downloaded model), so this module restates their rules in plain Python, written for clarity
rather than speed, so that ``chair_server`` can be compared with it caption by caption:

- ``word_tokenize``: Punkt's sentence-boundary decision (period contexts, the English model's
  abbreviation list, the orthographic heuristic as it falls out for lower-cased text, boundary
  realignment), then NLTK 3.10's ``NLTKWordTokenizer`` substitutions on each sentence;
- ``singularize``: pattern.en 3.6's word lists and suffix rules, in their order;
- ``caption_to_words``: the original's scan over the synonyms.txt vocabulary (kept as a list and
  turned into a set for every word, as the original does, so that its cost can be timed).

The synonyms table below is the original file's content, category by category, including the
entries that can never match (a stray leading space, a capital letter, three words).
"""

from __future__ import annotations

import itertools
import re
import string
from collections.abc import Iterator, Mapping


def _words(text: str) -> list[str]:
    """Whitespace-separated words of a long literal (keeps word lists compact)."""
    return text.split()


# --- synonyms.txt -----------------------------------------------------------------------------
# First word of each line: the category. " motor bike" and " cheesecake" carry the leading space
# the original file has after a doubled separator; "iPhone" keeps its capital letter.
ORIGINAL_SYNONYMS: dict[str, tuple[str, ...]] = {
    "person": _words(
        "girl boy man woman kid child chef baker people adult rider children baby worker "
        "passenger sister biker policeman cop officer lady cowboy bride groom male female guy "
        "traveler mother father gentleman pitcher player skier snowboarder skater skateboarder "
        "person foreigner caller offender coworker trespasser patient politician soldier "
        "grandchild serviceman walker drinker doctor bicyclist thief buyer teenager student "
        "camper driver solider hunter shopper villager"
    ),
    "bicycle": ("bike", "unicycle", "minibike", "trike"),
    "car": tuple(
        _words("automobile van minivan sedan suv hatchback cab jeep coupe taxicab limo taxi")
    ),
    "motorcycle": ("scooter", " motor bike", "motor cycle", "motorbike", "moped"),
    "airplane": (
        "jetliner",
        "plane",
        "air plane",
        "monoplane",
        "aircraft",
        "jet",
        "airbus",
        "biplane",
        "seaplane",
    ),
    "bus": ("minibus", "trolley"),
    "train": ("locomotive", "tramway", "caboose"),
    "truck": ("pickup", "lorry", "hauler", "firetruck"),
    "boat": tuple(
        _words(
            "ship liner sailboat motorboat dinghy powerboat speedboat canoe skiff yacht kayak "
            "catamaran pontoon houseboat vessel rowboat trawler ferryboat watercraft tugboat "
            "schooner barge ferry sailboard paddleboat lifeboat freighter steamboat riverboat "
            "battleship steamship"
        )
    ),
    "traffic light": ("street light", "traffic signal", "stop light", "streetlight", "stoplight"),
    "fire hydrant": ("hydrant",),
    "stop sign": (),
    "parking meter": (),
    "bench": ("pew",),
    "bird": tuple(
        _words(
            "ostrich owl seagull goose duck parakeet falcon robin pelican waterfowl heron "
            "hummingbird mallard finch pigeon sparrow seabird osprey blackbird fowl shorebird "
            "woodpecker egret chickadee quail bluebird kingfisher buzzard willet gull swan bluejay "
            "flamingo cormorant parrot loon gosling waterbird pheasant rooster sandpiper crow "
            "raven turkey oriole cowbird warbler magpie peacock cockatiel lorikeet puffin vulture "
            "condor macaw peafowl cockatoo songbird"
        )
    ),
    "cat": ("kitten", "feline", "tabby"),
    "dog": tuple(
        _words(
            "puppy beagle pup chihuahua schnauzer dachshund rottweiler canine pitbull collie pug "
            "terrier poodle labrador doggie doberman mutt doggy spaniel bulldog sheepdog "
            "weimaraner corgi cocker greyhound retriever brindle hound whippet husky"
        )
    ),
    "horse": tuple(
        _words(
            "colt pony racehorse stallion equine mare foal palomino mustang clydesdale bronc bronco"
        )
    ),
    "sheep": ("lamb", "ram", "goat", "ewe"),
    "cow": (
        "cattle",
        "oxen",
        "ox",
        "calf",
        "holstein",
        "heifer",
        "buffalo",
        "bull",
        "zebu",
        "bison",
    ),
    "elephant": (),
    "bear": ("panda",),
    "zebra": (),
    "giraffe": (),
    "backpack": ("knapsack",),
    "umbrella": (),
    "handbag": ("wallet", "purse", "briefcase"),
    "tie": ("bow", "bow tie"),
    "suitcase": ("suit case", "luggage"),
    "frisbee": (),
    "skis": ("ski",),
    "snowboard": (),
    "sports ball": ("ball",),
    "kite": (),
    "baseball bat": (),
    "baseball glove": (),
    "skateboard": (),
    "surfboard": ("longboard", "skimboard", "shortboard", "wakeboard"),
    "tennis racket": ("racket",),
    "bottle": (),
    "wine glass": (),
    "cup": (),
    "fork": (),
    "knife": ("pocketknife", "knive"),
    "spoon": (),
    "bowl": ("container",),
    "banana": (),
    "apple": (),
    "sandwich": ("burger", "sub", "cheeseburger", "hamburger"),
    "orange": (),
    "broccoli": (),
    "carrot": (),
    "hot dog": (),
    "pizza": (),
    "donut": ("doughnut", "bagel"),
    "cake": (" cheesecake", "cupcake", "shortcake", "coffeecake", "pancake"),
    "chair": ("seat", "stool"),
    "couch": ("sofa", "recliner", "futon", "loveseat", "settee", "chesterfield"),
    "potted plant": ("houseplant",),
    "bed": (),
    "dining table": ("table", "desk"),
    "toilet": ("urinal", "commode", "lavatory", "potty"),
    "tv": ("monitor", "televison", "television"),
    "laptop": ("computer", "notebook", "netbook", "lenovo", "macbook", "laptop computer"),
    "mouse": (),
    "remote": (),
    "keyboard": (),
    "cell phone": (
        "mobile phone",
        "phone",
        "cellphone",
        "telephone",
        "phon",
        "smartphone",
        "iPhone",
    ),
    "microwave": (),
    "oven": ("stovetop", "stove", "stove top oven"),
    "toaster": (),
    "sink": (),
    "refrigerator": ("fridge", "freezer"),
    "book": (),
    "clock": (),
    "vase": (),
    "scissors": (),
    "teddy bear": ("teddybear",),
    "hair drier": ("hairdryer",),
    "toothbrush": (),
}
DOUBLE_WORDS = [
    "motor bike",
    "motor cycle",
    "air plane",
    "traffic light",
    "street light",
    "traffic signal",
    "stop light",
    "fire hydrant",
    "stop sign",
    "parking meter",
    "suit case",
    "sports ball",
    "baseball bat",
    "baseball glove",
    "tennis racket",
    "wine glass",
    "hot dog",
    "cell phone",
    "mobile phone",
    "teddy bear",
    "hair drier",
    "potted plant",
    "bow tie",
    "laptop computer",
    "stove top oven",
    "home plate",
    "train track",
]
ANIMAL_WORDS = _words("bird cat dog horse sheep cow elephant bear zebra giraffe animal cub")
VEHICLE_WORDS = ("jet", "train")


# --- Punkt sentence boundaries (nltk.tokenize.punkt, English model) ----------------------------
# Abbreviation types of NLTK's English Punkt model (a period after them is no sentence break).
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
# The model's collocations pair a number or an initial with a name ("##number## credit", "b
# smith"); they never touch a vocabulary word and are left out.
_QUOTES = "\u2018\u2019\u201c\u201d\xab\xbb"
_NON_WORD = rf"(?:[)\";}}\]\*:@\'\({{\[{_QUOTES}!?])"
_MULTI_CHAR = r"(?:\-{2,}|\.{2,}|(?:\.\s){2,}\.)"
_PERIOD_CONTEXT = re.compile(
    rf"[.?!](?=(?P<after_tok>{_NON_WORD}|\s+(?P<next_tok>\S+)))", re.UNICODE
)
_PUNKT_WORD = re.compile(
    rf"({_MULTI_CHAR}|(?=[^\(\"\`{{\[:;&\#\*@\)}}\]\-,])\S+?"
    rf"(?=\s|$|{_NON_WORD}|{_MULTI_CHAR}|,(?=$|\s|{_NON_WORD}|{_MULTI_CHAR}))|\S)",
    re.UNICODE,
)
_REALIGN = re.compile(rf"[\"\')\]}}{_QUOTES}]+?(?:\s+|(?=--)|$)", re.MULTILINE)
_NUMERIC = re.compile(r"^-?[\.,]?\d[\d,\.-]*\.?$")
_ELLIPSIS = re.compile(r"\.\.+$")
_INITIAL = re.compile(r"[^\W\d]\.$", re.UNICODE)


class _Token:
    def __init__(self, tok: str) -> None:
        self.tok = tok
        self.type = _NUMERIC.sub("##number##", tok.lower())
        self.period_final = tok.endswith(".")
        self.sentbreak = self.abbr = self.ellipsis = False

    @property
    def type_no_period(self) -> str:
        return self.type[:-1] if len(self.type) > 1 and self.type[-1] == "." else self.type


def _ortho_heuristic(token: _Token) -> bool | str:
    """Punkt's orthographic evidence. Without the model's table every word counts as one seen
    capitalised (true of common words), so a lower-case word is never a sentence starter."""
    if token.tok in (";", ":", ",", ".", "!", "?"):
        return False
    if token.tok[0].islower():
        return False
    return "unknown"


def _annotate(tokens: list[_Token]) -> None:
    for token in tokens:  # first pass: by type
        tok = token.tok
        if tok in (".", "?", "!"):
            token.sentbreak = True
        elif _ELLIPSIS.match(tok):
            token.ellipsis = True
        elif token.period_final and not tok.endswith(".."):
            stem = tok[:-1].lower()
            if stem in ABBREVIATIONS or stem.split("-")[-1] in ABBREVIATIONS:
                token.abbr = True
            else:
                token.sentbreak = True
    for first, second in itertools.pairwise(tokens):  # second pass: by context
        if not first.period_final:
            continue
        initial = bool(_INITIAL.match(first.tok))
        if (first.abbr or first.ellipsis) and not initial and _ortho_heuristic(second) is True:
            first.sentbreak = True
            continue
        numeric = first.type_no_period == "##number##"
        if (initial or numeric) and _ortho_heuristic(second) is False:
            first.sentbreak = False
            first.abbr = True


def _contains_sentbreak(context: str) -> bool:
    tokens = [_Token(t) for line in context.split("\n") for t in _PUNKT_WORD.findall(line)]
    _annotate(tokens)
    return any(t.sentbreak for t in tokens[:-1])


def _end_contexts(text: str) -> Iterator[tuple[re.Match, str]]:
    previous_slice, previous_match = slice(0, 0), None
    for match in _PERIOD_CONTEXT.finditer(text):
        before = text[previous_slice.stop : match.start()]
        last_space = max((i for i, c in enumerate(before) if c in string.whitespace), default=0)
        if last_space:
            start = last_space + previous_slice.stop + 1
        else:
            start = previous_slice.start
        word_slice = slice(start, match.start())
        if previous_match and previous_slice.stop <= word_slice.start:
            yield (
                previous_match,
                (text[previous_slice] + previous_match.group() + previous_match.group("after_tok")),
            )
        previous_match, previous_slice = match, word_slice
    if previous_match:
        yield (
            previous_match,
            (text[previous_slice] + previous_match.group() + previous_match.group("after_tok")),
        )


def sentences(text: str) -> list[str]:
    """Punkt's ``sent_tokenize`` for a lower-cased text (English model parameters)."""
    slices, last_break = [], 0
    for match, context in _end_contexts(text):
        if _contains_sentbreak(context):
            slices.append(slice(last_break, match.end()))
            last_break = match.start("next_tok") if match.group("next_tok") else match.end()
    slices.append(slice(last_break, len(text.rstrip())))
    out, realign = [], 0
    for i, first in enumerate(slices):
        first = slice(first.start + realign, first.stop)
        if i + 1 == len(slices):
            if text[first]:
                out.append(text[first])
            continue
        second = slices[i + 1]
        m = _REALIGN.match(text[second])
        if m:
            out.append(text[first.start : second.start + len(m.group(0).rstrip())])
            realign = m.end()
        else:
            realign = 0
            if text[first]:
                out.append(text[first])
    return out


# --- NLTKWordTokenizer (nltk 3.10) ---------------------------------------------------------------
_STARTING_QUOTES = [
    (re.compile("([«“‘„]|[`]+)"), r" \1 "),
    (re.compile(r"^\""), r"``"),
    (re.compile(r"(``)"), r" \1 "),
    (re.compile(r"([ \(\[{<])(\"|\'{2})"), r"\1 `` "),
    (re.compile(r"(?i)(?<!\w)(\')(?!(?:re|ve|ll|m|t|s|d|n)\b)(?=\w)"), r"\1 "),
]
_PUNCTUATION = [
    (re.compile(r'([^\.])(\.)([\]\)}>"\'»”’ ]*)\s*$'), r"\1 \2 \3 "),
    (re.compile(r"([:,])([^\d])"), r" \1 \2"),
    (re.compile(r"([:,])$"), r" \1 "),
    (re.compile(r"\.{2,}"), r" \g<0> "),
    (re.compile(r"[;@#$%&]"), r" \g<0> "),
    (re.compile("[\u2012-\u2015]"), r" \g<0> "),
    (re.compile(r'([^\.])(\.)([\]\)}>"\']*)\s*$'), r"\1 \2\3 "),
    (re.compile(r"[?!]"), r" \g<0> "),
    (re.compile(r"([^'])' "), r"\1 ' "),
    (re.compile(r"[*]"), r" \g<0> "),
]
_PARENS = (re.compile(r"[\]\[\(\)\{\}\<\>]"), r" \g<0> ")
_DOUBLE_DASHES = (re.compile(r"--"), r" -- ")
_ENDING_QUOTES = [
    (re.compile("([»”’])"), r" \1 "),
    (re.compile(r"''"), " '' "),
    (re.compile(r'"'), " '' "),
    (re.compile(r"\s+"), " "),
    (re.compile(r"([^' ])('[sS]|'[mM]|'[dD]|') "), r"\1 \2 "),
    (re.compile(r"([^' ])('ll|'LL|'re|'RE|'ve|'VE|n't|N'T) "), r"\1 \2 "),
]
_CONTRACTIONS = [
    re.compile(p)
    for p in (
        r"(?i)\b(can)(?#X)(not)\b",
        r"(?i)\b(d)(?#X)('ye)\b",
        r"(?i)\b(gim)(?#X)(me)\b",
        r"(?i)\b(gon)(?#X)(na)\b",
        r"(?i)\b(got)(?#X)(ta)\b",
        r"(?i)\b(lem)(?#X)(me)\b",
        r"(?i)\b(more)(?#X)('n)\b",
        r"(?i)\b(wan)(?#X)(na)(?=\s)",
        r"(?i) ('t)(?#X)(is)\b",
        r"(?i) ('t)(?#X)(was)\b",
    )
]


def treebank_tokens(sentence: str) -> list[str]:
    """``NLTKWordTokenizer().tokenize`` of one sentence."""
    text = sentence
    for pattern, replacement in _STARTING_QUOTES + _PUNCTUATION + [_PARENS, _DOUBLE_DASHES]:
        text = pattern.sub(replacement, text)
    text = " " + text + " "
    for pattern, replacement in _ENDING_QUOTES:
        text = pattern.sub(replacement, text)
    for pattern in _CONTRACTIONS:
        text = pattern.sub(r" \1 \2 ", text)
    return text.split()


def word_tokenize(text: str) -> list[str]:
    """``nltk.word_tokenize``: Punkt sentences, then the Treebank rules on each."""
    return [token for sentence in sentences(text) for token in treebank_tokens(sentence)]


# --- pattern.en singularize (pattern 3.6) ---------------------------------------------------------
PLURAL_PREPOSITIONS = frozenset(
    _words(
        "about before during of till above behind except off to across below for on under "
        "after beneath from onto until among beside in out unto around besides into over upon "
        "at between near since with athwart betwixt beyond but by"
    )
)
UNINFLECTED = _words(
    "bison debris headquarters pincers trout bream diabetes herpes pliers tuna breeches djinn "
    "high-jinks proceedings whiting britches eland homework rabies wildebeest carp elk innings "
    "salmon chassis flounder jackanapes scissors christmas gallows mackerel series clippers "
    "georgia measles shears cod graffiti mews species contretemps mumps swine corps news swiss"
)
UNCOUNTABLE = _words(
    "advice equipment happiness luggage news software bread fruit information mathematics "
    "progress understanding butter furniture ketchup mayonnaise research water cheese garbage "
    "knowledge meat rice electricity gravel love mustard sand"
)
IE_WORDS = _words(
    "alergie cutie hoagie newbie softie veggie auntie doggie hottie nightie sortie weenie beanie "
    "eyrie indie oldie stoolie yuppie birdie freebie junkie ^pie sweetie zombie bogie goonie "
    "laddie pixie techie bombie groupie laramie quickie ^tie collie hankie lingerie reverie "
    "toughie cookie hippie meanie rookie valkyrie"
)
IRREGULAR = dict(
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
SINGULAR_RULES = [
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


def singularize(word: str) -> str:
    """``pattern.en.singularize`` (noun, no custom table)."""
    if "-" in word:
        parts = word.split("-")
        if len(parts) > 1 and parts[1] in PLURAL_PREPOSITIONS:
            return singularize(parts[0]) + "-" + "-".join(parts[1:])
    if word.endswith("'"):
        return singularize(word[:-1]) + "'s"
    w = word.lower()
    for x in UNINFLECTED:
        if x.endswith(w):
            return word
    for x in UNCOUNTABLE:
        if x.endswith(w):
            return word
    for x in IE_WORDS:
        if w.endswith(x + "s"):
            return w
    for x, singular in IRREGULAR.items():
        if w.endswith(x):
            return re.sub("(?i)" + x + "$", singular, word)
    for pattern, replacement in SINGULAR_RULES:
        if pattern.search(word):
            return pattern.sub(replacement, word)
    return word


# --- the original's caption_to_words ------------------------------------------------------------
class OriginalChair:
    """``CHAIR.caption_to_words`` of the original code, on the restated NLTK and pattern rules.

    ``exceptions`` maps a token to the word it stands for before the singularizer runs; the
    default (none) is the original exactly. Passing ``chair_server.vocabulary.SINGULAR_EXCEPTIONS``
    applies the project's one documented difference (bus, ties: counted as a WordNet lemmatizer
    counts them).
    """

    def __init__(self, exceptions: Mapping[str, str] | None = None) -> None:
        self.exceptions = dict(exceptions or {})
        self.mscoco_objects: list[str] = []
        self.inverse_synonym_dict: dict[str, str] = {}
        for category, entries in ORIGINAL_SYNONYMS.items():
            synonyms = [category, *entries]
            self.mscoco_objects.extend(synonyms)
            for s in synonyms:
                self.inverse_synonym_dict[s] = category
        self.double_word_dict = {w: w for w in DOUBLE_WORDS}
        for animal in ANIMAL_WORDS:
            self.double_word_dict[f"baby {animal}"] = animal
            self.double_word_dict[f"adult {animal}"] = animal
        for vehicle in VEHICLE_WORDS:
            self.double_word_dict[f"passenger {vehicle}"] = vehicle
        self.double_word_dict["bow tie"] = "tie"
        self.double_word_dict["toilet seat"] = "toilet"
        self.double_word_dict["wine glas"] = "wine glass"

    def singular(self, token: str) -> str:
        found = self.exceptions.get(token)
        return found if found is not None else singularize(token)

    def caption_to_words(self, caption: str) -> tuple[list[str], list[str]]:
        """(vocabulary words, their categories) in caption order, as the original returns them."""
        words = [self.singular(w) for w in word_tokenize(caption.lower())]
        i, double_words = 0, []
        while i < len(words):
            double_word = " ".join(words[i : i + 2])
            if double_word in self.double_word_dict:
                double_words.append(self.double_word_dict[double_word])
                i += 2
            else:
                double_words.append(words[i])
                i += 1
        words = double_words
        if ("toilet" in words) & ("seat" in words):
            words = [word for word in words if word != "seat"]
        words = [word for word in words if word in set(self.mscoco_objects)]
        return words, [self.inverse_synonym_dict[word] for word in words]

    def mentions(self, caption: str) -> list[tuple[str, str]]:
        """``[(word, category), ...]``: the shape of ``ChairScorer.mentions``."""
        return list(zip(*self.caption_to_words(caption)))
