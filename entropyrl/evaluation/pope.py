"""POPE: polling-based object probing (Li et al. 2023, "Evaluating Object Hallucination in Large
Vision-Language Models"; code and files: RUCAIBox/POPE, first published as AoiDragon/POPE).

A model is asked `Is there a {object} in the image?` about objects that are in the image (label
"yes") and objects that are not ("no"); the three settings differ only in how the absent objects
are chosen: at random, the most frequent objects, or the objects that co-occur most with the one
asked about. The released question files are the benchmark: :func:`load_pope_questions` reads
them. :func:`build_pope` is a rebuild of POPE's procedure from COCO-style annotations, for when the
files are not at hand and for the synthetic world of the tests; on real COCO it does not
reproduce the released files (other image sample, other annotation source).

Answers are parsed as POPE's own evaluation script does (:func:`parse_answer`), and
:func:`pope_metrics` gives its accuracy, precision, recall, F1 and yes-ratio.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from entropyrl.data.io import InputFileError, read_json, read_records

__all__ = [
    "POPE_METRICS",
    "POPE_SETTINGS",
    "POPE_SHA256",
    "POPE_TEMPLATE",
    "ChecksumError",
    "PopeMetrics",
    "PopeQuestion",
    "build_pope",
    "coco_objects_by_image",
    "file_sha256",
    "load_pope_questions",
    "parse_answer",
    "pope_counts",
    "pope_metrics",
    "pope_question_text",
    "pope_statistic",
    "released_set_problems",
    "verify_checksum",
]

Label = Literal["yes", "no"]
Setting = Literal["random", "popular", "adversarial"]
POPE_SETTINGS: tuple[str, ...] = ("random", "popular", "adversarial")
POPE_TEMPLATE = "Is there a {} in the image?"

# sha256 of the released question files, by file name (`coco_pope_random.json`, ...). Filled from
# the released files themselves once they are at hand; empty until then, so nothing is checked
# by default. A value here is verified by `load_pope_questions` on every load of that file.
POPE_SHA256: dict[str, str] = {}

# The released COCO files' shape (Li et al. 2023, section 4.1): per setting 3,000 questions over
# the same 500 val2014 images, each image asked about 3 present and 3 absent objects.
RELEASED_IMAGES = 500
RELEASED_PER_IMAGE = 6

_QUESTION = re.compile(r"^Is there an? (?P<object>.+) in the image\?$")
_IMAGE_ID = re.compile(r"(\d+)\.[A-Za-z]+$")
_SETTING_IN_NAME = re.compile(r"_pope_(random|popular|adversarial)\b")
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")


class ChecksumError(ValueError):
    """A file's sha256 is not the expected one; the message names the file."""


@dataclass(frozen=True)
class PopeQuestion:
    """One POPE question. `object` and `setting` are None where a loaded file does not tell."""

    question_id: int
    image_id: int
    text: str
    label: Label
    object: str | None
    setting: str | None
    image: str

    def to_pope(self) -> dict[str, Any]:
        """The released files' line: `{"question_id", "image", "image_id", "text", "label"}`."""
        return {
            "question_id": self.question_id,
            "image": self.image,
            "image_id": self.image_id,
            "text": self.text,
            "label": self.label,
        }


def pope_question_text(name: str) -> str:
    """POPE's question: "an" before a vowel-initial name (as the released files have it)."""
    text = POPE_TEMPLATE.format(name)
    return text.replace(" a ", " an ", 1) if name[:1].lower() in "aeiou" else text


# ---------------------------------------------------------------------------------------------
# The released files
# ---------------------------------------------------------------------------------------------


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in blocks (the question files are ~0.4 MB, images more)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_checksum(path: str | os.PathLike[str], expected_sha256: str) -> None:
    """Raise ChecksumError (one line, naming the file) unless `path` has this sha256."""
    if not _SHA256.match(expected_sha256):
        raise ValueError(f"expected_sha256 must be 64 hex digits, got {expected_sha256!r}")
    if not Path(path).is_file():
        raise InputFileError(f"{path}: file not found")
    actual = file_sha256(path)
    if actual != expected_sha256.lower():
        raise ChecksumError(
            f"{path}: sha256 {actual} does not match the expected {expected_sha256.lower()}"
        )


def _image_id(record: Mapping[str, Any], where: str) -> int:
    """The id in the file name (`COCO_val2014_000000310196.jpg` -> 310196), checked against an
    `image_id` field where the line has one (the released files do)."""
    match = _IMAGE_ID.search(record["image"])
    parsed = int(match.group(1)) if match else None
    given = record.get("image_id")
    if given is not None and (not isinstance(given, int) or isinstance(given, bool)):
        raise InputFileError(f"{where}: field 'image_id' must be an integer")
    if parsed is not None and given is not None and parsed != given:
        raise InputFileError(
            f"{where}: image_id {given} does not match the file name {record['image']!r}"
        )
    if parsed is None and given is None:
        raise InputFileError(f"{where}: no image id in the file name {record['image']!r}")
    return parsed if parsed is not None else given


def load_pope_questions(
    path: str | os.PathLike[str], *, expected_sha256: str | None = None
) -> list[PopeQuestion]:
    """Questions of a POPE file (JSON lines `{"question_id", "image", "text", "label"}`).

    The checksum is verified when given, else when `POPE_SHA256` knows the file name. The
    setting comes from a `..._pope_{setting}.json` name (else None), the object from the text
    (None for a text not in POPE's template). Errors name the file and line.
    """
    path = Path(path)
    expected = expected_sha256 or POPE_SHA256.get(path.name)
    if expected is not None:
        verify_checksum(path, expected)
    setting_match = _SETTING_IN_NAME.search(path.name)
    setting = setting_match.group(1) if setting_match else None
    questions: list[PopeQuestion] = []
    seen: set[int] = set()
    for line, record in read_records(path):
        where = f"{path}, line {line}"
        if not isinstance(record, Mapping):
            raise InputFileError(f"{where}: not a JSON object")
        for key, kind in (("question_id", int), ("image", str), ("text", str), ("label", str)):
            value = record.get(key)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise InputFileError(f"{where}: field {key!r} must be a {kind.__name__}")
        if record["label"] not in ("yes", "no"):
            raise InputFileError(f"{where}: label must be 'yes' or 'no', got {record['label']!r}")
        if record["question_id"] in seen:
            raise InputFileError(f"{where}: question_id {record['question_id']} is repeated")
        seen.add(record["question_id"])
        match = _QUESTION.match(record["text"].strip())
        questions.append(
            PopeQuestion(
                question_id=record["question_id"],
                image_id=_image_id(record, where),
                text=record["text"],
                label=record["label"],
                object=match.group("object") if match else None,
                setting=setting,
                image=record["image"],
            )
        )
    if not questions:
        raise InputFileError(f"{path}: no questions")
    return questions


def released_set_problems(questions: Mapping[str, Sequence[PopeQuestion]]) -> list[str]:
    """How `{setting: questions}` differs from the released COCO files' shape; [] when it has it.

    The released files hold, per setting, 3,000 questions over the same 500 images, 3 "yes" and
    3 "no" per image, every text in POPE's template. A truncated download, a file of another
    benchmark or a hand-made subset shows here; the order of questions is not checked (the
    released files ask the 3 present objects first, the newer code alternates).
    """
    problems: list[str] = []
    image_sets: dict[str, frozenset[int]] = {}
    for setting in POPE_SETTINGS:
        asked = questions.get(setting)
        if not asked:
            problems.append(f"{setting}: missing")
            continue
        per_image: dict[int, list[str]] = {}
        for question in asked:
            per_image.setdefault(question.image_id, []).append(question.label)
        image_sets[setting] = frozenset(per_image)
        want = RELEASED_IMAGES * RELEASED_PER_IMAGE
        if len(asked) != want or len(per_image) != RELEASED_IMAGES:
            problems.append(
                f"{setting}: {len(asked):,} questions over {len(per_image)} images "
                f"(released: {want:,} over {RELEASED_IMAGES})"
            )
        half = RELEASED_PER_IMAGE // 2
        unbalanced = [
            image_id
            for image_id, labels in per_image.items()
            if sorted(labels) != ["no"] * half + ["yes"] * half
        ]
        if unbalanced:
            problems.append(
                f"{setting}: {len(unbalanced)} images without {half} yes + {half} no "
                f"(e.g. {unbalanced[0]})"
            )
        off_template = sum(question.object is None for question in asked)
        if off_template:
            problems.append(f"{setting}: {off_template} questions outside POPE's template")
    if len(set(image_sets.values())) > 1:
        problems.append("the settings ask about different images (released: the same 500)")
    return problems


# ---------------------------------------------------------------------------------------------
# The rebuild from annotations
# ---------------------------------------------------------------------------------------------


def coco_objects_by_image(
    instances: Mapping[str, Any] | str | os.PathLike[str],
) -> dict[int, list[str]]:
    """`{image_id: [category name, ...]}` from a COCO instances file (or its loaded JSON).

    Names are in annotation order, each once (first occurrence kept); every annotation counts,
    crowd ones too. Images without annotations map to an empty list.
    """
    data = instances if isinstance(instances, Mapping) else read_json(instances)
    names = {category["id"]: category["name"] for category in data["categories"]}
    objects: dict[int, list[str]] = {image["id"]: [] for image in data.get("images", [])}
    for annotation in data["annotations"]:
        found = objects.setdefault(annotation["image_id"], [])
        name = names[annotation["category_id"]]
        if name not in found:
            found.append(name)
    return objects


def _distinct(names: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(names))


def _ranked(counts: dict[str, int]) -> list[str]:
    """Names by count, highest first; ties keep first-seen order (POPE's stable sort)."""
    return sorted(counts, key=lambda name: -counts[name])


def _popularity(images: Sequence[list[str]]) -> list[str]:
    counts: dict[str, int] = {}
    for objects in images:
        for name in objects:
            counts[name] = counts.get(name, 0) + 1
    return _ranked(counts)


def _co_occurrence(images: Sequence[list[str]]) -> dict[str, list[str]]:
    counts: dict[str, dict[str, int]] = {}
    for objects in images:
        for name in objects:
            row = counts.setdefault(name, {})
            for other in objects:
                if other != name:
                    row[other] = row.get(other, 0) + 1
    return {name: _ranked(row) for name, row in counts.items()}


def build_pope(
    objects_by_image: Mapping[int, Sequence[str]],
    *,
    setting: Setting,
    num_images: int | None = 500,
    seed: int = 0,
    positives_per_image: int = 3,
    extra_categories: Sequence[str] = (),
    image_name: str = "COCO_val2014_{image_id:012d}.jpg",
) -> list[PopeQuestion]:
    """Rebuild POPE questions from per-image objects (a rebuild, not the released files).

    Images with at least `positives_per_image` distinct objects are eligible; `num_images` of
    them (None: all) are drawn with `random.Random(seed)` from the sorted ids, and asked about in
    id order. Per image, each of its first `positives_per_image` objects is a "yes" question
    followed by one "no" question about an object absent from the image and not asked about yet:
    - random: uniform over the absent categories;
    - popular: the first absent one by the number of chosen images containing it;
    - adversarial: the first absent one by co-occurrence with that positive (counted over the
      chosen images);
    ties keep the order of first appearance (popular: in the chosen images; adversarial: next to
    that positive), images in id order and objects in annotation order, as POPE's stable sort of
    its insertion-ordered counts does. Popular and adversarial fall back to random when no
    ranked category is left. Categories are those of the chosen images plus `extra_categories`.
    The same seed gives the same images in every setting. Question ids count from 0, as in the
    released files.
    """
    if setting not in POPE_SETTINGS:
        raise ValueError(f"setting must be one of {POPE_SETTINGS}, got {setting!r}")
    if positives_per_image < 1:
        raise ValueError(f"positives_per_image must be >= 1, got {positives_per_image}")
    objects = {int(image_id): _distinct(names) for image_id, names in objects_by_image.items()}
    eligible = sorted(i for i, names in objects.items() if len(names) >= positives_per_image)
    count = len(eligible) if num_images is None else num_images
    if count < 1 or count > len(eligible):
        raise ValueError(
            f"num_images must be in 1..{len(eligible)} (images with at least "
            f"{positives_per_image} distinct objects), got {num_images}"
        )
    rng = random.Random(seed)
    chosen = sorted(rng.sample(eligible, count))
    chosen_objects = [objects[i] for i in chosen]
    universe = _distinct([name for names in chosen_objects for name in names])
    universe = _distinct([*universe, *extra_categories])
    popular = _popularity(chosen_objects)
    co_occurring = _co_occurrence(chosen_objects)

    questions: list[PopeQuestion] = []

    def ask(image_id: int, name: str, label: Label) -> None:
        questions.append(
            PopeQuestion(
                question_id=len(questions),
                image_id=image_id,
                text=pope_question_text(name),
                label=label,
                object=name,
                setting=setting,
                image=image_name.format(image_id=image_id),
            )
        )

    for image_id, names in zip(chosen, chosen_objects):
        present = set(names)
        used: set[str] = set()
        for positive in names[:positives_per_image]:
            ask(image_id, positive, "yes")
            used.add(positive)
            if setting == "popular":
                ranked = popular
            elif setting == "adversarial":
                ranked = co_occurring.get(positive, [])
            else:
                ranked = []
            negative = next((c for c in ranked if c not in present and c not in used), None)
            if negative is None:
                left = [c for c in universe if c not in present and c not in used]
                if not left:
                    raise ValueError(
                        f"image {image_id}: no absent category left for a negative question "
                        f"({len(universe)} categories; add some with extra_categories)"
                    )
                negative = rng.choice(left)
            ask(image_id, negative, "no")
            used.add(negative)
    return questions


# ---------------------------------------------------------------------------------------------
# Answers and metrics
# ---------------------------------------------------------------------------------------------


def parse_answer(text: str) -> Label:
    """POPE's rule: "no" when the first sentence has the word "no" or "not", else "yes".

    As POPE's evaluate.py: text before the first ".", commas dropped, then split into words; an
    empty or evasive answer counts as "yes". Unlike it, words are lowercased and split on any
    whitespace, so "NO", "Not ..." and "no\\n" read as no (POPE matches "No", "no", "not" only,
    between single spaces).
    """
    words = text.split(".", 1)[0].replace(",", "").lower().split()
    return "no" if "no" in words or "not" in words else "yes"


@dataclass(frozen=True)
class PopeMetrics:
    """POPE's metrics with "yes" as the positive class, and the confusion counts."""

    accuracy: float
    precision: float
    recall: float
    f1: float
    yes_ratio: float
    n: int
    tp: int
    fp: int
    tn: int
    fn: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def _yes_mask(values: Sequence[str], name: str) -> np.ndarray:
    array = np.asarray(values, dtype=object)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a flat sequence of 'yes'/'no'")
    yes, no = array == "yes", array == "no"
    bad = ~(yes | no)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name}[{first}] must be 'yes' or 'no', got {array[first]!r}")
    return yes


def pope_metrics(labels: Sequence[str], predictions: Sequence[str]) -> PopeMetrics:
    """Accuracy, precision, recall, F1 (positive = "yes") and the share of "yes" predictions.

    Both sequences hold "yes"/"no" (parse free text with :func:`parse_answer` first). A ratio
    over nothing is 0.0: precision with no "yes" prediction, recall with no "yes" label, F1 when
    precision + recall is 0 (POPE's script divides by zero there). Empty input: ValueError.
    """
    if len(labels) != len(predictions):
        raise ValueError(f"{len(labels)} labels but {len(predictions)} predictions")
    if len(labels) == 0:
        raise ValueError("no labels: POPE metrics of an empty set are undefined")
    truth, said = _yes_mask(labels, "labels"), _yes_mask(predictions, "predictions")
    tp = int(np.sum(truth & said))
    fp = int(np.sum(~truth & said))
    tn = int(np.sum(~truth & ~said))
    fn = int(np.sum(truth & ~said))
    n = tp + fp + tn + fn
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return PopeMetrics(
        accuracy=(tp + tn) / n,
        precision=precision,
        recall=recall,
        f1=f1,
        yes_ratio=(tp + fp) / n,
        n=n,
        tp=tp,
        fp=fp,
        tn=tn,
        fn=fn,
    )


POPE_METRICS: tuple[str, ...] = ("accuracy", "precision", "recall", "f1", "yes_ratio")


def pope_counts(
    image_ids: Sequence[int], labels: Sequence[str], predictions: Sequence[str]
) -> dict[int, list[float]]:
    """`{image_id: [tp, fp, tn, fn]}`: the confusion counts of each image's questions, the
    per-image values the bootstrap resamples (an image's questions are not independent)."""
    if not len(image_ids) == len(labels) == len(predictions):
        raise ValueError(
            f"{len(image_ids)} image ids, {len(labels)} labels, {len(predictions)} predictions"
        )
    truth, said = _yes_mask(labels, "labels"), _yes_mask(predictions, "predictions")
    counts: dict[int, list[float]] = {}
    for image_id, is_yes, says_yes in zip(image_ids, truth, said):
        row = counts.setdefault(int(image_id), [0.0, 0.0, 0.0, 0.0])
        row[(0 if says_yes else 3) if is_yes else (1 if says_yes else 2)] += 1.0
    return counts


def _share(part: np.ndarray, whole: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(whole > 0, part / np.where(whole > 0, whole, 1.0), 0.0)


def pope_statistic(name: str) -> Any:
    """The statistic `[B, n, 4] -> [B]` of one of `POPE_METRICS` over per-image
    `[tp, fp, tn, fn]`, with `pope_metrics`' convention (a ratio over nothing is 0.0)."""
    if name not in POPE_METRICS:
        raise ValueError(f"unknown POPE metric {name!r}; one of {POPE_METRICS}")

    def statistic(values: np.ndarray) -> np.ndarray:
        if values.ndim != 3 or values.shape[2] != 4:
            raise ValueError(f"POPE statistics take [B, n, 4] counts, got {values.shape}")
        tp, fp, tn, fn = np.moveaxis(values.sum(axis=1), -1, 0)
        total = tp + fp + tn + fn
        precision, recall = _share(tp, tp + fp), _share(tp, tp + fn)
        return {
            "accuracy": lambda: _share(tp + tn, total),
            "precision": lambda: precision,
            "recall": lambda: recall,
            "f1": lambda: _share(2 * precision * recall, precision + recall),
            "yes_ratio": lambda: _share(tp + fp, total),
        }[name]()

    statistic.__name__ = f"pope_{name}"
    return statistic
