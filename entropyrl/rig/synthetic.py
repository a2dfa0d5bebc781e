"""A synthetic COCO world: Pillow images of a few COCO objects, COCO-format annotation files.

Each image shows 1-3 objects of distinct real COCO categories; every category is drawn as a fixed
shape in a fixed colour, so a small model can ground names in pixels. The world is written as
COCO 2014 files (`instances_{train,val}2014.json`, `captions_{train,val}2014.json`, the images in
`train2014/` and `val2014/`), so the CHAIR service loads it exactly as it loads real COCO.

References (5 per image, one per template) name exactly the drawn objects. Hallucination has to
come from somewhere for RL to remove it: as noisy captions and co-occurrence priors do in real
COCO, each *warm-up* caption names, with probability `noise_rate`, the fixed "partner" category
(`PARTNERS`) of an object in the image when that partner is not drawn. References and the CHAIR
ground truth stay clean. Everything is a deterministic function of the seed.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CATEGORIES",
    "PARTNERS",
    "TEMPLATES",
    "SyntheticImage",
    "SyntheticObject",
    "SyntheticWorld",
    "build_synthetic_coco",
    "caption_for",
    "render_image",
]

# (COCO 2014 category id, name, supercategory, RGB colour, shape); ids and names are COCO's.
CATEGORIES: tuple[tuple[int, str, str, tuple[int, int, int], str], ...] = (
    (3, "car", "vehicle", (30, 80, 220), "wide_rectangle"),
    (16, "bird", "animal", (235, 200, 20), "triangle"),
    (17, "cat", "animal", (150, 40, 190), "circle"),
    (18, "dog", "animal", (120, 70, 20), "square"),
    (19, "horse", "animal", (20, 130, 50), "diamond"),
    (28, "umbrella", "accessory", (220, 30, 30), "half_disc"),
    (47, "cup", "kitchen", (20, 200, 200), "trapezoid"),
    (85, "clock", "indoor", (20, 20, 20), "ring"),
)

# A fixed co-occurrence prior: the noisy warm-up captions name an object's partner.
PARTNERS: dict[str, str] = {
    "dog": "cat",
    "cat": "dog",
    "car": "umbrella",
    "umbrella": "car",
    "bird": "horse",
    "horse": "bird",
    "cup": "clock",
    "clock": "cup",
}

TEMPLATES: tuple[str, ...] = (
    "{objects}.",
    "a picture of {objects}.",
    "there is {objects} in the image.",
    "an image with {objects}.",
    "{objects} on a plain background.",
)

_ORDER = {name: index for index, (_, name, _, _, _) in enumerate(CATEGORIES)}
_STYLE = {name: (colour, shape) for _, name, _, colour, shape in CATEGORIES}
_IDS = {name: cid for cid, name, _, _, _ in CATEGORIES}


@dataclass(frozen=True)
class SyntheticObject:
    """One drawn object: its category name and its box `(x, y, w, h)` in pixels (COCO bbox)."""

    category: str
    bbox: tuple[int, int, int, int]


@dataclass(frozen=True)
class SyntheticImage:
    """One image of the world: id, split (`train` / `test`), file name, objects, background."""

    image_id: int
    split: str
    file_name: str
    objects: tuple[SyntheticObject, ...]
    background: tuple[int, int, int]

    @property
    def categories(self) -> tuple[str, ...]:
        """Drawn categories in the canonical (caption) order."""
        return tuple(sorted({o.category for o in self.objects}, key=_ORDER.__getitem__))


@dataclass
class SyntheticWorld:
    """The generated world. `root` holds the COCO-format files the CHAIR service reads."""

    root: Path
    image_size: int
    noise_rate: float
    seed: int
    train: list[SyntheticImage]
    test: list[SyntheticImage]
    references: dict[int, list[str]]
    warmup_captions: dict[int, list[str]]
    _cache: dict[int, Any] = field(default_factory=dict, repr=False)

    def by_id(self, image_id: int) -> SyntheticImage:
        for image in (*self.train, *self.test):
            if image.image_id == image_id:
                return image
        raise KeyError(f"image_id {image_id} is not in this world")

    def image(self, image_id: int) -> Any:
        """The PIL image (rendered once, then kept in memory)."""
        if image_id not in self._cache:
            self._cache[image_id] = render_image(self.by_id(image_id), self.image_size)
        return self._cache[image_id]

    def train_references(self) -> dict[int, list[str]]:
        """References of the training images: the corpus for CIDEr-D document frequencies."""
        return {image.image_id: self.references[image.image_id] for image in self.train}

    def noisy_fraction(self) -> float:
        """Fraction of warm-up captions that name an object not drawn (the taught prior)."""
        total = noisy = 0
        for image in self.train:
            drawn = set(image.categories)
            for caption in self.warmup_captions[image.image_id]:
                total += 1
                words = set(re.findall(r"[a-z]+", caption))
                noisy += any(name not in drawn and name in words for name in _ORDER)
        return noisy / total if total else 0.0


def _with_article(name: str) -> str:
    return ("an " if name[0] in "aeiou" else "a ") + name


def _object_phrase(names: Sequence[str]) -> str:
    parts = [_with_article(n) for n in names]
    if len(parts) == 1:
        return parts[0]
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def caption_for(categories: Sequence[str], template: int) -> str:
    """The reference caption naming `categories` (canonical order) with template `template`."""
    if not categories:
        raise ValueError("categories must name at least one object")
    names = sorted(set(categories), key=_ORDER.__getitem__)
    return TEMPLATES[template].format(objects=_object_phrase(names))


def _place(rng: random.Random, count: int, size: int) -> list[tuple[int, int, int, int]]:
    """Non-overlapping boxes: one per distinct cell of a 3x3 grid, jittered inside it."""
    cell = size // 3
    cells = rng.sample(range(9), count)
    boxes = []
    for c in cells:
        side = rng.randint(int(cell * 0.65), int(cell * 0.95))
        x0 = (c % 3) * cell + rng.randint(0, cell - side)
        y0 = (c // 3) * cell + rng.randint(0, cell - side)
        boxes.append((x0, y0, side, side))
    return boxes


def render_image(image: SyntheticImage, size: int) -> Any:
    """Draw `image` with Pillow: each category's fixed shape and colour on a light background."""
    from PIL import Image, ImageDraw

    canvas = Image.new("RGB", (size, size), image.background)
    draw = ImageDraw.Draw(canvas)
    for obj in image.objects:
        colour, shape = _STYLE[obj.category]
        x, y, w, h = obj.bbox
        x1, y1 = x + w - 1, y + h - 1
        if shape == "wide_rectangle":
            draw.rectangle([x, y + h // 4, x1, y1 - h // 4], fill=colour)
        elif shape == "triangle":
            draw.polygon([(x + w / 2, y), (x1, y1), (x, y1)], fill=colour)
        elif shape == "circle":
            draw.ellipse([x, y, x1, y1], fill=colour)
        elif shape == "square":
            draw.rectangle([x + w // 8, y + h // 8, x1 - w // 8, y1 - h // 8], fill=colour)
        elif shape == "diamond":
            draw.polygon(
                [(x + w / 2, y), (x1, y + h / 2), (x + w / 2, y1), (x, y + h / 2)], fill=colour
            )
        elif shape == "half_disc":
            draw.pieslice([x, y, x1, y1 + h // 2], 180, 360, fill=colour)
        elif shape == "trapezoid":
            draw.polygon([(x, y), (x1, y), (x1 - w / 4, y1), (x + w / 4, y1)], fill=colour)
        elif shape == "ring":
            draw.ellipse([x, y, x1, y1], outline=colour, width=max(2, w // 6))
        else:  # pragma: no cover - the table above is closed
            raise ValueError(f"unknown shape {shape!r}")
    return canvas


def _make_images(
    rng: random.Random, split: str, first_id: int, count: int, size: int, max_objects: int
) -> list[SyntheticImage]:
    folder = "train2014" if split == "train" else "val2014"
    names = [name for _, name, _, _, _ in CATEGORIES]
    images = []
    for k in range(count):
        image_id = first_id + k
        n = rng.randint(1, max_objects)
        cats = rng.sample(names, n)
        boxes = _place(rng, n, size)
        shade = rng.randint(215, 245)
        background = (shade, shade - rng.randint(0, 10), shade - rng.randint(0, 10))
        images.append(
            SyntheticImage(
                image_id=image_id,
                split=split,
                file_name=f"{folder}/COCO_{folder}_{image_id:012d}.png",
                objects=tuple(SyntheticObject(c, b) for c, b in zip(cats, boxes)),
                background=background,
            )
        )
    return images


def _noisy_caption(rng: random.Random, image: SyntheticImage, template: int, rate: float) -> str:
    drawn = list(image.categories)
    if rng.random() < rate:
        absent = [PARTNERS[c] for c in drawn if PARTNERS[c] not in drawn]
        if absent:
            drawn.append(absent[0])
    return caption_for(drawn, template)


def _coco_files(images: list[SyntheticImage], references: dict[int, list[str]], size: int):
    categories = [
        {"id": cid, "name": name, "supercategory": sup} for cid, name, sup, _, _ in CATEGORIES
    ]
    coco_images = [
        {"id": im.image_id, "file_name": Path(im.file_name).name, "width": size, "height": size}
        for im in images
    ]
    instances, captions = [], []
    for im in images:
        for obj in im.objects:
            x, y, w, h = obj.bbox
            instances.append(
                {
                    "id": len(instances) + 1 + im.image_id * 10,
                    "image_id": im.image_id,
                    "category_id": _IDS[obj.category],
                    "bbox": [x, y, w, h],
                    "area": float(w * h),
                    "iscrowd": 0,
                    "segmentation": [[x, y, x + w, y, x + w, y + h, x, y + h]],
                }
            )
        for caption in references[im.image_id]:
            captions.append({"id": len(captions) + 1, "image_id": im.image_id, "caption": caption})
    info = {"description": "entropyrl synthetic COCO world", "version": "1.0"}
    return (
        {"info": info, "images": coco_images, "annotations": instances, "categories": categories},
        {"info": info, "images": coco_images, "annotations": captions},
    )


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def build_synthetic_coco(
    root: str | os.PathLike[str],
    *,
    num_train: int = 1000,
    num_test: int = 100,
    image_size: int = 112,
    noise_rate: float = 0.5,
    max_objects: int = 3,
    seed: int = 0,
    write_images: bool = True,
) -> SyntheticWorld:
    """Generate the world under `root` and return it.

    Args:
        root: output folder; receives `instances_{train,val}2014.json`,
            `captions_{train,val}2014.json` (test split = val2014), `warmup_captions.json`
            (`{image_id: [5 noisy captions]}`) and, with `write_images`, the PNG images.
        num_train, num_test: images per split (ids 1.. for train, 1_000_001.. for test).
        image_size: square image side in pixels (112 -> 16 Qwen2-VL image tokens).
        noise_rate: probability p that a warm-up caption also names an absent partner.
        max_objects: objects per image are drawn uniformly from 1..max_objects (<= 3).
        seed: everything (objects, boxes, colours of the background, noise) follows from it.
    """
    if num_train < 1 or num_test < 1:
        raise ValueError(f"num_train and num_test must be >= 1, got {num_train}, {num_test}")
    if not 0.0 <= noise_rate <= 1.0 or math.isnan(noise_rate):
        raise ValueError(f"noise_rate must be in [0, 1], got {noise_rate}")
    if not 1 <= max_objects <= 3:
        raise ValueError(f"max_objects must be in 1..3, got {max_objects}")
    if image_size < 28:
        raise ValueError(f"image_size must be >= 28, got {image_size}")
    rng = random.Random(f"entropyrl-synthetic-{seed}")
    train = _make_images(rng, "train", 1, num_train, image_size, max_objects)
    test = _make_images(rng, "test", 1_000_001, num_test, image_size, max_objects)
    references = {
        im.image_id: [caption_for(im.categories, t) for t in range(len(TEMPLATES))]
        for im in (*train, *test)
    }
    noise_rng = random.Random(f"entropyrl-synthetic-noise-{seed}")
    warmup = {
        im.image_id: [_noisy_caption(noise_rng, im, t, noise_rate) for t in range(len(TEMPLATES))]
        for im in train
    }
    world = SyntheticWorld(
        root=Path(root),
        image_size=image_size,
        noise_rate=noise_rate,
        seed=seed,
        train=train,
        test=test,
        references=references,
        warmup_captions=warmup,
    )
    world.root.mkdir(parents=True, exist_ok=True)
    for split, images in (("train2014", train), ("val2014", test)):
        instances, captions = _coco_files(images, references, image_size)
        _write_json(world.root / f"instances_{split}.json", instances)
        _write_json(world.root / f"captions_{split}.json", captions)
        if write_images:
            (world.root / split).mkdir(exist_ok=True)
            for im in images:
                world.image(im.image_id).save(world.root / im.file_name)
    _write_json(world.root / "warmup_captions.json", {str(k): v for k, v in warmup.items()})
    return world
