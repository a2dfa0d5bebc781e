"""Converter I/O helpers: readers name file and line, atomic writes, stable hashes, rejects."""

from __future__ import annotations

import json

import pytest

from entropyrl.core.files import atomic_path, stable_hash
from entropyrl.data.io import InputFileError, RejectLog, read_image_list, read_records


def test_read_records_array_and_lines(tmp_path):
    array = tmp_path / "a.json"
    array.write_text(json.dumps([{"x": 1}, {"x": 2}]))
    assert read_records(array) == [(1, {"x": 1}), (2, {"x": 2})]
    lines = tmp_path / "b.json"  # BFCL: JSON lines under a .json name
    lines.write_text('{"x": 1}\n\n{"x": 2}\n')
    assert read_records(lines) == [(1, {"x": 1}), (3, {"x": 2})]
    latin = tmp_path / "c.jsonl"
    latin.write_bytes(b'{"x": "\xe9"}\n')
    with pytest.raises(InputFileError, match="not UTF-8"):
        read_records(latin)
    with pytest.raises(InputFileError, match="not a regular file"):
        read_records(tmp_path)


def test_atomic_path_keeps_the_old_file_on_failure(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("interrupted")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]
    with atomic_path(target) as tmp:
        tmp.write_text("new")
    assert target.read_text() == "new" and len(list(tmp_path.iterdir())) == 1


def test_stable_hash_is_canonical_and_fixed():
    assert stable_hash({"b": 1, "a": [1, 2]}) == stable_hash({"a": [1, 2], "b": 1})
    assert stable_hash("x", 1) != stable_hash("x", 2)
    # sha1 of the canonical JSON '["x"]': the same on every machine and Python run
    assert stable_hash("x") == int("7dc28255d1872f292f91802f52889121e6304a50", 16)


def test_reject_log(tmp_path):
    log = RejectLog(source="in.jsonl")
    assert log.write(tmp_path / "rejects.jsonl") is None
    for line in range(25):
        log.add(line + 1, f"bad {line}")
    assert len(log.first()) == 20 and log.first()[0] == "in.jsonl:1: bad 0"
    path = log.write(tmp_path / "rejects.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 25 and rows[-1] == {"source": "in.jsonl", "line": 25, "reason": "bad 24"}
    assert RejectLog().write(path) is None and not path.exists()  # no stale report


@pytest.mark.parametrize(
    "text",
    [
        "[42, 7, 1000]",
        '{"image_ids": [42, "7", 1000]}',
        '["COCO_val2014_000000000042.jpg", "COCO_val2014_000000000007.jpg", "1000"]',
        "# a paper's list\nCOCO_val2014_000000000042.jpg\n7\n\n000000001000.jpg  # comment\n",
        '{"image_id": 42}\n{"image": "COCO_val2014_000000000007.jpg"}\n{"image_id": 1000}\n',
    ],
)
def test_image_lists_in_the_formats_papers_release(tmp_path, text):
    path = tmp_path / "list.txt"
    path.write_text(text)
    assert read_image_list(path) == [42, 7, 1000]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1, 2, 1]", "listed twice"),
        ("[]", "no images"),
        ('["a cat"]', "neither an image id"),
        ('{"ids": [1]}', "image_ids"),
    ],
)
def test_bad_image_lists_name_the_problem(tmp_path, text, message):
    path = tmp_path / "list.json"
    path.write_text(text)
    with pytest.raises(InputFileError, match=message):
        read_image_list(path)
