"""POPE: loading the released format, the rebuild from annotations (on a hand-made map and on the
synthetic COCO world), POPE's answer parsing and its metrics."""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entropyrl.data.io import InputFileError
from entropyrl.evaluation.pope import (
    POPE_SETTINGS,
    POPE_SHA256,
    ChecksumError,
    build_pope,
    coco_objects_by_image,
    load_pope_questions,
    parse_answer,
    pope_metrics,
    pope_question_text,
    released_set_problems,
    verify_checksum,
)
from entropyrl.rig.synthetic import build_synthetic_coco

# Image 5 has two objects only: never eligible. First-seen category order over images 1-4:
# dog, person, frisbee, car, bus, traffic light, cat, couch.
HAND = {
    4: ["dog", "cat", "couch"],
    2: ["person", "car", "bus", "traffic light"],
    1: ["dog", "person", "dog", "frisbee"],  # "dog" twice: kept once, at its first place
    5: ["cat", "couch"],
    3: ["car", "person", "bus"],
}


def by_image(questions):
    grouped: dict[int, list] = {}
    for q in questions:
        grouped.setdefault(q.image_id, []).append(q)
    return grouped


def distinct(names):
    return list(dict.fromkeys(names))


def check_invariants(questions, objects, positives=3):
    """Balanced; yes/no alternate per image; yes = the first objects in order; no = absent."""
    assert [q.question_id for q in questions] == list(range(len(questions)))
    labels = Counter(q.label for q in questions)
    assert labels["yes"] == labels["no"] == len(questions) // 2
    for image_id, asked in by_image(questions).items():
        names = distinct(objects[image_id])
        assert [q.label for q in asked] == ["yes", "no"] * positives
        assert [q.object for q in asked if q.label == "yes"] == names[:positives]
        negatives = [q.object for q in asked if q.label == "no"]
        assert not set(negatives) & set(names)
        assert len(set(negatives)) == len(negatives)
        for q in asked:
            assert q.text == pope_question_text(q.object)
            assert q.image == f"COCO_val2014_{image_id:012d}.jpg"


def first_seen_ranking(images, score):
    """Categories by `score` (higher first), ties by first appearance over `images` in order."""
    order = distinct(name for names in images for name in names)
    return sorted(order, key=lambda name: (-score(name), order.index(name)))


def expected_ranked_negative(ranking, present, used):
    return next((name for name in ranking if name not in present and name not in used), None)


def check_ranked_negatives(questions, objects, setting):
    """Recompute popular / adversarial negatives from scratch; None marks a random fallback."""
    grouped = by_image(questions)
    chosen = [distinct(objects[i]) for i in sorted(grouped)]
    images_with = Counter(name for names in chosen for name in set(names))
    fallbacks = 0
    for image_id, asked in grouped.items():
        present = set(objects[image_id])
        used: set[str] = set()
        for yes, no in zip(asked[::2], asked[1::2]):
            used.add(yes.object)
            if setting == "popular":
                ranking = first_seen_ranking(chosen, lambda name: images_with[name])
            else:
                # ties: first co-occurrence with the positive (POPE's insertion order)
                with_it = [names for names in chosen if yes.object in names]
                together = Counter(other for names in with_it for other in names)
                ranking = [
                    name
                    for name in first_seen_ranking(with_it, together.__getitem__)
                    if name != yes.object
                ]
            want = expected_ranked_negative(ranking, present, used)
            if want is None:
                fallbacks += 1
            else:
                assert no.object == want, (image_id, yes.object, setting)
            used.add(no.object)
    return fallbacks


# ----------------------------------------------------------------------------- the template


def test_question_text_uses_an_before_vowels_as_the_released_files_do():
    assert pope_question_text("dog") == "Is there a dog in the image?"
    assert pope_question_text("dining table") == "Is there a dining table in the image?"
    assert pope_question_text("apple") == "Is there an apple in the image?"
    assert pope_question_text("umbrella") == "Is there an umbrella in the image?"
    assert pope_question_text("oven") == "Is there an oven in the image?"


# ----------------------------------------------------------------------------- loading


RELEASED_LINES = [
    {
        "question_id": 0,
        "image": "COCO_val2014_000000548882.jpg",
        "image_id": 548882,
        "text": "Is there a dining table in the image?",
        "label": "yes",
    },
    {
        "question_id": 1,
        "image": "COCO_val2014_000000548882.jpg",
        "image_id": 548882,
        "text": "Is there an orange in the image?",
        "label": "no",
    },
    # the older files have no image_id field
    {
        "question_id": 2,
        "image": "COCO_val2014_000000310196.jpg",
        "text": "Is there a snowboard in the image?",
        "label": "yes",
    },
]


def write_lines(path: Path, lines) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def test_load_reads_the_released_format(tmp_path):
    path = write_lines(tmp_path / "coco_pope_adversarial.json", RELEASED_LINES)
    questions = load_pope_questions(path)
    assert [(q.question_id, q.image_id, q.label, q.object) for q in questions] == [
        (0, 548882, "yes", "dining table"),
        (1, 548882, "no", "orange"),
        (2, 310196, "yes", "snowboard"),
    ]
    assert {q.setting for q in questions} == {"adversarial"}
    assert questions[1].text == "Is there an orange in the image?"
    assert [q.to_pope() for q in questions[:2]] == RELEASED_LINES[:2]


def test_load_names_the_file_and_line_of_a_bad_record(tmp_path):
    bad_label = [*RELEASED_LINES[:1], {**RELEASED_LINES[1], "label": "maybe"}]
    path = write_lines(tmp_path / "questions.json", bad_label)
    with pytest.raises(InputFileError, match=r"questions\.json, line 2: label must be"):
        load_pope_questions(path)
    mismatch = [{**RELEASED_LINES[0], "image_id": 1}]
    with pytest.raises(InputFileError, match="does not match the file name"):
        load_pope_questions(write_lines(tmp_path / "mismatch.json", mismatch))
    repeated = [RELEASED_LINES[0], RELEASED_LINES[0]]
    with pytest.raises(InputFileError, match="line 2: question_id 0 is repeated"):
        load_pope_questions(write_lines(tmp_path / "repeated.json", repeated))
    no_text = [{k: v for k, v in RELEASED_LINES[0].items() if k != "text"}]
    with pytest.raises(InputFileError, match="field 'text' must be a str"):
        load_pope_questions(write_lines(tmp_path / "no_text.json", no_text))


def test_load_of_an_unknown_setting_and_template(tmp_path):
    other = [{**RELEASED_LINES[2], "text": "Do you see a snowboard?"}]
    (question,) = load_pope_questions(write_lines(tmp_path / "mine.json", other))
    assert question.setting is None and question.object is None


def test_checksum(tmp_path, monkeypatch):
    path = write_lines(tmp_path / "coco_pope_random.json", RELEASED_LINES)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    verify_checksum(path, digest)
    verify_checksum(path, digest.upper())
    with pytest.raises(ChecksumError) as error:
        verify_checksum(path, "0" * 64)
    message = str(error.value)
    assert "\n" not in message and str(path) in message and digest in message
    with pytest.raises(ValueError, match="64 hex digits"):
        verify_checksum(path, "abc")
    with pytest.raises(ChecksumError):
        load_pope_questions(path, expected_sha256="1" * 64)
    assert len(load_pope_questions(path, expected_sha256=digest)) == 3
    # a known file name is checked on every load
    monkeypatch.setitem(POPE_SHA256, path.name, "2" * 64)
    with pytest.raises(ChecksumError, match=r"coco_pope_random\.json"):
        load_pope_questions(path)


# The first image of the released coco_pope_random.json as it is there: the three present
# objects asked first, then the three absent ones (the builder alternates; both are accepted).
RELEASED_FIRST_IMAGE = [
    ("dining table", "yes"), ("sandwich", "yes"), ("bottle", "yes"),
    ("tv", "no"), ("orange", "no"), ("zebra", "no"),
]  # fmt: skip


def released_like(seed: int = 0) -> dict[str, list]:
    """Three settings in the released shape, rebuilt over 500 hand-made images."""
    rng = random.Random(seed)
    names = [f"thing {k}" for k in range(40)]
    objects = {100 + i: rng.sample(names, rng.randint(3, 6)) for i in range(520)}
    return {s: build_pope(objects, setting=s, num_images=500, seed=seed) for s in POPE_SETTINGS}


def test_the_released_shape_is_recognised():
    sets = released_like()
    assert released_set_problems(sets) == []
    first = sets["random"][0].image_id
    grouped = [
        replace(q, object=name, text=pope_question_text(name), label=label)
        for q, (name, label) in zip(sets["random"][:6], RELEASED_FIRST_IMAGE)
    ]
    assert {q.image_id for q in grouped} == {first}
    assert released_set_problems({**sets, "random": grouped + sets["random"][6:]}) == []


def test_what_is_not_the_released_shape_is_named():
    sets = released_like()
    truncated = {**sets, "popular": sets["popular"][:-4]}
    cut = sets["popular"][-1].image_id
    assert released_set_problems(truncated) == [
        "popular: 2,996 questions over 500 images (released: 3,000 over 500)",
        f"popular: 1 images without 3 yes + 3 no (e.g. {cut})",
    ]
    other_images = {**sets, "adversarial": released_like(seed=1)["adversarial"]}
    assert released_set_problems(other_images) == [
        "the settings ask about different images (released: the same 500)"
    ]
    reworded = [replace(sets["random"][0], text="Do you see it?"), *sets["random"][1:]]
    reworded = [replace(q, object=None) if q.text == "Do you see it?" else q for q in reworded]
    assert released_set_problems({**sets, "random": reworded}) == [
        "random: 1 questions outside POPE's template"
    ]
    assert released_set_problems({"random": sets["random"]}) == [
        "popular: missing",
        "adversarial: missing",
    ]


# ----------------------------------------------------------------------------- the rebuild


def test_hand_made_map_popular():
    questions = build_pope(HAND, setting="popular", num_images=None)
    check_invariants(questions, HAND)
    assert sorted(by_image(questions)) == [1, 2, 3, 4]  # image 5 has too few objects
    # person in 3 images; dog, car, bus in 2 (first seen in that order); the rest in 1
    negatives = {
        i: [q.object for q in qs if q.label == "no"] for i, qs in by_image(questions).items()
    }
    assert negatives == {
        1: ["car", "bus", "traffic light"],
        2: ["dog", "frisbee", "cat"],
        3: ["dog", "frisbee", "traffic light"],
        4: ["person", "car", "bus"],
    }
    assert check_ranked_negatives(questions, HAND, "popular") == 0


def test_hand_made_map_adversarial_with_random_fallback():
    universe = {"dog", "person", "frisbee", "car", "bus", "traffic light", "cat", "couch"}
    questions = build_pope(HAND, setting="adversarial", num_images=None, seed=3)
    check_invariants(questions, HAND)
    pairs = {
        i: [(y.object, n.object) for y, n in zip(qs[::2], qs[1::2])]
        for i, qs in by_image(questions).items()
    }
    # ranked picks, worked out by hand from the co-occurrence counts over images 1-4
    assert pairs[1][:2] == [("dog", "cat"), ("person", "car")]
    assert pairs[2][0] == ("person", "dog")
    assert pairs[3][:2] == [("car", "traffic light"), ("person", "dog")]
    assert pairs[4][0] == ("dog", "person")
    # frisbee co-occurs only with dog and person, both in image 1: a random absent one
    assert pairs[1][2][1] in {"bus", "traffic light", "couch"}
    assert pairs[2][1][1] in {"frisbee", "cat", "couch"}
    assert pairs[4][1][1] in universe - {"dog", "cat", "couch", "person"}
    assert check_ranked_negatives(questions, HAND, "adversarial") == 6


def test_popular_falls_back_to_random_when_the_ranking_is_exhausted():
    objects = {7: ["dog", "cat", "bird"]}
    extra = ["car", "bus", "cup", "clock"]
    questions = build_pope(objects, setting="popular", num_images=1, extra_categories=extra)
    check_invariants(questions, objects)
    negatives = [q.object for q in questions if q.label == "no"]
    assert set(negatives) <= set(extra)
    with pytest.raises(ValueError, match="image 7: no absent category left"):
        build_pope(objects, setting="random", num_images=1, extra_categories=extra[:2])


def test_random_negatives_and_determinism():
    first = build_pope(HAND, setting="random", num_images=3, seed=11)
    check_invariants(first, HAND)
    assert build_pope(HAND, setting="random", num_images=3, seed=11) == first
    # the same seed picks the same images in every setting
    images = {
        s: sorted(by_image(build_pope(HAND, setting=s, num_images=3, seed=11)))
        for s in POPE_SETTINGS
    }
    assert images["random"] == images["popular"] == images["adversarial"]
    draws = {
        tuple(q.object for q in build_pope(HAND, setting="random", num_images=None, seed=s))
        for s in range(8)
    }
    assert len(draws) > 1  # the seed does move the random negatives


def test_builder_arguments():
    with pytest.raises(ValueError, match="setting must be one of"):
        build_pope(HAND, setting="rare")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"num_images must be in 1\.\.4"):
        build_pope(HAND, setting="random", num_images=5)
    with pytest.raises(ValueError, match="positives_per_image"):
        build_pope(HAND, setting="random", positives_per_image=0)
    two = build_pope(HAND, setting="random", num_images=None, positives_per_image=2)
    check_invariants(two, HAND, positives=2)
    assert len(by_image(two)) == 5  # image 5 is eligible with two positives


def test_roundtrip_through_the_released_format(tmp_path):
    built = build_pope(HAND, setting="popular", num_images=None)
    path = write_lines(tmp_path / "coco_pope_popular.json", [q.to_pope() for q in built])
    assert load_pope_questions(path) == built


@pytest.fixture(scope="module")
def world_objects(tmp_path_factory):
    root = tmp_path_factory.mktemp("pope-world")
    world = build_synthetic_coco(root, num_train=4, num_test=150, write_images=False)
    objects = coco_objects_by_image(root / "instances_val2014.json")
    # the instances file keeps the drawing order of each image's objects
    assert objects == {im.image_id: [o.category for o in im.objects] for im in world.test}
    return objects


@pytest.mark.parametrize("setting", POPE_SETTINGS)
def test_synthetic_world(world_objects, setting):
    eligible = sum(len(set(names)) >= 3 for names in world_objects.values())
    assert eligible >= 30
    questions = build_pope(world_objects, setting=setting, num_images=30, seed=5)
    assert len(questions) == 30 * 6
    check_invariants(questions, world_objects)
    assert all(q.setting == setting for q in questions)
    if setting != "random":
        fallbacks = check_ranked_negatives(questions, world_objects, setting)
        # 8 categories: a ranked pick always exists for popular, mostly for adversarial
        assert fallbacks == 0 if setting == "popular" else fallbacks < 45
    again = build_pope(world_objects, setting=setting, num_images=30, seed=5)
    assert again == questions


def test_synthetic_world_settings_differ(world_objects):
    built = {
        s: [q.object for q in build_pope(world_objects, setting=s, num_images=30, seed=5)]
        for s in POPE_SETTINGS
    }
    assert built["random"] != built["popular"] != built["adversarial"]


# ----------------------------------------------------------------------------- answers


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("Yes, there is a dog.", "yes"),
        ("No.", "no"),
        ("No", "no"),
        ("no", "no"),
        ("There is not a cat in the image.", "no"),
        ("yes", "yes"),
        ("The answer is no, there is no dog.", "no"),
        ("", "yes"),
        ("Yes. There is no cat though.", "yes"),  # only the first sentence counts
        ("Yes, no doubt.", "no"),  # POPE's rule, not English
        ("Nothing suggests a dog.", "yes"),  # a word, not a substring
        ("NO", "no"),  # lowercased (POPE's own script would say yes)
        ("Not at all.", "no"),
        ("no\nthere is none", "no"),
    ],
)
def test_parse_answer(text, answer):
    assert parse_answer(text) == answer


def pope_original(text: str) -> str:
    """POPE's evaluate.py rule, verbatim."""
    if text.find(".") != -1:
        text = text.split(".")[0]
    text = text.replace(",", "")
    words = text.split(" ")
    return "no" if "No" in words or "not" in words or "no" in words else "yes"


TOKENS = ["yes", "no", "not", "there", "is", "a", "dog", "cat", "nothing", "nope", "No"]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from(TOKENS), st.sampled_from([" ", ", ", ". "]))))
def test_parse_answer_matches_popes_script_on_its_own_spelling(parts):
    text = "".join(token + sep for token, sep in parts).strip()
    assert parse_answer(text) == pope_original(text)


# ----------------------------------------------------------------------------- metrics


def test_metrics_by_hand():
    labels = ["yes", "yes", "yes", "no", "no", "no", "no", "yes"]
    preds = ["yes", "no", "yes", "yes", "no", "no", "yes", "yes"]
    m = pope_metrics(labels, preds)
    assert (m.tp, m.fn, m.fp, m.tn, m.n) == (3, 1, 2, 2, 8)
    assert m.accuracy == 5 / 8
    assert m.precision == 3 / 5
    assert m.recall == 3 / 4
    assert m.f1 == pytest.approx(2 / 3)
    assert m.yes_ratio == 5 / 8
    assert m.as_dict()["f1"] == m.f1


def test_metrics_edge_cases():
    none_said = pope_metrics(["yes", "no"], ["no", "no"])
    assert (none_said.precision, none_said.recall, none_said.f1) == (0.0, 0.0, 0.0)
    assert none_said.accuracy == 0.5 and none_said.yes_ratio == 0.0
    no_positives = pope_metrics(["no", "no"], ["yes", "no"])
    assert (no_positives.recall, no_positives.f1) == (0.0, 0.0)
    perfect = pope_metrics(["yes", "no"], ["yes", "no"])
    assert (perfect.accuracy, perfect.precision, perfect.recall, perfect.f1) == (1, 1, 1, 1)
    with pytest.raises(ValueError, match="empty"):
        pope_metrics([], [])
    with pytest.raises(ValueError, match="2 labels but 1 predictions"):
        pope_metrics(["yes", "no"], ["yes"])
    with pytest.raises(ValueError, match=r"predictions\[1\] must be 'yes' or 'no'"):
        pope_metrics(["yes", "no"], ["yes", "No"])


def count_by_loop(labels, preds):
    """POPE's evaluate.py counting loop."""
    tp = tn = fp = fn = 0
    for pred, label in zip(preds, labels):
        if pred == "yes" and label == "yes":
            tp += 1
        elif pred == "yes" and label == "no":
            fp += 1
        elif pred == "no" and label == "no":
            tn += 1
        else:
            fn += 1
    return tp, fp, tn, fn


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.lists(st.tuples(st.sampled_from(["yes", "no"]), st.sampled_from(["yes", "no"])), min_size=1)
)
def test_metrics_match_popes_counting(pairs):
    labels, preds = [p[0] for p in pairs], [p[1] for p in pairs]
    m = pope_metrics(labels, preds)
    tp, fp, tn, fn = count_by_loop(labels, preds)
    assert (m.tp, m.fp, m.tn, m.fn) == (tp, fp, tn, fn)
    assert m.accuracy == (tp + tn) / len(pairs)
    assert m.yes_ratio == preds.count("yes") / len(preds)
    if tp + fp and tp + fn and tp:
        precision, recall = tp / (tp + fp), tp / (tp + fn)
        assert m.f1 == pytest.approx(2 * precision * recall / (precision + recall))
