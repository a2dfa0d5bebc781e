"""The CHAIR vocabulary: COCO categories, the words that count for them, two-word expressions.

This is data, reviewed once. It reproduces the effective vocabulary of the original CHAIR code
(Rohrbach et al., EMNLP 2018: ``data/synonyms.txt`` and the rules in ``utils/chair.py``), so that
every caption gets the original's mention decisions and published numbers are reproduced:

- the words are those the original can ever match. Its list also holds entries no caption can
  match, and they stay dead here: " motor bike" and " cheesecake" (a stray leading space in the
  file), "iPhone" (captions are lower-cased), "stove top oven" (three words; the scan joins two).
  "motor bike" is still joined as a two-word expression, which then counts nothing, as in the
  original. "hair dryer" is not in the list at all. "knive" and "phon" are live entries (they
  existed to catch singularizer misses) and count as knife and cell phone;
- words are compared after the original's singularizer (``singular.py``): "sheeps" is a sheep,
  "kine" a cow, and "tennis rackets" are "tenni racket", so only "racket" counts;
- the one deliberate difference, ``SINGULAR_EXCEPTIONS``: vocabulary words and plurals that the
  rule-based singularizer turns into non-words (bus -> bu, ties -> ty, canoes -> cano, ...) are
  counted as the WordNet lemmatizer of the widely used Python 3 port counts them.

False friends of the original list are kept because every published number counts them:

- "orange" (also a colour) -> orange; "bow" (also a ribbon or a ship's bow) -> tie;
- "table"/"desk" -> dining table; "seat"/"stool" -> chair (but see the toilet/seat rule);
- "ball" -> sports ball; "container" -> bowl; "sub" -> sandwich;
- "pitcher" and "player" -> person (a baseball pitcher, not a jug);
- "notebook" -> laptop, "monitor" -> tv, "trolley" -> bus, "pickup" -> truck.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

# The 80 COCO instance categories with their real ids (gaps at 12, 26, 29, 30, 45, 66, 68, 69,
# 71, 83), in id order.
COCO_CATEGORIES: tuple[tuple[int, str], ...] = (
    (1, "person"),
    (2, "bicycle"),
    (3, "car"),
    (4, "motorcycle"),
    (5, "airplane"),
    (6, "bus"),
    (7, "train"),
    (8, "truck"),
    (9, "boat"),
    (10, "traffic light"),
    (11, "fire hydrant"),
    (13, "stop sign"),
    (14, "parking meter"),
    (15, "bench"),
    (16, "bird"),
    (17, "cat"),
    (18, "dog"),
    (19, "horse"),
    (20, "sheep"),
    (21, "cow"),
    (22, "elephant"),
    (23, "bear"),
    (24, "zebra"),
    (25, "giraffe"),
    (27, "backpack"),
    (28, "umbrella"),
    (31, "handbag"),
    (32, "tie"),
    (33, "suitcase"),
    (34, "frisbee"),
    (35, "skis"),
    (36, "snowboard"),
    (37, "sports ball"),
    (38, "kite"),
    (39, "baseball bat"),
    (40, "baseball glove"),
    (41, "skateboard"),
    (42, "surfboard"),
    (43, "tennis racket"),
    (44, "bottle"),
    (46, "wine glass"),
    (47, "cup"),
    (48, "fork"),
    (49, "knife"),
    (50, "spoon"),
    (51, "bowl"),
    (52, "banana"),
    (53, "apple"),
    (54, "sandwich"),
    (55, "orange"),
    (56, "broccoli"),
    (57, "carrot"),
    (58, "hot dog"),
    (59, "pizza"),
    (60, "donut"),
    (61, "cake"),
    (62, "chair"),
    (63, "couch"),
    (64, "potted plant"),
    (65, "bed"),
    (67, "dining table"),
    (70, "toilet"),
    (72, "tv"),
    (73, "laptop"),
    (74, "mouse"),
    (75, "remote"),
    (76, "keyboard"),
    (77, "cell phone"),
    (78, "microwave"),
    (79, "oven"),
    (80, "toaster"),
    (81, "sink"),
    (82, "refrigerator"),
    (84, "book"),
    (85, "clock"),
    (86, "vase"),
    (87, "scissors"),
    (88, "teddy bear"),
    (89, "hair drier"),
    (90, "toothbrush"),
)

CATEGORY_NAMES: tuple[str, ...] = tuple(name for _, name in COCO_CATEGORIES)
CATEGORY_IDS: dict[int, str] = dict(COCO_CATEGORIES)

# Words (singular) that count as a mention of each category, besides the category name itself:
# "category: synonym, synonym, ...". Two-word entries are matched through the pair scan (see
# TWO_WORD_EXPRESSIONS).
_SYNONYM_TABLE = """
person: girl, boy, man, woman, kid, child, chef, baker, people, adult, rider, children, baby, worker, passenger, sister, biker, policeman, cop, officer, lady, cowboy, bride, groom, male, female, guy, traveler, mother, father, gentleman, pitcher, player, skier, snowboarder, skater, skateboarder, foreigner, caller, offender, coworker, trespasser, patient, politician, soldier, grandchild, serviceman, walker, drinker, doctor, bicyclist, thief, buyer, teenager, student, camper, driver, solider, hunter, shopper, villager
bicycle: bike, unicycle, minibike, trike
car: automobile, van, minivan, sedan, suv, hatchback, cab, jeep, coupe, taxicab, limo, taxi
motorcycle: scooter, motor cycle, motorbike, moped
airplane: jetliner, plane, air plane, monoplane, aircraft, jet, airbus, biplane, seaplane
bus: minibus, trolley
train: locomotive, tramway, caboose
truck: pickup, lorry, hauler, firetruck
boat: ship, liner, sailboat, motorboat, dinghy, powerboat, speedboat, canoe, skiff, yacht, kayak, catamaran, pontoon, houseboat, vessel, rowboat, trawler, ferryboat, watercraft, tugboat, schooner, barge, ferry, sailboard, paddleboat, lifeboat, freighter, steamboat, riverboat, battleship, steamship
traffic light: street light, traffic signal, stop light, streetlight, stoplight
fire hydrant: hydrant
stop sign:
parking meter:
bench: pew
bird: ostrich, owl, seagull, goose, duck, parakeet, falcon, robin, pelican, waterfowl, heron, hummingbird, mallard, finch, pigeon, sparrow, seabird, osprey, blackbird, fowl, shorebird, woodpecker, egret, chickadee, quail, bluebird, kingfisher, buzzard, willet, gull, swan, bluejay, flamingo, cormorant, parrot, loon, gosling, waterbird, pheasant, rooster, sandpiper, crow, raven, turkey, oriole, cowbird, warbler, magpie, peacock, cockatiel, lorikeet, puffin, vulture, condor, macaw, peafowl, cockatoo, songbird
cat: kitten, feline, tabby
dog: puppy, beagle, pup, chihuahua, schnauzer, dachshund, rottweiler, canine, pitbull, collie, pug, terrier, poodle, labrador, doggie, doberman, mutt, doggy, spaniel, bulldog, sheepdog, weimaraner, corgi, cocker, greyhound, retriever, brindle, hound, whippet, husky
horse: colt, pony, racehorse, stallion, equine, mare, foal, palomino, mustang, clydesdale, bronc, bronco
sheep: lamb, ram, goat, ewe
cow: cattle, oxen, ox, calf, holstein, heifer, buffalo, bull, zebu, bison
elephant:
bear: panda
zebra:
giraffe:
backpack: knapsack
umbrella:
handbag: wallet, purse, briefcase
tie: bow, bow tie
suitcase: suit case, luggage
frisbee:
skis: ski
snowboard:
sports ball: ball
kite:
baseball bat:
baseball glove:
skateboard:
surfboard: longboard, skimboard, shortboard, wakeboard
tennis racket: racket
bottle:
wine glass:
cup:
fork:
knife: pocketknife, knive
spoon:
bowl: container
banana:
apple:
sandwich: burger, sub, cheeseburger, hamburger
orange:
broccoli:
carrot:
hot dog:
pizza:
donut: doughnut, bagel
cake: cupcake, shortcake, coffeecake, pancake
chair: seat, stool
couch: sofa, recliner, futon, loveseat, settee, chesterfield
potted plant: houseplant
bed:
dining table: table, desk
toilet: urinal, commode, lavatory, potty
tv: monitor, televison, television
laptop: computer, notebook, netbook, lenovo, macbook, laptop computer
mouse:
remote:
keyboard:
cell phone: mobile phone, phone, cellphone, telephone, phon, smartphone
microwave:
oven: stovetop, stove
toaster:
sink:
refrigerator: fridge, freezer
book:
clock:
vase:
scissors:
teddy bear: teddybear
hair drier: hairdryer
toothbrush:
"""
SYNONYMS: dict[str, tuple[str, ...]] = {
    line.split(":")[0].strip(): tuple(w.strip() for w in line.split(":")[1].split(",") if w.strip())
    for line in _SYNONYM_TABLE.strip().splitlines()
}


# Names accepted in ground-truth files (detector outputs, caches) that never count in a caption:
# the original list's dead entries and the common spelling "hair dryer".
GROUND_TRUTH_ALIASES: dict[str, str] = {
    "motor bike": "motorcycle",
    "cheesecake": "cake",
    "iphone": "cell phone",
    "stove top oven": "oven",
    "hair dryer": "hair drier",
}

# The one deliberate difference from the original: these tokens are vocabulary words (or their
# plurals) that its rule-based singularizer turns into non-words, so the original never counts
# them (bus -> "bu", ties -> "ty", canoes -> "cano", magpies -> "magpy"; -ie words such as
# "collies" are returned unchanged). They count as WordNet's lemmatizer, used by the common
# Python 3 port of CHAIR, counts them. Token -> the singular vocabulary word.
SINGULAR_EXCEPTIONS: dict[str, str] = {
    "bus": "bus",
    "busses": "bus",
    "minibus": "minibus",
    "airbus": "airbus",
    "ties": "tie",
    "canoes": "canoe",
    "collies": "collie",
    "doggies": "doggie",
    "magpies": "magpie",
}

# Two-word expressions, matched on singularized words left to right before single words. Value:
# the vocabulary word the pair stands for, or None for pairs that count nothing (the pair is
# consumed, so neither of its words counts either).
TWO_WORD_EXPRESSIONS: dict[str, str | None] = {
    # compounds that are one object (each is a category name or a synonym above)
    "motor cycle": "motor cycle",
    "air plane": "air plane",
    "traffic light": "traffic light",
    "street light": "street light",
    "traffic signal": "traffic signal",
    "stop light": "stop light",
    "fire hydrant": "fire hydrant",
    "stop sign": "stop sign",
    "parking meter": "parking meter",
    "suit case": "suit case",
    "sports ball": "sports ball",  # never met: the singularizer makes "sports" "sport"
    "baseball bat": "baseball bat",
    "baseball glove": "baseball glove",
    "tennis racket": "tennis racket",  # never met: "tennis" becomes "tenni"
    "wine glass": "wine glass",
    "wine glas": "wine glass",  # "glass" becomes "glas"
    "hot dog": "hot dog",
    "cell phone": "cell phone",
    "mobile phone": "mobile phone",
    "teddy bear": "teddy bear",
    "hair drier": "hair drier",
    "potted plant": "potted plant",
    "laptop computer": "laptop computer",
    # "bow tie" is a tie, never a bow
    "bow tie": "tie",
    # "toilet seat" is part of the toilet, not a chair
    "toilet seat": "toilet",
    # pairs that count nothing: "motor bike" is a dead entry of the original list
    "motor bike": None,
    "home plate": None,
    "train track": None,
}
# "baby X"/"adult X" for animals -> X (so "baby"/"adult" do not fire as person); "animal" and
# "cub" are not categories, so "baby animal" is no mention at all.
_QUALIFIED_ANIMALS = (
    "bird", "cat", "dog", "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe",
    "animal", "cub",
)  # fmt: skip
for _animal in _QUALIFIED_ANIMALS:
    TWO_WORD_EXPRESSIONS[f"baby {_animal}"] = _animal if _animal not in ("animal", "cub") else None
    TWO_WORD_EXPRESSIONS[f"adult {_animal}"] = _animal if _animal not in ("animal", "cub") else None
# "passenger jet/train" -> the vehicle (so "passenger" does not fire as person)
for _vehicle in ("jet", "train"):
    TWO_WORD_EXPRESSIONS[f"passenger {_vehicle}"] = _vehicle
del _animal, _vehicle

# If a caption mentions both of these words, the second word's mentions are dropped
# ("the seat of the toilet" must not fire as chair).
TOILET_SEAT_RULE: tuple[str, str] = ("toilet", "seat")

VOCABULARY_VERSION = "2"


def word_to_category() -> dict[str, str]:
    """Every vocabulary word that can count (category names and synonyms) -> its category."""
    table: dict[str, str] = {}
    for category in CATEGORY_NAMES:
        for word in (category, *SYNONYMS[category]):
            if table.setdefault(word, category) != category:
                raise ValueError(f"vocabulary word {word!r} belongs to two categories")
    return table


def name_to_category() -> dict[str, str]:
    """Names a ground-truth file may use: the vocabulary plus ``GROUND_TRUTH_ALIASES``."""
    return {**GROUND_TRUTH_ALIASES, **word_to_category()}


def pair_table() -> dict[tuple[str, str], str | None]:
    """(first singular word, second singular word) of every two-word expression -> its word."""
    return {tuple(k.split(" ")): v for k, v in TWO_WORD_EXPRESSIONS.items()}  # type: ignore[misc]


def fingerprint(extra: Mapping[str, object] | None = None) -> str:
    """A short hash of the vocabulary and rules: ground-truth caches are keyed by it."""
    payload = json.dumps(
        {
            "version": VOCABULARY_VERSION,
            "synonyms": SYNONYMS,
            "exceptions": SINGULAR_EXCEPTIONS,
            "pairs": TWO_WORD_EXPRESSIONS,
            "rule": TOILET_SEAT_RULE,
            "extra": extra or {},
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]
