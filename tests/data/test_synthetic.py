"""The synthetic COCO world: deterministic, COCO-format, clean references, noisy warm-up captions."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from entropyrl.rig.synthetic import (
    CATEGORIES,
    PARTNERS,
    TEMPLATES,
    build_synthetic_coco,
    caption_for,
)

COCO_IDS = {
    3: "car",
    16: "bird",
    17: "cat",
    18: "dog",
    19: "horse",
    28: "umbrella",
    47: "cup",
    85: "clock",
}


def _digest(folder):
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            h.update(path.relative_to(folder).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def test_same_seed_same_files_other_seed_other_world(tmp_path):
    a = build_synthetic_coco(tmp_path / "a", num_train=30, num_test=10, seed=3)
    b = build_synthetic_coco(tmp_path / "b", num_train=30, num_test=10, seed=3)
    c = build_synthetic_coco(tmp_path / "c", num_train=30, num_test=10, seed=4)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    assert a.warmup_captions == b.warmup_captions
    assert a.references != c.references or a.warmup_captions != c.warmup_captions


def test_coco_files_have_real_categories_and_five_references(tmp_path):
    world = build_synthetic_coco(tmp_path, num_train=40, num_test=12, seed=0)
    for split, images in (("train2014", world.train), ("val2014", world.test)):
        instances = json.loads((tmp_path / f"instances_{split}.json").read_text())
        captions = json.loads((tmp_path / f"captions_{split}.json").read_text())
        assert {c["id"]: c["name"] for c in instances["categories"]} == COCO_IDS
        assert [im["id"] for im in instances["images"]] == [im.image_id for im in images]
        assert len({a["id"] for a in instances["annotations"]}) == len(instances["annotations"])
        by_image = {}
        for ann in instances["annotations"]:
            by_image.setdefault(ann["image_id"], set()).add(COCO_IDS[ann["category_id"]])
            assert len(ann["bbox"]) == 4 and ann["iscrowd"] == 0
        for im in images:
            assert by_image[im.image_id] == set(im.categories)
            refs = [a["caption"] for a in captions["annotations"] if a["image_id"] == im.image_id]
            assert len(refs) == 5
            for ref in refs:  # references name exactly the drawn objects
                words = set(re.findall(r"[a-z]+", ref))
                assert words & set(COCO_IDS.values()) == set(im.categories)
            assert (tmp_path / im.file_name).is_file()
    train_ids = {im.image_id for im in world.train}
    assert train_ids.isdisjoint(im.image_id for im in world.test)


def test_warmup_noise_names_only_an_absent_partner(tmp_path):
    world = build_synthetic_coco(
        tmp_path, num_train=400, num_test=5, noise_rate=0.5, seed=1, write_images=False
    )
    noisy = 0
    for im in world.train:
        drawn = set(im.categories)
        for caption in world.warmup_captions[im.image_id]:
            named = set(re.findall(r"[a-z]+", caption)) & set(COCO_IDS.values())
            extra = named - drawn
            assert drawn <= named and len(extra) <= 1
            if extra:
                noisy += 1
                (partner,) = extra
                assert any(PARTNERS[c] == partner for c in drawn)
    rate = noisy / (5 * len(world.train))
    assert rate == pytest.approx(world.noisy_fraction())
    assert 0.4 < rate < 0.55  # p = 0.5, minus images whose partners are all drawn
    clean = build_synthetic_coco(
        tmp_path / "clean", num_train=50, num_test=5, noise_rate=0.0, seed=1, write_images=False
    )
    assert clean.noisy_fraction() == 0.0


def test_chair_service_scorer_reads_the_world(tmp_path):
    from chair_server.scorer import ChairScorer

    world = build_synthetic_coco(tmp_path, num_train=20, num_test=5, seed=2, write_images=False)
    scorer = ChairScorer.from_coco(tmp_path, use_cache=False)
    im = world.test[0]
    assert scorer.ground_truth()[im.image_id] == sorted(im.categories)
    absent = next(name for _, name, *_ in CATEGORIES if name not in im.categories)
    result = scorer.score_corpus(
        [{"image_id": im.image_id, "caption": caption_for([*im.categories, absent], 1)}]
    )
    metrics = result["overall_metrics"]
    assert metrics["hallucinated_mentions"] == 1
    assert metrics["Recall"] == 1.0


def test_rendering_draws_each_category_in_its_colour(tmp_path):
    world = build_synthetic_coco(tmp_path, num_train=20, num_test=2, seed=5, write_images=False)
    colours = {name: colour for _, name, _, colour, _ in CATEGORIES}
    for im in world.train:
        pixels = set(world.image(im.image_id).getdata())
        for name in im.categories:
            assert colours[name] in pixels
        for name in set(colours) - set(im.categories):
            assert colours[name] not in pixels


def test_bad_arguments_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="noise_rate"):
        build_synthetic_coco(tmp_path, noise_rate=1.5)
    with pytest.raises(ValueError, match="max_objects"):
        build_synthetic_coco(tmp_path, max_objects=4)
    with pytest.raises(ValueError, match="categories"):
        caption_for([], 0)
    assert len(TEMPLATES) == 5
