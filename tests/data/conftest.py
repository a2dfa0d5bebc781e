"""Small source files in each input format, written per test."""

from __future__ import annotations

import functools
import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather of a city",
    "parameters": {"city": {"type": "str", "description": "City name", "default": ""}},
}


def write_lines(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def xlam_rows(n: int = 30) -> list:
    rows = []
    for i in range(n):
        calls = [{"name": "get_weather", "arguments": {"city": f"City{i}"}}]
        if i % 5 == 0:  # parallel calls
            calls.append({"name": "get_weather", "arguments": {"city": f"Town{i}"}})
        rows.append(
            {
                "id": i,
                "query": f"What's the weather in City{i}?",
                "tools": json.dumps([WEATHER_TOOL]),
                "answers": json.dumps(calls),
            }
        )
    return rows


XLAM_BAD = [
    {"id": 100, "query": "x", "tools": "[not json", "answers": "[]"},
    {"id": 101, "query": "x", "tools": json.dumps([WEATHER_TOOL]), "answers": '[{"name": "nope"}]'},
    {"id": 102, "tools": json.dumps([WEATHER_TOOL]), "answers": "[]"},
    5,
]


@pytest.fixture
def xlam_file(tmp_path) -> Path:
    rows = xlam_rows()
    return write_lines(tmp_path / "xlam.jsonl", [*rows[:10], *XLAM_BAD, *rows[10:], rows[3]])


def messages_rows() -> list:
    tool = {"type": "function", "function": {**WEATHER_TOOL, "parameters": {"type": "object"}}}
    rows = []
    for i in range(12):
        target = {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps({"city": f"C{i}"})},
                }
            ],
        }
        rows.append(
            {
                "messages": [
                    {"role": "system", "content": "You answer briefly."},
                    {"role": "user", "content": "Weather in Oslo?"},
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "type": "function",
                                "function": {
                                    "name": "get_weather",
                                    "arguments": '{"city": "Oslo"}',
                                },
                            }
                        ],
                    },
                    {"role": "tool", "content": '{"temp": 3}'},
                    {"role": "assistant", "content": "3 degrees."},
                    {"role": "user", "content": f"And in C{i}?"},
                    target,
                ],
                "tools": [tool],
            }
        )
    rows.append(
        {
            "messages": [
                {"role": "user", "content": "Tell me a joke."},
                {"role": "assistant", "content": "Why did the chicken..."},
            ],
            "tools": [tool],
        }
    )
    rows.append({"messages": [{"role": "user", "content": "hi"}], "tools": [tool]})  # no target
    return rows


@pytest.fixture
def messages_file(tmp_path) -> Path:
    return write_lines(tmp_path / "hardgen.jsonl", messages_rows())


BFCL_FUNCTION = {
    "name": "calculate_triangle_area",
    "description": "Area of a triangle.",
    "parameters": {
        "type": "dict",
        "properties": {
            "base": {"type": "integer", "description": "Base."},
            "height": {"type": "float", "description": "Height."},
            "unit": {"type": "string", "description": "Unit."},
        },
        "required": ["base", "height"],
    },
}


@pytest.fixture
def bfcl_dir(tmp_path) -> Path:
    root = tmp_path / "bfcl"
    questions, answers = [], []
    for i in range(8):
        questions.append(
            {
                "id": f"simple_{i}",
                "question": [
                    [{"role": "user", "content": f"Area with base {i + 1} and height 5?"}]
                ],
                "function": [BFCL_FUNCTION],
            }
        )
        answers.append(
            {
                "id": f"simple_{i}",
                "ground_truth": [
                    {
                        "calculate_triangle_area": {
                            "base": [i + 1],
                            "height": [5],
                            "unit": ["units", ""],
                        }
                    }
                ],
            }
        )
    questions.append(
        {
            "id": "simple_99",
            "question": [[{"role": "user", "content": "?"}]],
            "function": [BFCL_FUNCTION],
        }
    )
    write_lines(root / "BFCL_v4_simple.json", questions)
    write_lines(root / "possible_answer" / "BFCL_v4_simple.json", answers)
    write_lines(
        root / "BFCL_v4_irrelevance.json",
        [
            {
                "id": f"irrelevance_{i}",
                "question": [[{"role": "user", "content": f"Who won the match {i}?"}]],
                "function": [BFCL_FUNCTION],
            }
            for i in range(4)
        ],
    )
    return root


# COCO-like image sizes (width, height) the fixture's files take in turn; prepare coco records
# them in manifest.json (what bounds a prompt in tokens).
FIXTURE_SIZES = ((640, 480), (480, 640), (500, 375))


@functools.cache
def _jpeg(size: tuple[int, int]) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, (90, 140, 60)).save(buffer, format="JPEG")
    return buffer.getvalue()


def coco_fixture(
    root: Path, *, n_train: int = 6, n_val: int = 10, missing_image: int | None = None
):
    """COCO 2014 caption/instance files and (empty) image files; returns (ann_dir, img_dir)."""
    ann, img = root / "annotations", root / "images"
    ann.mkdir(parents=True, exist_ok=True)
    animals = ["dog", "cat", "horse", "bird"]
    for part, ids in (("train", range(1, n_train + 1)), ("val", range(100, 100 + n_val))):
        images = [{"id": i, "file_name": f"COCO_{part}2014_{i:012d}.jpg"} for i in ids]
        captions = [
            {
                "id": 10 * i + k,
                "image_id": i,
                "caption": f"A {animals[i % 4]} on the grass number {k}.",
            }
            for i in ids
            for k in range(3)
        ]
        if part == "val":
            images.append({"id": 999, "file_name": "COCO_val2014_000000000999.jpg"})  # no captions
            captions.append({"id": 1, "image_id": 12345, "caption": "orphan caption"})
        (ann / f"captions_{part}2014.json").write_text(
            json.dumps({"images": images, "annotations": captions})
        )
        instances = [{"id": i, "image_id": i, "category_id": 18} for i in ids]
        (ann / f"instances_{part}2014.json").write_text(
            json.dumps(
                {
                    "images": images,
                    "annotations": instances,
                    "categories": [{"id": 18, "name": "dog"}],
                }
            )
        )
        (img / f"{part}2014").mkdir(parents=True, exist_ok=True)
        for image in images:
            if image["id"] != missing_image:
                size = FIXTURE_SIZES[image["id"] % len(FIXTURE_SIZES)]
                (img / f"{part}2014" / image["file_name"]).write_bytes(_jpeg(size))
    return ann, img


@pytest.fixture
def coco_dirs(tmp_path):
    return coco_fixture(tmp_path / "coco", missing_image=101)


@pytest.fixture
def writers():
    """The writers above, for tests that build their own variants (conftest is not importable)."""
    return SimpleNamespace(lines=write_lines, xlam_rows=xlam_rows, coco=coco_fixture)
