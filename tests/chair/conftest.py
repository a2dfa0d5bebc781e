"""A small synthetic COCO 2014 fixture (real category ids, 5 references per image) for CHAIR tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chair_server import vocabulary

CATEGORY_ID = {name: cid for cid, name in vocabulary.COCO_CATEGORIES}

# image id -> (split, instance categories, five reference captions)
IMAGES: dict[int, tuple[str, list[str], list[str]]] = {
    1001: (
        "val",
        ["person", "dog", "dining table"],
        [
            "A man sitting at a table with his dog.",
            "A person and a dog near a wooden table.",
            "A man has a cup of coffee next to his dog.",
            "Man eating dinner while the dog watches.",
            "A guy at the dinner table with a puppy.",
        ],
    ),
    1002: (
        "val",
        ["toilet", "sink"],
        [
            "A white toilet next to a sink.",
            "The toilet seat is up in this bathroom.",
            "A small bathroom with a toilet and a sink.",
            "A clean bathroom with white tiles.",
            "A toilet with the lid open beside a sink.",
        ],
    ),
    1003: (
        "val",
        ["elephant"],
        [
            "A baby elephant walking next to an adult elephant.",
            "Two elephants in the grass.",
            "An elephant and its calf in a field.",
            "A mother elephant with her young.",
            "Elephants walking through a field.",
        ],
    ),
    1004: (
        "val",
        [],
        [
            "A blurry photo of a wall.",
            "An empty white wall.",
            "Nothing much in this picture.",
            "A plain background.",
            "A wall painted white.",
        ],
    ),
    2001: (
        "train",
        ["train"],
        [
            "A passenger train on the train tracks.",
            "A train pulling into the station.",
            "The train is stopped on the tracks.",
            "A long train next to a platform.",
            "A red and white train on the rails.",
        ],
    ),
    2002: (
        "train",
        ["person", "baseball bat"],
        [
            "A batter standing at home plate.",
            "A baseball player swinging a bat.",
            "The batter waits at home plate.",
            "A player holding a baseball bat.",
            "A baseball game in progress.",
        ],
    ),
}

# Hand-derived ground truth: instance categories ∪ objects named in the references.
# 1001: "cup" and "puppy"->dog come from references; 1002: "toilet seat" is the toilet, not a
# chair; 1003: "baby/adult elephant" are elephants, "calf" counts as cow (a known false friend of
# the vocabulary), "mother" counts as person; 2001: "passenger train" and "train tracks" add no
# person; 2002: "home plate" is no plate/anything, "player" is a person.
EXPECTED_GT: dict[int, list[str]] = {
    1001: ["cup", "dining table", "dog", "person"],
    1002: ["sink", "toilet"],
    1003: ["cow", "elephant", "person"],
    1004: [],
    2001: ["train"],
    2002: ["baseball bat", "person"],
}


def write_coco(
    folder: Path, splits: tuple[str, ...] = ("train", "val"), kinds=("instances", "captions")
) -> Path:
    """Write COCO-format instances_/captions_{split}2014.json for the fixture images."""
    folder.mkdir(parents=True, exist_ok=True)
    categories = [
        {"id": cid, "name": name, "supercategory": "x"} for cid, name in vocabulary.COCO_CATEGORIES
    ]
    for split in splits:
        ids = [i for i, (s, _, _) in IMAGES.items() if s == split]
        images = [{"id": i, "file_name": f"COCO_{split}2014_{i:012d}.jpg"} for i in ids]
        if "instances" in kinds:
            anns = [
                {
                    "id": 10 * i + k,
                    "image_id": i,
                    "category_id": CATEGORY_ID[name],
                    "bbox": [0, 0, 1, 1],
                }
                for i in ids
                for k, name in enumerate(IMAGES[i][1])
            ]
            data = {"images": images, "annotations": anns, "categories": categories}
            (folder / f"instances_{split}2014.json").write_text(json.dumps(data))
        if "captions" in kinds:
            anns = [
                {"id": 10 * i + k, "image_id": i, "caption": cap}
                for i in ids
                for k, cap in enumerate(IMAGES[i][2])
            ]
            (folder / f"captions_{split}2014.json").write_text(
                json.dumps({"images": images, "annotations": anns})
            )
    return folder


@pytest.fixture
def coco_dir(tmp_path: Path) -> Path:
    return write_coco(tmp_path / "coco")


@pytest.fixture
def gt_file(tmp_path: Path) -> Path:
    path = tmp_path / "gt.json"
    path.write_text(json.dumps({str(k): v for k, v in EXPECTED_GT.items()}))
    return path


@pytest.fixture
def expected_gt() -> dict[int, list[str]]:
    return {k: list(v) for k, v in EXPECTED_GT.items()}


@pytest.fixture
def write_coco_files():
    return write_coco


@pytest.fixture(scope="session")
def session_gt_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("chair") / "gt.json"
    path.write_text(json.dumps({str(k): v for k, v in EXPECTED_GT.items()}))
    return path


@pytest.fixture(scope="session")
def chair_server_url(session_gt_file):
    """A real service (subprocess, waitress, free loopback port) with small limits."""
    from chair_server.launch import start_server

    with start_server(
        ground_truth=session_gt_file,
        extra_args=["--max-batch", "64", "--max-body-mb", "0.05", "--workers", "8"],
    ) as server:
        yield server.url


@pytest.fixture(scope="session")
def token_server_url(session_gt_file):
    from chair_server.launch import start_server

    with start_server(ground_truth=session_gt_file, extra_args=["--token", "s3cret"]) as server:
        yield server.url


CAPTIONS = [
    "A man sits at a table with his dog and a cat.",
    "A toilet seat and a sink.",
    "A baby elephant next to a giraffe.",
    "Passengers wait as a train arrives.",
    "A batter at home plate holds a bat.",
    "A wall.",
]


@pytest.fixture(scope="session")
def sample_items() -> list[dict]:
    """Captions over every fixture image (and one unknown id), deterministic."""
    ids = sorted(IMAGES)
    items = [
        {"image_id": ids[i % len(ids)], "caption": CAPTIONS[i % len(CAPTIONS)]} for i in range(40)
    ]
    items.append({"image_id": 31337, "caption": "A dog."})
    return items
